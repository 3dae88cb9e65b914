"""Bad input to every public Python entry point, and secrets in failures files.

Issue 8, items 5 and 6 (the Python side). test_args.py has the table of
``call_llm``'s keyword arguments; this file covers the rest of the surface:
``Client`` and ``Client.from_file``, ``call_many``, ``map_with_concurrency``,
``load_policies``, ``extract_json``, ``assert_shape``, ``log_usage``,
``jsonl_logger`` and the CLI, plus text that cannot be sent (lone
surrogates, invalid UTF-8), bodies that cannot be serialised, enormous
bodies, and key-like values given in the wrong place. Every bad argument
raises TypeError/ValueError naming it, before the mock server sees a request
(and, for a batch, before its failures file is touched).

Then the failures file of ``call_many`` and ``map_with_concurrency`` (and the
CLI's outputs) across the fault kinds: the API key and the Authorization
header never appear, and the prompt appears only as the failed item itself,
which the README says is written by design.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Events, Scenario, child_env, secret_body
from llmretry import cli

BODY = secret_body("bad")
SECRET_BITS = (SECRET_KEY, "SECRET-PROMPT", "SECRET-SYSTEM")


def names_it(exc: BaseException, name: str) -> None:
    """The error is an argument error naming ``name`` and repeating no secret."""
    assert not isinstance(exc, llmretry.LLMError), f"an LLMError for bad input: {exc!r}"
    msg = str(exc)
    assert name in msg, f"message {msg!r} does not name {name!r}"
    for s in SECRET_BITS:
        assert s not in msg, f"{s!r} repeated in the error: {msg!r}"


def case_id(case: Tuple[Any, ...]) -> str:
    kw = case[0]
    return ",".join(f"{k}={type(v).__name__}:{str(v)[:14]!r}" for k, v in kw.items())


def cyclic_dict() -> Dict[str, Any]:
    d: Dict[str, Any] = {"model": "m"}
    d["self"] = d
    return d


def cyclic_list() -> Dict[str, Any]:
    items: List[Any] = []
    items.append(items)
    return {"model": "m", "messages": items}


def deep_list(depth: int = 100_000) -> Any:
    return functools.reduce(lambda inner, _: [inner], range(depth), [])


# ---------------------------------------------------------------------------
# call_llm: what test_args.py does not cover (text, bytes, big ints, secrets)

CALL_CASES: List[Tuple[Dict[str, Any], type, str]] = [
    # lone surrogates (what undecodable bytes become in Python): never sendable
    ({"base_url": "http://127.0.0.1/\ud800"}, ValueError, "base_url"),
    ({"url": "http://127.0.0.1/\udcff"}, ValueError, "url"),
    ({"api_key": SECRET_KEY + "\udcff"}, ValueError, "api_key"),
    ({"request_id": "id-\ud800"}, ValueError, "request_id"),
    ({"idempotency_key": "\udcff"}, ValueError, "idempotency_key"),
    ({"ca_file": "/tmp/\ud800.pem"}, ValueError, "ca_file"),
    ({"jitter": "\ud800"}, ValueError, "jitter"),
    ({"retry_mode": "\ud800"}, ValueError, "retry_mode"),
    ({"headers": {"X-A": "v\udcff"}}, ValueError, "headers"),
    ({"headers": {"X-\ud800": "v"}}, ValueError, "headers"),
    # bytes where str is expected
    ({"base_url": b"http://127.0.0.1/v1"}, TypeError, "base_url"),
    ({"url": b"http://127.0.0.1/v1"}, TypeError, "url"),
    ({"api_key": SECRET_KEY.encode()}, TypeError, "api_key"),
    ({"request_id": b"abc"}, TypeError, "request_id"),
    ({"idempotency_key": b"abc"}, TypeError, "idempotency_key"),
    ({"ca_file": b"/tmp/ca.pem"}, TypeError, "ca_file"),
    ({"jitter": b"full"}, TypeError, "jitter"),
    ({"retry_mode": b"safe"}, TypeError, "retry_mode"),
    ({"headers": {b"X-A": "v"}}, TypeError, "headers"),
    ({"headers": {"X-A": b"v"}}, TypeError, "headers"),
    ({"headers": [("X-A", "v")]}, TypeError, "headers"),
    ({"policy": b"fast"}, TypeError, "policy"),
    # out of range for the C fields, and the core's own ranges
    ({"timeout_ms": 2 ** 63}, ValueError, "timeout_ms"),
    ({"deadline_ms": 2 ** 70}, ValueError, "deadline_ms"),
    ({"max_retries": 2 ** 31}, ValueError, "max_retries"),
    ({"max_retries": 101}, ValueError, "max_retries"),
    ({"max_retry_after_ms": -(2 ** 64)}, ValueError, "max_retry_after_ms"),
    ({"retry_statuses": [2 ** 70]}, ValueError, "retry_statuses"),
    ({"retry_statuses": [600]}, ValueError, "retry_statuses"),
    ({"retry_statuses": [None]}, TypeError, "retry_statuses"),
    ({"retry_statuses": [503.0]}, TypeError, "retry_statuses"),
    ({"retry_invalid_response": None}, TypeError, "retry_invalid_response"),
    ({"jitter": None}, TypeError, "jitter"),
    ({"jitter": "FULL"}, ValueError, "jitter"),
    ({"base_url": ""}, ValueError, "base_url"),
    ({"base_url": "ftp://127.0.0.1/v1"}, ValueError, "base_url"),
    ({"url": "file:///etc/passwd"}, ValueError, "url"),
    ({"url": "http://127.0.0.1/\x01"}, ValueError, "url"),
    ({"ca_file": ""}, ValueError, "ca_file"),
    ({"request_id": ""}, ValueError, "request_id"),
    ({"idempotency_key": "k\r\n"}, ValueError, "idempotency_key"),
    ({"headers": {"X-A": "v\x01"}}, ValueError, "headers"),
    ({"headers": {"": "v"}}, ValueError, "headers"),
    ({"headers": {"X A": "v"}}, ValueError, "headers"),
    ({"policy": 5}, TypeError, "policy"),
    ({"policy": "nope"}, ValueError, "policy"),
    # a key pasted in the wrong place is refused without being repeated
    ({"jitter": SECRET_KEY}, ValueError, "jitter"),
    ({"retry_mode": SECRET_KEY}, ValueError, "retry_mode"),
    ({"base_url": SECRET_KEY}, ValueError, "base_url"),
    ({"url": SECRET_KEY}, ValueError, "url"),
    ({"api_key": SECRET_KEY + "\n"}, ValueError, "api_key"),
    ({"request_id": SECRET_KEY + "\n"}, ValueError, "request_id"),
    ({"idempotency_key": SECRET_KEY + "\r\n"}, ValueError, "idempotency_key"),
    ({"headers": {f"Authorization: Bearer {SECRET_KEY}": ""}}, ValueError, "headers"),
    ({"headers": {"Authorization": f"Bearer {SECRET_KEY}\r\nX-B: 1"}}, ValueError, "headers"),
]


@pytest.mark.parametrize("case", CALL_CASES, ids=[case_id(c) for c in CALL_CASES])
def test_call_llm_bad_argument(scen: Scenario, case: Tuple[Dict[str, Any], type, str]) -> None:
    kw, exc, name = case
    options: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    options.update(kw)
    with pytest.raises(exc) as info:
        llmretry.call_llm(BODY, **options)
    names_it(info.value, name)
    # The same through a client (and call_llm_with_deadline).
    with llmretry.Client() as client:
        with pytest.raises(exc) as info:
            if "deadline_ms" in kw:
                client.call_llm(BODY, **options)
            else:
                client.call_llm_with_deadline(BODY, 10000, **options)
    names_it(info.value, name)
    assert scen.requests() == [], "a bad argument must be caught before any I/O"


# ---------------------------------------------------------------------------
# Bodies: not serialisable, not text, enormous

UNSENDABLE_BODIES: List[Tuple[str, Callable[[], Any], type]] = [
    ("nan nested in lists", lambda: {"m": [1, [{"x": math.nan}]]}, (TypeError, ValueError)),
    ("inf", lambda: {"m": [math.inf]}, (TypeError, ValueError)),
    ("-inf", lambda: {"m": {"x": -math.inf}}, (TypeError, ValueError)),
    ("tuple key", lambda: {"m": [{(1, 2): "x"}]}, TypeError),
    ("object in a list", lambda: {"m": [1, object()]}, TypeError),
    ("bytes value", lambda: {"m": [b"x"]}, TypeError),
    ("set value", lambda: {"m": {1, 2}}, TypeError),
    ("cycle through a dict", cyclic_dict, TypeError),
    ("cycle through a list", cyclic_list, TypeError),
    ("nested 100000 deep", lambda: {"m": deep_list()}, TypeError),
    ("lone surrogate in content",
     lambda: {"messages": [{"role": "user", "content": "SECRET-PROMPT-\ud800"}]},
     (TypeError, ValueError)),
    ("lone surrogate in a key", lambda: {"m\udcff": 1}, (TypeError, ValueError)),
    ("lone surrogate in the model", lambda: {"model": "gpt-\udcff"}, (TypeError, ValueError)),
    ("str with a lone surrogate", lambda: '{"m": "\ud800"}', (TypeError, ValueError)),
    ("bytes not UTF-8", lambda: b'{"m": "SECRET-PROMPT-\xff\xfe"}', ValueError),
    ("bytes cut inside a character", lambda: '{"m": "é"}'.encode()[:-3] + b'"}', ValueError),
    ("bytearray not UTF-8", lambda: bytearray(b'{"m": "\xc3\x28"}'), ValueError),
    ("bytes not JSON", lambda: b"SECRET-PROMPT not json", ValueError),
    ("str not JSON", lambda: '{"m": ', ValueError),
    ("empty bytes", lambda: b"", (TypeError, ValueError)),
    ("a list", lambda: [BODY], TypeError),
    ("a mapping that is not a dict", lambda: __import__("types").MappingProxyType(BODY),
     TypeError),
    ("None", lambda: None, TypeError),
]


@pytest.mark.parametrize("what,make,exc", UNSENDABLE_BODIES,
                         ids=[c[0] for c in UNSENDABLE_BODIES])
def test_unsendable_body(scen: Scenario, what: str, make: Callable[[], Any],
                         exc: Any) -> None:
    opts = dict(FAST, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    with pytest.raises(exc) as info:
        llmretry.call_llm(make(), **opts)
    names_it(info.value, "body")
    # In a batch, the error names the item, and no item is sent.
    with pytest.raises(exc) as info:
        llmretry.call_many([BODY, BODY, make()], limit=2, **opts)
    names_it(info.value, "bodies[2]")
    assert scen.requests() == []


def test_int_keys_are_sent_as_json_writes_them(scen: Scenario) -> None:
    """Python's json turns int keys into strings: the body is sent that way
    (documented: a dict is serialised as JSON), not refused."""
    data, _ = llmretry.call_llm({"model": "m", "n": {1: "a"}}, base_url=scen.url,
                                logger=None, **FAST)
    assert json.loads(scen.requests()[0]["body"]) == {"model": "m", "n": {"1": "a"}}


def test_text_that_is_valid_is_sent_byte_exact(scen: Scenario) -> None:
    """Not refused: any Unicode in content and in header values (sent as UTF-8)."""
    content = "é€𝄞 \u2028 \x00 \ufffd"
    llmretry.call_llm({"model": "m", "messages": [{"role": "user", "content": content}]},
                      base_url=scen.url, headers={"X-Note": "café"}, logger=None, **FAST)
    rec, = scen.requests()
    assert json.loads(rec["body"])["messages"][0]["content"] == content
    assert rec["headers"]["x-note"].encode("latin-1").decode("utf-8") == "café"


@pytest.mark.slow
def test_enormous_body_is_sent_whole(scen: Scenario, tmp_path: Path) -> None:
    """A 20 MB message goes out whole (dict, str and bytes bodies), and a
    failed one is written whole to the failures file; nothing hangs."""
    big = "SECRET-PROMPT-" + "x" * (20 * 1024 * 1024)
    body = {"model": "m", "messages": [{"role": "user", "content": big}]}
    text = json.dumps(body, separators=(",", ":"))
    try:
        t0 = time.monotonic()
        for sent in (body, text, text.encode()):
            res = llmretry.call_llm(sent, base_url=scen.url, logger=None, **FAST)
            assert res.meta.status == 200 and res.meta.attempts == 1
        recs = scen.requests()
        assert [len(r["body"]) for r in recs] == [len(text)] * 3
        assert all(r["body"] == text for r in recs)
        scen.server.clear(scen.name)

        scen.script([{"status": 400}, {}])
        path = tmp_path / "failed.jsonl"
        out = llmretry.call_many([body, body], limit=1, failures_path=path,
                                 base_url=scen.url, logger=None, **FAST)
        assert out.summary.failed == 1 and out.summary.ok == 1
        rec, = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert rec["index"] == 0 and rec["item"] == body
        assert time.monotonic() - t0 < 60, "20 MB bodies took over a minute"
    finally:
        scen.server.clear(scen.name)    # the session's mock keeps what it records


# ---------------------------------------------------------------------------
# call_many

def never(*args: Any) -> None:
    raise AssertionError("must not be called for a bad argument")


BATCH_CASES: List[Tuple[Dict[str, Any], type, str]] = [
    ({"bodies": 42}, TypeError, "bodies"),
    ({"bodies": None}, TypeError, "bodies"),
    ({"bodies": BODY}, TypeError, "bodies"),            # one body, not a list of them
    ({"bodies": json.dumps(BODY)}, TypeError, "bodies"),
    ({"bodies": json.dumps(BODY).encode()}, TypeError, "bodies"),
    ({"bodies": [BODY, 5]}, TypeError, "bodies[1]"),
    ({"bodies": [BODY, [BODY]]}, TypeError, "bodies[1]"),
    # A tuple is checked whole first (a generator is read lazily: its bad
    # body raises when reached, see test_lazy_batch.py).
    ({"bodies": (BODY, {"x": math.nan})}, TypeError, "bodies[1]"),
    ({"limit": 0}, ValueError, "limit"),
    ({"limit": -1}, ValueError, "limit"),
    ({"limit": 1.5}, TypeError, "limit"),
    ({"limit": True}, TypeError, "limit"),
    ({"limit": "4"}, TypeError, "limit"),
    ({"limit": None}, TypeError, "limit"),
    ({"deadline_ms": -1}, ValueError, "deadline_ms"),
    ({"deadline_ms": 2 ** 70}, ValueError, "deadline_ms"),
    ({"deadline_ms": 1.5}, TypeError, "deadline_ms"),
    ({"deadline_ms": True}, TypeError, "deadline_ms"),
    ({"call_deadline_ms": -1}, ValueError, "call_deadline_ms"),
    ({"call_deadline_ms": "5"}, TypeError, "call_deadline_ms"),
    ({"call_deadline_ms": 2 ** 70}, ValueError, "call_deadline_ms"),
    ({"failures_path": 5}, TypeError, "failures_path"),
    ({"failures_path": b"/tmp/failed.jsonl"}, TypeError, "failures_path"),
    ({"failures_path": ""}, ValueError, "failures_path"),
    ({"failures_path": "fail\0ed.jsonl"}, ValueError, "failures_path"),
    ({"resume": 1}, TypeError, "resume"),
    ({"resume": "yes"}, TypeError, "resume"),
    ({"resume": True}, ValueError, "failures_path"),
    ({"progress": 1}, TypeError, "progress"),
    ({"progress": "yes"}, TypeError, "progress"),
    ({"on_result": 5}, TypeError, "on_result"),
    ({"adaptive": 1}, TypeError, "adaptive"),
    ({"adaptive": None}, TypeError, "adaptive"),
    ({"policy": 5}, TypeError, "policy"),
    ({"policy": "nope"}, ValueError, "policy"),
    ({"client": "a client"}, TypeError, "client"),
    ({"logger": "llmretry"}, TypeError, "logger"),
    ({"validate": 5}, TypeError, "validate"),
    ({"request_id": "r-1"}, ValueError, "request_id"),
    ({"idempotency_key": "k-1"}, ValueError, "idempotency_key"),
    ({"idempotency_keys": ["a", "b"]}, TypeError, "idempotency_keys"),
    ({"models": ["m", "m"]}, TypeError, "models"),
    ({"body": BODY}, TypeError, "body"),
    # refused by the core's rules, checked before the batch starts
    ({"timeout_ms": 0}, ValueError, "timeout_ms"),
    ({"max_retries": 101}, ValueError, "max_retries"),
    ({"jitter": SECRET_KEY}, ValueError, "jitter"),
    ({"retry_statuses": [42]}, ValueError, "retry_statuses"),
    ({"max_response_bytes": 0}, ValueError, "max_response_bytes"),
    ({"base_url": "ftp://127.0.0.1/v1"}, ValueError, "base_url"),
    ({"url": "gopher://127.0.0.1/"}, ValueError, "url"),
    ({"api_key": SECRET_KEY + "\n"}, ValueError, "api_key"),
    ({"ca_file": ""}, ValueError, "ca_file"),
    ({"base_url": "http://127.0.0.1/\ud800"}, ValueError, "base_url"),
]


@pytest.mark.parametrize("case", BATCH_CASES, ids=[case_id(c) for c in BATCH_CASES])
def test_call_many_bad_argument(scen: Scenario, tmp_path: Path,
                                case: Tuple[Dict[str, Any], type, str]) -> None:
    kw, exc, name = case
    kw = dict(kw)
    bodies = kw.pop("bodies", [BODY, BODY])
    events = Events()
    options: Dict[str, Any] = dict(FAST, base_url=scen.url, api_key=SECRET_KEY,
                                   logger=events, on_result=never, progress=never)
    if kw.get("failures_path") is None and "resume" in kw and kw["resume"] is not True:
        kw["failures_path"] = tmp_path / "f.jsonl"
    options.update(kw)
    with pytest.raises(exc) as info:
        llmretry.call_many(bodies, **options)
    names_it(info.value, name)
    assert scen.requests() == []
    assert events.events == [], "an argument error emitted events (a batch summary?)"
    assert list(tmp_path.iterdir()) == [], "an argument error wrote files"


@pytest.mark.parametrize("kw,name", [
    ({"timeout_ms": -5}, "timeout_ms"),
    ({"base_url": "ftp://127.0.0.1/v1"}, "base_url"),
    ({"policy": "nope"}, "policy"),
    ({"bodies": [BODY, {"x": math.inf}]}, "bodies[1]"),
])
def test_bad_batch_argument_leaves_the_record_alone(scen: Scenario, tmp_path: Path,
                                                    kw: Dict[str, Any], name: str) -> None:
    """A resumed batch with a bad option raises before it rewrites its record:
    the earlier run's failures file and progress file are left byte for byte."""
    path = tmp_path / "failed.jsonl"
    scen.script([{"status": 400}, {}, {"status": 400}])
    first = llmretry.call_many([BODY] * 3, limit=1, failures_path=path, base_url=scen.url,
                               api_key=SECRET_KEY, logger=None, **FAST)
    assert first.summary.failed == 2
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    kw = dict(kw)
    bodies = kw.pop("bodies", [BODY] * 3)
    events = Events()
    with pytest.raises((TypeError, ValueError)) as info:
        llmretry.call_many(bodies, limit=1, failures_path=path, resume=True,
                           base_url=scen.url, api_key=SECRET_KEY, logger=events,
                           progress=never, **kw)
    names_it(info.value, name)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert events.events == []
    assert len(scen.requests()) == 3


def test_huge_limit_means_no_limit(scen: Scenario) -> None:
    """A limit beyond a C int is not wrapped into a wrong one (2**32 read as
    0 was refused, 2**32 + 1 read as 1 ran one at a time)."""
    for limit in (2 ** 31, 2 ** 32 + 1, 10 ** 30):
        out = llmretry.call_many([BODY] * 3, limit=limit, base_url=scen.url, logger=None,
                                 **FAST)
        assert out.summary.ok == 3, limit


def test_bad_failures_path_names_the_file(scen: Scenario, tmp_path: Path) -> None:
    """An unwritable failures_path is an OSError naming the record's file
    (not a temporary one), raised before any request."""
    with pytest.raises(FileNotFoundError) as info:
        llmretry.call_many([BODY], failures_path=tmp_path / "no" / "f.jsonl",
                           base_url=scen.url, logger=None)
    assert info.value.filename == str(tmp_path / "no" / "f.jsonl.done")
    with pytest.raises(IsADirectoryError) as info2:
        llmretry.call_many([BODY], failures_path=tmp_path, base_url=scen.url, logger=None)
    assert "failures_path" in str(info2.value)
    assert list(tmp_path.iterdir()) == [], "a file was written next to the directory"
    assert not Path(f"{tmp_path}.done").exists()
    assert scen.requests() == []


def test_failures_files_through_symlinks_keep_the_links(scen: Scenario,
                                                        tmp_path: Path) -> None:
    """The progress file is rewritten by a rename: through a symbolic link it
    goes to the link's target, and the link stays (it was replaced by a
    regular file); a FIFO or a device is refused before any request."""
    data = tmp_path / "data"
    data.mkdir()
    fail = tmp_path / "f.jsonl"
    done = tmp_path / "f.jsonl.done"
    done.symlink_to(data / "progress")
    scen.script([{"status": 400}])
    out = llmretry.call_many([BODY] * 2, limit=1, failures_path=fail, base_url=scen.url,
                             logger=None, **FAST)
    assert out.summary.failed == 1
    assert done.is_symlink() and (data / "progress").read_text().splitlines()[1:] == ["1"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="failures_path is a FIFO, not a regular file") as info:
        llmretry.call_many([BODY], failures_path=fifo, base_url=scen.url, logger=None)
    assert info.value.filename == str(fifo)
    assert len(scen.requests()) == 2


# ---------------------------------------------------------------------------
# map_with_concurrency

MAP_CASES: List[Tuple[Dict[str, Any], type, str]] = [
    ({"items": 42}, TypeError, "items"),
    ({"items": None}, TypeError, "items"),
    ({"limit": None}, TypeError, "limit"),
    ({"limit": 2.0}, TypeError, "limit"),
    ({"limit": 0}, ValueError, "limit"),
    ({"worker": "len"}, TypeError, "worker"),
    ({"return_exceptions": 1}, TypeError, "return_exceptions"),
    ({"return_exceptions": None}, TypeError, "return_exceptions"),
    ({"return_exceptions": "yes"}, TypeError, "return_exceptions"),
    ({"deadline_ms": -1}, ValueError, "deadline_ms"),
    ({"deadline_ms": 2 ** 70}, ValueError, "deadline_ms"),
    ({"deadline_ms": "5"}, TypeError, "deadline_ms"),
    ({"deadline_ms": True}, TypeError, "deadline_ms"),
    ({"adaptive": "yes"}, TypeError, "adaptive"),
    ({"failures_path": 5}, TypeError, "failures_path"),
    ({"failures_path": ""}, ValueError, "failures_path"),
    ({"resume": 1}, TypeError, "resume"),
    ({"resume": True}, ValueError, "failures_path"),
    ({"progress": 2}, TypeError, "progress"),
    ({"on_result": "print"}, TypeError, "on_result"),
    ({"logger": 5}, TypeError, "logger"),
]


@pytest.mark.parametrize("case", MAP_CASES, ids=[case_id(c) for c in MAP_CASES])
def test_map_with_concurrency_bad_argument(tmp_path: Path,
                                           case: Tuple[Dict[str, Any], type, str]) -> None:
    kw, exc, name = case
    ran: List[Any] = []
    args: Dict[str, Any] = {"items": [1, 2, 3], "limit": 2,
                            "worker": lambda item, i: ran.append(item)}
    args.update(kw)
    items, limit, worker = args.pop("items"), args.pop("limit"), args.pop("worker")
    events = Events()
    args.setdefault("logger", events)
    with pytest.raises(exc) as info:
        llmretry.map_with_concurrency(items, limit, worker, **args)
    names_it(info.value, name)
    with llmretry.Client() as client, pytest.raises(exc):
        client.map_with_concurrency(items, limit, worker, **args)
    assert ran == [], "the worker ran"
    assert events.events == []
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------
# Client, Client.from_file, load_policies

CLIENT_CASES: List[Tuple[Dict[str, Any], type, str]] = [
    ({"max_in_flight": 0}, ValueError, "max_in_flight"),
    ({"max_in_flight": 2 ** 40}, ValueError, "max_in_flight"),
    ({"max_in_flight": "8"}, TypeError, "max_in_flight"),
    ({"max_in_flight": True}, TypeError, "max_in_flight"),
    ({"policies": 5}, TypeError, "policies"),
    ({"policies": ["fast"]}, TypeError, "policies"),
    ({"policies": {"fast": {"jitter": SECRET_KEY}}}, ValueError, "jitter"),
    ({"tiemout_ms": 5}, TypeError, "tiemout_ms"),
    ({"body": BODY}, TypeError, "body"),
    ({"client": None}, TypeError, "client"),
    ({"policy": "fast"}, TypeError, "policy"),
    ({"timeout_ms": "5"}, TypeError, "timeout_ms"),
    ({"headers": "X-A: 1"}, TypeError, "headers"),
    ({"logger": 5}, TypeError, "logger"),
    ({"validate": 5}, TypeError, "validate"),
    ({"api_key": SECRET_KEY.encode()}, TypeError, "api_key"),
    ({"base_url": "http://127.0.0.1/\ud800"}, ValueError, "base_url"),
    ({"headers": {f"Authorization: Bearer {SECRET_KEY}": ""}}, ValueError, "headers"),
]


@pytest.mark.parametrize("case", CLIENT_CASES, ids=[case_id(c) for c in CLIENT_CASES])
def test_client_bad_argument(case: Tuple[Dict[str, Any], type, str]) -> None:
    kw, exc, name = case
    with pytest.raises(exc) as info:
        llmretry.Client(**kw)
    names_it(info.value, name)


def test_client_bad_default_range_refused_before_io(scen: Scenario, tmp_path: Path) -> None:
    """Ranges of a client's defaults are checked at the first call (README):
    before any request, and for a batch before its record is touched."""
    with llmretry.Client(base_url=scen.url, max_retries=500, logger=None) as c:
        with pytest.raises(ValueError) as info:
            c.call_llm(BODY)
        names_it(info.value, "max_retries")
        with pytest.raises(ValueError) as info:
            c.call_many([BODY], failures_path=tmp_path / "f.jsonl")
        names_it(info.value, "max_retries")
        with pytest.raises(ValueError) as info:
            c.call_many([BODY], policy="nope")
        names_it(info.value, "policy")
    assert scen.requests() == [] and list(tmp_path.iterdir()) == []


def test_client_from_file_bad_input(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as info:
        llmretry.Client.from_file(5)  # type: ignore[arg-type]
    names_it(info.value, "policies")
    missing = tmp_path / "missing.toml"
    with pytest.raises(FileNotFoundError) as info2:
        llmretry.Client.from_file(missing)
    assert info2.value.filename == str(missing)
    for name, text in [("p.yaml", "fast: {}"), ("p.json", "{not json"),
                       ("p.toml", "[fast\n"), ("p.json", '{"fast": {"timeout_ms": 1.5}}'),
                       ("p.json", json.dumps({"fast": {"idempotency_key": SECRET_KEY}})),
                       ("p.toml", f'[fast]\njitter = "{SECRET_KEY}"\n')]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError) as info3:
            llmretry.Client.from_file(path)
        names_it(info3.value, str(path))
    bad_utf8 = tmp_path / "latin1.json"
    bad_utf8.write_bytes(b'{"caf\xe9": {}}')
    with pytest.raises(ValueError) as info3:
        llmretry.Client.from_file(bad_utf8)
    names_it(info3.value, "UTF-8")
    with pytest.raises(TypeError) as info4:
        llmretry.Client.from_file(tmp_path / "p.json", tiemout_ms=1)
    names_it(info4.value, "tiemout_ms")


@pytest.mark.parametrize("source,exc,name", [
    (None, TypeError, "policies"),
    (5, TypeError, "policies"),
    (b"/tmp/p.toml", TypeError, "policies"),
    ([("fast", {})], TypeError, "policies"),
    ({1: {}}, ValueError, "name"),
    ({"": {}}, ValueError, "name"),
    ({"fast": 5}, ValueError, "fast"),
    ({"fast": {"timeout": 5}}, ValueError, "timeout"),
    ({"fast": {1: 5}}, ValueError, "unknown key"),
    ({"fast": {"max_retries": 101}}, ValueError, "max_retries"),
    ({"fast": {"deadline_ms": 2 ** 70}}, ValueError, "deadline_ms"),
    ({"fast": {"retry_statuses": "429"}}, ValueError, "retry_statuses"),
    ({"fast": {"model": "gpt\n"}}, ValueError, "model"),
    ({"fast": {"base_url": ""}}, ValueError, "base_url"),
    ({"fast": {"jitter": SECRET_KEY}}, ValueError, "jitter"),
    ({"fast": {"retry_mode": SECRET_KEY}}, ValueError, "retry_mode"),
    ({"fast": {"idempotency_key": SECRET_KEY}}, ValueError, "idempotency_key"),
    ({"fast": {"idempotency_key": True}}, ValueError, "idempotency_key"),
])
def test_load_policies_bad_input(source: Any, exc: type, name: str) -> None:
    with pytest.raises(exc) as info:
        llmretry.load_policies(source)
    names_it(info.value, name)


# ---------------------------------------------------------------------------
# extract_json, assert_shape, log_usage, jsonl_logger

@pytest.mark.parametrize("text,exc,name", [
    (None, TypeError, "text"),
    (42, TypeError, "text"),
    (bytearray(b'{"a": 1}'), TypeError, "text"),
    ('{"a": "\ud800"}', ValueError, "text"),
    ('SECRET-PROMPT ```json\n{"a": "\udcff"}\n```', ValueError, "text"),
    (b'{"a": "\xff"}', ValueError, "text"),
])
def test_extract_json_bad_input(text: Any, exc: type, name: str) -> None:
    with pytest.raises(exc) as info:
        llmretry.extract_json(text)
    names_it(info.value, name)


def test_extract_json_nothing_found_is_value_error() -> None:
    with pytest.raises(ValueError):
        llmretry.extract_json("SECRET-PROMPT: no JSON here")
    assert llmretry.extract_json(b'x {"a": "\xc3\xa9"} y') == {"a": "é"}


@pytest.mark.parametrize("kw,exc,name", [
    ({"path": 5}, TypeError, "path"),
    ({"path": b"root"}, TypeError, "path"),
    ({"path": "root\ud800"}, ValueError, "path"),
    ({"value": {"a": "\ud800"}}, TypeError, "value"),
    ({"value": {"a": math.nan}}, TypeError, "value"),
    ({"value": {"a": deep_list()}}, TypeError, "value"),
    ({"value": cyclic_dict()}, TypeError, "value"),
    ({"value": {"a": object()}}, TypeError, "value"),
    ({"shape": {"a": object()}}, TypeError, "shape"),
    ({"shape": {"a": "\udcff"}}, TypeError, "shape"),
    ({"shape": {"a": deep_list()}}, TypeError, "shape"),
    ({"shape": {"a": "strnig"}}, ValueError, "invalid shape"),
    ({"shape": None}, ValueError, "invalid shape"),
    ({"shape": ["string", "number"]}, ValueError, "invalid shape"),
])
def test_assert_shape_bad_input(kw: Dict[str, Any], exc: type, name: str) -> None:
    args: Dict[str, Any] = {"value": {"a": "x"}, "shape": {"a": "string"}, "path": "root"}
    args.update(kw)
    with pytest.raises(exc) as info:
        llmretry.assert_shape(args["value"], args["shape"], args["path"])
    # An input that cannot be checked is not a mismatch of the data.
    assert not isinstance(info.value, llmretry.ShapeError), repr(info.value)
    names_it(info.value, name)


@pytest.mark.parametrize("args,kw,name", [
    ((None,), {}, "meta"),
    ((5,), {}, "meta"),
    (("SECRET-PROMPT",), {}, "meta"),
    (({},), {"label": 5}, "label"),
    (({},), {"label": b"x"}, "label"),
    (({},), {"logger": 5}, "logger"),
    (({},), {"logger": "llmretry"}, "logger"),
])
def test_log_usage_bad_input(args: Tuple[Any, ...], kw: Dict[str, Any], name: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TypeError) as info:
        llmretry.log_usage(*args, **kw)
    names_it(info.value, name)
    assert capsys.readouterr().out == "", "log_usage printed for bad input"


@pytest.mark.parametrize("stream", [5, "events.jsonl", Path("events.jsonl"), io.BytesIO()],
                         ids=["int", "str path", "Path", "binary stream"])
def test_jsonl_logger_bad_stream(stream: Any) -> None:
    """Refused when made: at event time the error would only be reported,
    and every event lost."""
    with pytest.raises(TypeError) as info:
        llmretry.jsonl_logger(stream)
    names_it(info.value, "stream")


# ---------------------------------------------------------------------------
# The command line: exit 2, naming the flag or the line

def run_cli(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:   # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("flags,named", [
    (["--limit", "0"], "--limit"),
    (["--limit", "-3"], "--limit"),
    (["--limit", "1.5"], "--limit"),
    (["--limit", "99999999999999999999"], "--limit"),
    (["--deadline-ms", "-1"], "--deadline-ms"),
    (["--deadline-ms", "99999999999999999999999"], "--deadline-ms"),
    (["--call-deadline-ms", "99999999999999999999999"], "--call-deadline-ms"),
    (["--timeout-ms", "0"], "--timeout-ms"),
    (["--timeout-ms", "1e3"], "--timeout-ms"),
    (["--timeout-ms", "99999999999999999999999"], "--timeout-ms"),
    (["--max-retries", "101"], "--max-retries"),
    (["--max-retries", "-1"], "--max-retries"),
    (["--base-delay-ms", "x"], "--base-delay-ms"),
    (["--max-delay-ms", "-5"], "--max-delay-ms"),
    (["--jitter", "wobbly"], "--jitter"),
    (["--jitter", SECRET_KEY], "--jitter"),
    (["--policy", "fast"], "--policies"),
    (["--policies", "/nonexistent/p.toml", "--policy", "fast"], "/nonexistent/p.toml"),
    (["--base-url", "ftp://127.0.0.1/v1"], "base_url"),
    (["--base-url", SECRET_KEY], "base_url"),
    (["--bogus"], "--bogus"),
    (["--api-key", SECRET_KEY], "OPENAI_API_KEY"),
    ([f"--api-key={SECRET_KEY}"], "OPENAI_API_KEY"),
    (["--limit", SECRET_KEY], "--limit"),
    (["--failures", "SAME"], "different files"),
    (["--events", "/nonexistent/dir/e.jsonl"], "/nonexistent/dir/e.jsonl"),
])
def test_cli_batch_bad_flag(scen: Scenario, tmp_path: Path, flags: List[str], named: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    req, res = tmp_path / "r.jsonl", tmp_path / "out.jsonl"
    req.write_text(json.dumps(BODY) + "\n", encoding="utf-8")
    res.write_text("earlier results\n", encoding="utf-8")
    flags = [str(res) if f == "SAME" else f for f in flags]
    argv = ["batch", str(req), "-o", str(res), "--base-url", scen.url, *flags]
    code, out, err = run_cli(argv, capsys)
    assert code == 2, (code, err)
    assert named in err, f"{err!r} does not name {named!r}"
    assert SECRET_KEY not in err + out
    assert scen.requests() == []
    assert res.read_text(encoding="utf-8") == "earlier results\n", "a usage error wrote -o"


@pytest.mark.parametrize("content,problem", [
    (b'{"messages": []}\n{"x": NaN}\n', ":2: "),
    (b'{"messages": []}\n\n{"x": -Infinity}\n', ":3: "),
    (b'{"x": 1e999}\n', ":1: "),
    (b'{"messages": []}\n{"x": "\\ud800"}\n', ":2: "),
    (b'{"messages": [{"content": "SECRET-PROMPT-\xff"}]}\n', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", ":1: "),
    (b'{"messages": []}\n"SECRET-PROMPT"\n', ":2: "),
    (b'{"messages": []}\nnull\n', ":2: "),
    (b'{"messages": []}\n{"messages": [}\n', ":2: "),
], ids=["NaN", "-Infinity", "1e999", "lone surrogate", "not UTF-8", "nested too deeply",
        "a string", "null", "not JSON"])
def test_cli_batch_bad_input_file(scen: Scenario, tmp_path: Path, content: bytes,
                                  problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.jsonl"
    req.write_bytes(content)
    code, out, err = run_cli(["batch", str(req), "-o", str(tmp_path / "o.jsonl"),
                              "--base-url", scen.url], capsys)
    assert code == 2, (code, err[-500:])
    assert "Traceback" not in err
    assert problem in err and str(req) in err, err
    assert "SECRET-PROMPT" not in err + out
    assert scen.requests() == []


def test_cli_batch_huge_limit_runs(scen: Scenario, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    req, res = tmp_path / "r.jsonl", tmp_path / "o.jsonl"
    req.write_text(json.dumps(BODY) + "\n" + json.dumps(BODY) + "\n", encoding="utf-8")
    code, _, err = run_cli(["batch", str(req), "-o", str(res), "--base-url", scen.url,
                            "--limit", "2147483648"], capsys)
    assert code == 0, err
    assert [json.loads(line)["ok"] for line in res.read_text().splitlines()] == [True, True]


@pytest.mark.parametrize("argv,named", [
    (["call", "hi"], "--model"),
    (["call", "hi", "--model", "m", "--timeout-ms", "0"], "--timeout-ms"),
    (["call", "hi", "--model", "m", "--deadline-ms", "-1"], "--deadline-ms"),
    (["call", "SECRET-PROMPT-\udcff", "--model", "m"], "prompt"),
    (["call", "hi", "--model", "gpt-\udcff"], "--model"),
    (["call", "hi", "--model", "m", "--system", "SECRET-SYSTEM-\udcff"], "--system"),
    (["call", "hi", "--model", "m", "--policies", "/nonexistent.json", "--policy", "p"],
     "/nonexistent.json"),
    (["policies"], "file"),
    (["policies", "/nonexistent/p.toml"], "/nonexistent/p.toml"),
    (["frobnicate"], "frobnicate"),
    ([], "COMMAND"),
])
def test_cli_call_and_policies_bad_arguments(scen: Scenario, argv: List[str], named: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = argv + (["--base-url", scen.url] if argv[:1] == ["call"] else [])
    code, out, err = run_cli(argv, capsys)
    assert code == 2, (code, err)
    assert named in err, err
    assert "Traceback" not in err and "SECRET-" not in err + out
    assert scen.requests() == []


def test_cli_policies_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'[fast]\ntimeout_ms = 5000\n[slow]\njitter = "{SECRET_KEY}"\n')
    code, out, err = run_cli(["policies", str(path)], capsys)
    assert code == 2 and out == ""
    for word in (str(path), "slow", "jitter"):
        assert word in err, err
    assert SECRET_KEY not in err


# ---------------------------------------------------------------------------
# Secrets in the failures file, the summary event and the CLI's outputs

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# One step per item (limit 1, no retries, so item i meets step i), and the
# kind of failure it must end with (None: the item succeeds).
FAULTS: List[Tuple[Dict[str, Any], Optional[str]]] = [
    ({"status": 400}, "http_status"),
    # A server echoing the key and the prompt in its error body: that text
    # is the server's (body_preview), but no failures-file field carries it.
    ({"status": 401, "body": {"error": {
        "message": f"Incorrect API key provided: {SECRET_KEY} for SECRET-PROMPT",
        "type": "invalid_request_error", "code": None}}}, "http_status"),
    ({"status": 429, "retry_after": "0"}, "http_status"),
    ({}, None),
    ({"status": 500, "error_code": "server_error"}, "http_status"),
    ({"status": 503}, "http_status"),
    ({"status": 307, "headers": {"Location": "http://127.0.0.1:9/v1/chat/completions"}},
     "http_status"),
    ({"delay_ms": 3000}, "timeout"),
    ({"fault": "no_headers", "stall_ms": 3000}, "timeout"),
    ({"fault": "stall_body", "stall_ms": 3000}, "timeout"),
    ({"fault": "invalid_json"}, "invalid_response"),
    ({"fault": "close"}, "network"),
    ({"fault": "reset"}, "network"),
    ({"fault": "truncate"}, "network"),
    ({"fault": "huge", "size": 3 * 1024 * 1024}, "response_too_large"),
    ({"content": "reject me"}, "invalid_response"),
    ({}, None),
]


def fault_script(faults: Sequence[Tuple[Dict[str, Any], Optional[str]]]) -> List[Dict[str, Any]]:
    """The server's steps for `faults`, one per item. A close comes on the
    connection kept alive from the item before: the request was written, so
    it is the item's one attempt (no free re-send takes another step; issue
    27 item 6), a network error at max_retries=0."""
    return [step for step, _ in faults]


FAULT_OPTS: Dict[str, Any] = dict(FAST, max_retries=0, timeout_ms=800,
                                  max_response_bytes=1024 * 1024)


def accept(data: Any) -> bool:
    return bool(data["choices"][0]["message"]["content"] != "reject me")


def check_failures_file(path: Path, items: Sequence[Any],
                        expected: Dict[int, Optional[str]],
                        item_of: Callable[[Any], Any] = lambda item: item) -> None:
    """The failures file holds exactly the failed items, each as given; the
    key, the Authorization header and the prompt appear nowhere else."""
    text = path.read_text(encoding="utf-8")
    assert SECRET_KEY not in text
    assert "bearer" not in text.lower() and "authorization" not in text.lower()
    recs = [json.loads(line) for line in text.splitlines()]
    failed = {i: k for i, k in expected.items() if k is not None}
    assert sorted(r["index"] for r in recs) == sorted(failed), text[:2000]
    for rec in recs:
        i = rec["index"]
        assert rec["error"]["kind"] == failed[i], (i, rec["error"])
        if "item_repr" in rec:
            assert rec["item"] is None
            assert rec["item_repr"] == repr(items[i])
        else:
            assert rec["item"] == item_of(items[i])
        rest = {k: v for k, v in rec.items() if k not in ("item", "item_repr")}
        rest_text = json.dumps(rest, ensure_ascii=False)
        for s in SECRET_BITS:
            assert s not in rest_text, f"{s!r} in the record of item {i}: {rest_text}"
    done = Path(f"{path}.done").read_text(encoding="ascii").splitlines()
    assert sorted(int(x) for x in done[1:]) == sorted(i for i, k in expected.items()
                                                      if k is None)


def check_summary_events(events: Events) -> None:
    summaries = events.of("llm_batch_summary")
    assert len(summaries) == 1
    text = json.dumps(summaries, ensure_ascii=False)
    for s in SECRET_BITS:
        assert s not in text
    # The calls' own events too, but for body_preview: the server's text,
    # which the README says may echo input.
    for ev in events.events:
        shown = json.dumps({k: v for k, v in ev.items() if k != "body_preview"},
                           ensure_ascii=False)
        for s in SECRET_BITS:
            assert s not in shown, f"{s!r} in {shown}"


@pytest.mark.slow
@pytest.mark.parametrize("key_via", ["api_key", "header"])
def test_call_many_failures_file_has_no_secret(scen: Scenario, tmp_path: Path,
                                               key_via: str) -> None:
    scen.script(fault_script(FAULTS))
    bodies: List[Any] = [secret_body(f"fm{i}") for i in range(len(FAULTS))]
    bodies[3] = json.dumps(bodies[3])                   # str and bytes bodies too
    bodies[5] = json.dumps(bodies[5]).encode()
    path = tmp_path / "failed.jsonl"
    events = Events()
    auth: Dict[str, Any] = ({"api_key": SECRET_KEY} if key_via == "api_key" else
                            {"headers": {"Authorization": f"Bearer {SECRET_KEY}"}})
    # A client of its own: the default client's cache holds whatever earlier
    # tests left in it (after test_stream, idle connections this test then
    # reused), and a connection found dead before the request is re-sent for
    # free: only this test's own connections keep the count of steps exact.
    own = llmretry.Client()
    try:
        out = llmretry.call_many(bodies, limit=1, failures_path=path, base_url=scen.url,
                                 logger=events, validate=accept, client=own, **auth,
                                 **FAULT_OPTS)
    finally:
        own.close()
    recs = scen.requests()
    assert all(r["headers"].get("authorization") == f"Bearer {SECRET_KEY}" for r in recs)
    expected = {i: kind for i, (_, kind) in enumerate(FAULTS)}
    assert {i: getattr(v, "kind", None) for i, v in enumerate(out)} == expected
    # The echo happened, so the checks below can fail: the server's text holds both.
    assert SECRET_KEY in (out[1].body_preview or "")
    check_failures_file(path, bodies, expected,
                        item_of=lambda b: json.loads(b) if isinstance(b, (str, bytes)) else b)
    check_summary_events(events)
    for text in (repr(out), out.summary.format(), repr(out.summary)):
        for s in SECRET_BITS:
            assert s not in text

    # Faults before any response: refused connection, unknown host.
    for url in (f"http://127.0.0.1:{closed_port()}/v1", "http://llmretry-test.invalid/v1"):
        path2 = tmp_path / "failed2.jsonl"
        events2 = Events()
        out2 = llmretry.call_many(bodies[:2], limit=2, failures_path=path2, base_url=url,
                                  logger=events2, **auth, **FAULT_OPTS)
        assert [e.kind for e in out2] == ["network", "network"]
        check_failures_file(path2, bodies, {0: "network", 1: "network"})
        check_summary_events(events2)


@pytest.mark.slow
def test_map_with_concurrency_failures_file_has_no_secret(scen: Scenario,
                                                          tmp_path: Path) -> None:
    """Items are whatever the caller maps over: here bodies, and for some a
    (client, body) pair that JSON cannot write, recorded by repr (the
    client's repr hides its key)."""
    scen.script(fault_script(FAULTS))
    client = llmretry.Client(api_key=SECRET_KEY, base_url=scen.url, logger=None,
                             validate=accept, **FAULT_OPTS)
    items: List[Any] = [secret_body(f"mp{i}") for i in range(len(FAULTS))]
    for i in (0, 7, 10):
        items[i] = (client, items[i])

    def worker(item: Any, index: int) -> Any:
        c, body = item if isinstance(item, tuple) else (client, item)
        return c.call_llm(body).meta.status

    path = tmp_path / "failed.jsonl"
    events = Events()
    try:
        out = llmretry.map_with_concurrency(items, 1, worker, return_exceptions=True,
                                            failures_path=path, logger=events)
        expected = {i: kind for i, (_, kind) in enumerate(FAULTS)}
        assert {i: getattr(v, "kind", None) for i, v in enumerate(out)} == expected
        assert SECRET_KEY not in repr(client) and "api_key=<set>" in repr(client)
        check_failures_file(path, items, expected)     # reprs as written: client open
        check_summary_events(events)
    finally:
        client.close()


@pytest.mark.slow
def test_cli_outputs_have_no_secret(scen: Scenario, tmp_path: Path) -> None:
    """llmretry batch with the key in $OPENAI_API_KEY, -v and --events: no
    output holds the key; the prompt is only in the failures file's items.
    (Without the echoing server: results and events carry body_preview.)"""
    faults = [(step, kind) for step, kind in FAULTS
              if "body" not in step and "content" not in step]
    scen.script(fault_script(faults))
    bodies = [secret_body(f"cli{i}") for i in range(len(faults))]
    req, res, fail, evs = (tmp_path / n for n in ("r.jsonl", "out.jsonl", "f.jsonl",
                                                  "ev.jsonl"))
    req.write_text("".join(json.dumps(b) + "\n" for b in bodies), encoding="utf-8")
    env = child_env()
    env["OPENAI_API_KEY"] = SECRET_KEY
    argv = [sys.executable, "-m", "llmretry", "batch", str(req), "-o", str(res),
            "--failures", str(fail), "--events", str(evs), "-v", "--limit", "1",
            "--base-url", scen.url, "--max-retries", "0", "--timeout-ms", "800",
            "--base-delay-ms", "10"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAILED" in proc.stderr       # -v printed the give-ups
    expected = {i: kind for i, (_, kind) in enumerate(faults)}
    # The CLI's own failures: response_too_large needs max_response_bytes,
    # which has no flag: a 3 MB answer is read whole and succeeds.
    expected = {i: (None if k == "response_too_large" else k) for i, k in expected.items()}
    check_failures_file(fail, bodies, expected)
    results = [json.loads(line) for line in res.read_text(encoding="utf-8").splitlines()]
    assert [r["ok"] for r in results] == [k is None for k in expected.values()]
    for where, text in (("stdout", proc.stdout), ("stderr", proc.stderr),
                        ("events", evs.read_text(encoding="utf-8")),
                        ("results", res.read_text(encoding="utf-8"))):
        assert text or where == "stdout"
        for s in SECRET_BITS:
            assert s not in text, f"{s!r} in the CLI's {where}"
        assert "bearer" not in text.lower(), where


def test_cli_batch_lines_end_at_newline_only(scen: Scenario, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped (json.dumps
    with ensure_ascii=False writes them so): they do not end a line."""
    content = "a\u2028b\u2029c\x85d\r\n"
    bodies = [{"model": "m", "messages": [{"role": "user", "content": content}]}] * 2
    req, res = tmp_path / "r.jsonl", tmp_path / "o.jsonl"
    req.write_text("".join(json.dumps(b, ensure_ascii=False) + "\r\n" for b in bodies),
                   encoding="utf-8", newline="")
    code, _, err = run_cli(["batch", str(req), "-o", str(res), "--base-url", scen.url],
                           capsys)
    assert code == 0, err
    sent = [json.loads(r["body"]) for r in scen.requests()]
    assert sent == bodies


def test_cli_batch_reads_stdin(scen: Scenario, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    data = (json.dumps(BODY) + "\n").encode() + b'{"x": "\xff"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code, _, err = run_cli(["batch", "-", "-o", str(tmp_path / "o.jsonl"),
                            "--base-url", scen.url], capsys)
    assert code == 2 and "-:2: not UTF-8" in err, err
    assert scen.requests() == []


def test_extension_call_many_limit_does_not_wrap(scen: Scenario) -> None:
    from llmretry import _llmretry
    engine = _llmretry.Engine()
    try:
        for limit in (2 ** 32 + 1, 2 ** 32, 2 ** 70, 0, -1):
            with pytest.raises(ValueError, match="limit must be between 1 and 2147483647"):
                engine.call_many([b'{"model": "m"}'] * 3, limit=limit, base_url=scen.url)
        with pytest.raises(ValueError, match="batch_deadline_ms is out of range"):
            engine.call_many([b'{"model": "m"}'], batch_deadline_ms=2 ** 64, base_url=scen.url)
        # a shared option the core refuses is named as such, not as a body's fault
        with pytest.raises(ValueError) as info:
            engine.call_many([b'{"model": "m"}'] * 2, timeout_ms=0, base_url=scen.url)
        assert "timeout_ms" in str(info.value) and "bodies[" not in str(info.value)
        assert scen.requests() == []
    finally:
        engine.close()
