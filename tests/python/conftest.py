"""Shared fixtures and helpers of the Python suite.

One fault-injecting mock server (``llmretry.testing.MockServer``) serves the
whole session; every test scripts its own scenario (``scen`` fixture: a name
derived from the test's node id), so tests never see each other's requests.

Secrets: every call made through these helpers uses the recognisable key
``SECRET_KEY`` and prompts ``SECRET-PROMPT-...``; ``check_no_secrets`` looks
for them in events, errors, results and reprs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
# LLMRETRY_PYTHON_DIR: another tree holding the package (tools/check.sh points
# it at a copy whose extension is built with ASan+UBSan); children get it too.
PYTHON_DIR = Path(os.environ.get("LLMRETRY_PYTHON_DIR") or ROOT / "python")
if str(PYTHON_DIR) not in sys.path:  # `pytest tests/python` without PYTHONPATH
    sys.path.insert(0, str(PYTHON_DIR))

import llmretry  # noqa: E402
from llmretry.testing import MockServer  # noqa: E402

SECRET_KEY = "sk-test-SECRET-KEY-123"
VECTOR_DIR = ROOT / "tests" / "vectors"

# Small delays so that retries cost milliseconds (the vectors' convention).
FAST: Dict[str, Any] = {"timeout_ms": 5000, "max_retries": 3, "base_delay_ms": 20,
                        "max_delay_ms": 1000, "jitter": "none"}

COMMON_FIELDS = {"event", "request_id", "attempt", "model", "policy"}
# docs/reliability.md: each event's fields, exactly.
EVENT_FIELDS: Dict[str, set] = {
    "llm_request_started": COMMON_FIELDS | {"timeout_ms", "deadline_left_ms"},
    "llm_request_failed": COMMON_FIELDS | {"status", "duration_ms", "retry_after",
                                           "error_code", "body_preview"},
    "llm_request_error": COMMON_FIELDS | {"error_kind", "error_message", "duration_ms"},
    "llm_retry_scheduled": COMMON_FIELDS | {"delay_ms", "delay_source", "next_attempt"},
    "llm_request_succeeded": COMMON_FIELDS | {"status", "duration_ms", "usage",
                                              "response_model", "system_fingerprint"},
    "llm_request_gave_up": COMMON_FIELDS | {"reason", "attempts", "total_ms",
                                            "error_kind", "status"},
    "llm_shared_unavailable": COMMON_FIELDS | {"shared", "error_message"},
    "llm_shared_recovered": COMMON_FIELDS | {"shared", "down_ms"},
}
STREAM_FIELDS = {"stream", "ttft_ms", "chunks"}
KINDS = ("http_status", "timeout", "network", "invalid_response", "deadline_exceeded",
         "cancelled", "response_too_large", "stream_interrupted", "circuit_open", "refusal")
REASONS = ("retries_exhausted", "not_retryable", "deadline", "retry_after_too_long",
           "unsafe_mode", "cancelled", "stream_interrupted", "retry_budget_exhausted",
           "circuit_open")
DELAY_SOURCES = ("retry_after", "ratelimit_reset", "backoff", "fallback")


def error_class(kind: str) -> type:
    """The exception class of an error kind (/tmp/py_api.md, Errors)."""
    return {
        "http_status": llmretry.HTTPStatusError,
        "timeout": llmretry.RequestTimeoutError,
        "network": llmretry.NetworkError,
        "invalid_response": llmretry.InvalidResponseError,
        "deadline_exceeded": llmretry.DeadlineExceededError,
        "response_too_large": llmretry.ResponseTooLargeError,
        "cancelled": llmretry.CallCancelledError,
        "refusal": llmretry.RefusalError,
    }[kind]


def pytest_configure(config: pytest.Config) -> None:
    # A runner that starts the suite in the background from a shell without
    # job control leaves SIGINT ignored, and an ignored signal stays ignored
    # in every child: the Ctrl-C tests' children would never see theirs.
    # A handled one is reset to the default at exec.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers", "slow: takes seconds (run by default; deselect with -m 'not slow')")
    config.addinivalue_line(
        "markers", "pure_python: runs no C code of the project beyond the import (the mock "
        "server, mypy): the ASan and pipe-notifier passes skip it")
    config.addinivalue_line(
        "markers", "engine_pause: needs the engine's batch pause to ignore a Retry-After "
        "above max_retry_after_ms (core/src/engine.c, issue 13 item 3)")


# The files that take longest, longest first: they run before the others.
# pytest-xdist (--dist loadfile, make test) hands files to its workers in
# collection order, so a long file collected late started last and was the
# whole run's tail, its worker busy while the others sat idle.
SLOW_FILES = ("test_ray.py", "test_lazy_batch.py", "test_docs.py", "test_dask.py",
              "test_correctness_batch.py", "test_ratelimit.py", "test_shared_redis.py",
              "test_stream.py", "test_batch.py", "test_bad_input.py", "test_notebook.py",
              "test_version.py")


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    # A stable sort: each file's tests keep their order.
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never pick a key or endpoint up from the developer's environment."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def no_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm not installed: importing it (or tqdm.auto, which an earlier test of
    this process may have imported, and import_module would then return from
    sys.modules) raises ImportError."""
    for name in ("tqdm", "tqdm.auto", "tqdm.notebook"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="session")
def server() -> Iterator[MockServer]:
    with MockServer() as mock:
        yield mock


@pytest.fixture(scope="session")
def client() -> Iterator["llmretry.Client"]:
    """One Client shared by tests that do not care about engine state."""
    c = llmretry.Client(api_key=SECRET_KEY)
    yield c
    c.close()


_names_lock = threading.Lock()
_names_used: set = set()


def nested(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` lists, built without recursion."""
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def wait_until(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll cond every 10 ms until it gives a true value (returned) or
    timeout s pass (then its last, false value). Tests wait for a condition
    with this, never a bare sleep; the timeout is generous on purpose (a
    loaded machine is slow, not wrong)."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.01)


def unique_name(hint: str) -> str:
    base = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")[:60] or "t"
    with _names_lock:
        name, n = base, 1
        while name in _names_used:
            n += 1
            name = f"{base}_{n}"
        _names_used.add(name)
    return name


@dataclasses.dataclass
class Scenario:
    """One mock scenario, owned by one test."""

    server: MockServer
    name: str

    def script(self, steps: Sequence[Dict[str, Any]],
               after: Optional[Dict[str, Any]] = None) -> "Scenario":
        self.server.script(self.name, list(steps), after)
        return self

    @property
    def url(self) -> str:
        """The scenario's base_url."""
        return self.server.scenario_url(self.name)

    def requests(self) -> List[Dict[str, Any]]:
        return self.server.requests(self.name)

    def wait_requests(self, n: int, timeout: float = 10.0) -> List[Dict[str, Any]]:
        """Wait until the server has recorded at least n requests (the
        records then, or as they are after timeout s)."""
        recs: List[Dict[str, Any]] = []

        def enough() -> bool:
            recs[:] = self.requests()
            return len(recs) >= n
        wait_until(enough, timeout)
        return recs

    def sub(self, suffix: str) -> "Scenario":
        """Another scenario for the same test."""
        s = Scenario(self.server, unique_name(f"{self.name}_{suffix}"))
        s.script([])
        return s


@pytest.fixture
def scen(server: MockServer, request: pytest.FixtureRequest) -> Scenario:
    s = Scenario(server, unique_name(request.node.name))
    s.script([])
    return s


def secret_body(tag: str, model: str = "gpt-test", **extra: Any) -> Dict[str, Any]:
    """A request body whose message contents are recognisable secrets."""
    body: Dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": f"SECRET-SYSTEM-{tag}"},
            {"role": "user", "content": f"SECRET-PROMPT-{tag}"},
        ],
    }
    body.update(extra)
    return body


def body_secrets(body: Any) -> List[str]:
    out = [SECRET_KEY]
    if isinstance(body, dict):
        for msg in body.get("messages", []):
            if isinstance(msg, dict) and isinstance(msg.get("content"), str) and msg["content"]:
                out.append(msg["content"])
    return out


def serialised(body: Dict[str, Any]) -> str:
    """How the package serialises a dict body (/tmp/py_api.md)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class Events:
    """A callable logger recording each event and the thread it came on."""

    def __init__(self, raise_on: Optional[str] = None,
                 exc: Optional[BaseException] = None) -> None:
        self.events: List[Dict[str, Any]] = []
        self.threads: List[int] = []
        self._raise_on = raise_on
        self._exc = exc
        self._lock = threading.Lock()

    def __call__(self, event: Dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)
            self.threads.append(threading.get_ident())
        if self._raise_on is not None and event.get("event") == self._raise_on:
            assert self._exc is not None
            raise self._exc

    @property
    def names(self) -> List[str]:
        return [e["event"] for e in self.events]

    def of(self, name: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def field(self, name: str, key: str) -> List[Any]:
        return [e[key] for e in self.of(name)]


@dataclasses.dataclass
class Outcome:
    result: Any
    error: Optional[BaseException]
    events: Events
    wall_ms: float
    body: Any
    kwargs: Dict[str, Any]
    thread: int

    @property
    def ok(self) -> bool:
        return self.error is None


def run_call(scen: Scenario, steps: Optional[Sequence[Dict[str, Any]]] = None, *,
             after: Optional[Dict[str, Any]] = None, body: Any = None,
             tag: Optional[str] = None, client: Any = None, fast: bool = True,
             **kw: Any) -> Outcome:
    """Script scen (when steps is given), make one call, catch LLMError."""
    if steps is not None:
        scen.script(steps, after)
    if body is None:
        body = secret_body(tag or scen.name)
    options: Dict[str, Any] = dict(FAST) if fast else {}
    options.update(kw)
    options.setdefault("base_url", scen.url)
    options.setdefault("api_key", SECRET_KEY)
    events = options.get("logger")
    if events is None and "logger" not in kw:
        events = Events()
        options["logger"] = events
    call = client.call_llm if client is not None else llmretry.call_llm
    t0 = time.monotonic()
    try:
        res, err = call(body, **options), None
    except llmretry.LLMError as exc:
        res, err = None, exc
    wall = (time.monotonic() - t0) * 1000.0
    return Outcome(res, err, events if isinstance(events, Events) else Events(),
                   wall, body, options, threading.get_ident())


def check_no_secrets(secrets: Iterable[str], *texts: Any) -> None:
    for text in texts:
        if text is None:
            continue
        if not isinstance(text, str):
            text = json.dumps(text, ensure_ascii=False, default=repr)
        for s in secrets:
            assert s not in text, f"secret {s!r} leaked into {text[:300]!r}"


def check_event_shape(ev: Dict[str, Any]) -> None:
    """One event: exactly its docs/reliability.md fields, with sane types."""
    name = ev.get("event")
    assert name in EVENT_FIELDS, f"unknown event {ev!r}"
    want = EVENT_FIELDS[name]
    if "stream" in ev and name in ("llm_request_succeeded", "llm_request_gave_up"):
        # A streamed call's end says what its stream did (never its text).
        want = want | STREAM_FIELDS
        if name == "llm_request_gave_up" and "stream_reason" in ev:
            want = want | {"stream_reason"}
        assert ev["stream"] is True
        assert isinstance(ev["chunks"], int) and ev["chunks"] >= 0
        assert ev["ttft_ms"] is None or (isinstance(ev["ttft_ms"], int) and ev["ttft_ms"] >= 0)
    if "target" in ev:
        # A call with fallbacks: every event names its target.
        want = want | {"target"}
        assert isinstance(ev["target"], int) and ev["target"] >= 0
    if "validation_path" in ev:
        # An answer the schema refused: where, never what.
        assert name == "llm_request_error" and ev["error_kind"] == "invalid_response"
        want = want | {"validation_path"}
        assert isinstance(ev["validation_path"], str) and ev["validation_path"].startswith("$")
    assert set(ev) == want, f"{name}: fields {sorted(ev)}, expected {sorted(want)}"
    assert isinstance(ev["request_id"], str) and ev["request_id"]
    assert isinstance(ev["attempt"], int) and not isinstance(ev["attempt"], bool)
    assert ev["attempt"] >= 0
    assert ev["model"] is None or isinstance(ev["model"], str)
    for key in ("timeout_ms", "duration_ms", "delay_ms", "next_attempt", "attempts",
                "total_ms"):
        if key in ev:
            assert isinstance(ev[key], int) and ev[key] >= 0, f"{name}.{key} = {ev[key]!r}"
    if name == "llm_request_started":
        assert ev["timeout_ms"] > 0
        assert ev["deadline_left_ms"] is None or isinstance(ev["deadline_left_ms"], int)
    if name == "llm_request_failed":
        assert isinstance(ev["status"], int) and ev["status"] >= 300
        for key in ("retry_after", "error_code", "body_preview"):
            assert ev[key] is None or isinstance(ev[key], str)
        if ev["body_preview"] is not None:
            assert len(ev["body_preview"].encode("utf-8")) <= 500
    if name == "llm_request_error":
        assert ev["error_kind"] in KINDS
        assert isinstance(ev["error_message"], str) and ev["error_message"]
    if name == "llm_retry_scheduled":
        assert ev["delay_source"] in DELAY_SOURCES
        if ev["delay_source"] == "fallback":
            # To the next target at once; an attempt the open breaker
            # refused was never made, so its index comes again.
            assert ev["next_attempt"] in (ev["attempt"], ev["attempt"] + 1)
            assert ev["delay_ms"] == 0
        else:
            assert ev["next_attempt"] == ev["attempt"] + 1
    if name == "llm_request_succeeded":
        assert isinstance(ev["status"], int) and 200 <= ev["status"] < 300
        if ev["usage"] is not None:
            assert set(ev["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    if name == "llm_request_gave_up":
        assert ev["reason"] in REASONS
        assert ev["error_kind"] in KINDS
        assert ev["status"] is None or isinstance(ev["status"], int)


def check_event_sequence(events: Events, attempts: int, request_id: str,
                         model: Optional[str] = "gpt-test") -> None:
    """Invariants of tests/vectors/README.md on one call's events."""
    cur, nxt, starts = -1, 0, 0
    for i, ev in enumerate(events.events):
        check_event_shape(ev)
        assert ev["request_id"] == request_id, f"event {i} has another request_id"
        if model is not None:
            assert ev["model"] == model
        name = ev["event"]
        if name == "llm_request_started":
            assert ev["attempt"] == nxt, f"started #{i}: attempt {ev['attempt']}, expected {nxt}"
            cur = ev["attempt"]
            starts += 1
        elif name == "llm_retry_scheduled":
            assert ev["attempt"] == cur
            nxt = ev["next_attempt"]
            assert nxt == cur + 1
        else:
            assert ev["attempt"] == cur, f"{name} #{i}: attempt {ev['attempt']}, last start {cur}"
            if name in ("llm_request_succeeded", "llm_request_gave_up"):
                assert i == len(events.events) - 1, f"{name} is not the last event"
                if name == "llm_request_gave_up":
                    assert ev["attempts"] == attempts
    assert starts == attempts, f"{starts} started events for {attempts} attempts"


def check_error(err: BaseException, kind: str, *, reason: Optional[str] = None,
                attempts: Optional[int] = None, status: Any = "any",
                model: Optional[str] = "gpt-test") -> None:
    """The exception class and attributes of an LLMError (docs/python.md)."""
    assert isinstance(err, llmretry.LLMError), f"{type(err).__name__}: {err}"
    assert isinstance(err, error_class(kind)), (
        f"{type(err).__name__} (kind {getattr(err, 'kind', None)}), expected "
        f"{error_class(kind).__name__}: {err}")
    assert err.kind == kind, f"kind {err.kind!r}, expected {kind!r} ({err})"
    if reason is not None:
        assert err.reason == reason, f"reason {err.reason!r}, expected {reason!r} ({err})"
    assert err.reason in REASONS
    if attempts is not None:
        assert err.attempts == attempts, f"attempts {err.attempts}, expected {attempts}"
    assert err.attempt == err.attempts - 1
    if status != "any":
        assert err.status == status, f"status {err.status!r}, expected {status!r}"
    assert err.status is None or isinstance(err.status, int)
    assert isinstance(err.request_id, str) and err.request_id
    assert isinstance(err.message, str) and err.message
    assert str(err) == f"{err.message} [request_id={err.request_id}]"
    if model is not None:
        assert err.model == model
    assert isinstance(err.duration_ms, int) and isinstance(err.total_ms, int)
    assert err.total_ms >= err.duration_ms >= 0
    assert err.retry_after_ms is None or (isinstance(err.retry_after_ms, int)
                                          and err.retry_after_ms > 0)
    assert err.error_code is None or isinstance(err.error_code, str)
    assert err.body_preview is None or isinstance(err.body_preview, str)
    r = repr(err)
    assert kind in r and err.request_id in r
    # Picklable with its class and attributes (multiprocessing ships errors).
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    for attr in ("kind", "message", "status", "attempt", "attempts", "request_id",
                 "retry_after_ms", "error_code", "body_preview", "reason", "model",
                 "duration_ms", "total_ms"):
        assert getattr(back, attr) == getattr(err, attr), attr
    assert str(back) == str(err)


def check_outcome_secrets(out: Outcome) -> None:
    """No key or prompt in any event, error text, result or meta repr."""
    secrets = body_secrets(out.body)
    for ev in out.events.events:
        check_no_secrets(secrets, json.dumps(ev, ensure_ascii=False))
    if out.error is not None:
        e = out.error
        check_no_secrets(secrets, str(e), repr(e), e.message, e.body_preview, repr(e.args),
                         repr(e.__reduce__()))
    if out.result is not None:
        check_no_secrets(secrets, repr(out.result), str(out.result), repr(out.result.meta),
                         str(out.result.meta))


def check_calling_thread(out: Outcome) -> None:
    assert out.events.threads, "no events were delivered"
    assert set(out.events.threads) == {out.thread}, "events delivered off the calling thread"


def request_checks(recs: List[Dict[str, Any]], request_id: str, body_text: Optional[str],
                   key: Optional[str] = SECRET_KEY) -> None:
    """Headers every request of a call carries (docs/reliability.md)."""
    for rec in recs:
        h = rec["headers"]
        if key is None:
            assert "authorization" not in h
        else:
            assert h.get("authorization") == f"Bearer {key}"
        assert h.get("x-client-request-id") == request_id
        assert h.get("content-type", "").startswith("application/json")
        assert h.get("accept") == "application/json"
        assert h.get("user-agent", "").startswith(f"llmretry/{llmretry.__version__}")
        assert rec["method"] == "POST"
        assert rec["path"].endswith("/chat/completions")
        if body_text is not None:
            assert rec["body"] == body_text


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("OPENAI_API_KEY", None)
    env.pop("OPENAI_BASE_URL", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env
