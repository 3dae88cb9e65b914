"""Shared budgets through Redis (issue 28 item 4, docs/shared.md): clients in
one process and in several processes pace against one limit, and a breaker
opened in one is open in all, through a real redis-server; Redis killed
mid-batch and brought back costs no item and is reported once each way; a
wrong password or an unreachable Redis leaves every call working on the
local budget; the password is never shown."""

from __future__ import annotations

import json
import multiprocessing
import socket
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

import llmretry
from llmretry.testing import MockServer
from redis_server import RedisServer
from test_shared import _open_the_breaker   # the same three 503s, in a process of its own

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SHARED_EVENTS = ("llm_shared_unavailable", "llm_shared_recovered")


def patient(redis: RedisServer) -> str:
    """The store's URL giving Redis a second to answer: on a loaded machine a
    50 ms stall of redis-server is an outage, which each process rightly
    meets on its own budget (the outage tests use the default)."""
    return redis.url + "?timeout_ms=1000"


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer() as server:
        yield server


class Events:
    """A logger collecting event dicts (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: List[Dict[str, Any]] = []

    def __call__(self, ev: Dict[str, Any]) -> None:
        with self.lock:
            self.items.append(ev)

    def named(self, name: str) -> List[Dict[str, Any]]:
        with self.lock:
            return [e for e in self.items if e["event"] == name]


def test_two_clients_share_a_rate_limit(redis: RedisServer, mock: MockServer) -> None:
    # A provider's 1,200 a minute enforced in any second (20), and two
    # clients each configured with it: through Redis they send 20 a second
    # together (each alone would send 20: about half refused).
    mock.script("lim", [], limits={"rpm": 20, "window_ms": 1000})
    url = mock.scenario_url("lim")
    clients = [llmretry.Client(base_url=url, shared=patient(redis), rpm=1200, max_retries=5,
                               logger=None) for _ in range(2)]
    outs: List[Any] = [None, None]

    def run(i: int) -> None:
        outs[i] = clients[i].call_many([BODY] * 15, limit=8)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert [o.summary.ok for o in outs] == [15, 15]
    stats = mock.limit_stats("lim")
    assert stats is not None and stats["admitted"] == 30
    assert stats["refused"] <= 1, stats


def _paced(base_url: str, shared: str, n: int) -> Dict[str, Any]:
    with llmretry.Client(base_url=base_url, shared=shared, rpm=1200, max_retries=5,
                         base_delay_ms=100, logger=None) as client:
        out = client.call_many([BODY] * n, limit=8)
        return {"ok": out.summary.ok, "attempts": out.summary.attempts}


def test_processes_share_a_rate_limit(redis: RedisServer, mock: MockServer) -> None:
    # Four processes on the key, each configured with the provider's limit:
    # through Redis together they stay under it.
    mock.script("plim", [], limits={"rpm": 20, "window_ms": 1000})
    url = mock.scenario_url("plim")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        runs = pool.starmap(_paced, [(url, patient(redis), 6)] * 4)
    recs = mock.requests("plim")
    refused = sum(1 for r in recs if r.get("rate_limited"))
    assert sum(r["ok"] for r in runs) == 24
    assert refused <= 1, f"{refused} of {len(recs)} refused"


def test_a_breaker_opened_in_another_process(redis: RedisServer, mock: MockServer) -> None:
    mock.script("down", [], after={"status": 503})
    url = mock.scenario_url("down")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_open_the_breaker, (url, patient(redis))) == 3
    with llmretry.Client(base_url=url, shared=patient(redis), max_retries=0, breaker_failures=3,
                         breaker_cooldown_ms=60000, logger=None) as client:
        with pytest.raises(llmretry.CircuitOpenError) as info:
            client.call_llm(BODY)
        assert info.value.attempts == 0
        assert len(mock.requests("down")) == 3
        stats = client.endpoint_stats()[0]
        assert stats["breaker"] == "open" and stats["window_requests"] == 3


def test_redis_killed_mid_batch(redis: RedisServer, mock: MockServer) -> None:
    # A batch paced through Redis (50 a second); Redis is killed after 20
    # items and brought back after 40: every item succeeds within its
    # deadline, and the change is reported once each way.
    mock.script("kill", [])
    events = Events()
    client = llmretry.Client(base_url=mock.scenario_url("kill"), shared=patient(redis), rpm=3000,
                             deadline_ms=8000, logger=events)
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(client.call_many([BODY] * 100, limit=16)))
    t.start()
    for n, act in ((20, redis.kill), (40, redis.restart)):
        while len(mock.requests("kill")) < n and t.is_alive():
            time.sleep(0.005)
        act()
    t.join(30)
    client.close()
    assert out and out[0].summary.ok == 100, out and out[0].summary
    assert len(mock.requests("kill")) == 100
    down, back = events.named("llm_shared_unavailable"), events.named("llm_shared_recovered")
    assert len(down) == 1 and len(back) == 1, [e for e in events.items
                                               if e["event"] in SHARED_EVENTS]
    assert down[0]["shared"] == back[0]["shared"] == patient(redis)
    assert "127.0.0.1" in down[0]["error_message"]
    assert back[0]["down_ms"] >= 0


def test_wrong_password(mock: MockServer) -> None:
    mock.script("pw", [])
    with RedisServer(password="the-right-one") as locked:
        # 2 s to log in: the default 50 ms was missed on a loaded machine
        # (the message was then "no answer", not the refusal).
        spec = f"redis://:NOT-THE-PASSWORD@127.0.0.1:{locked.port}/0?timeout_ms=2000"
        events = Events()
        with llmretry.Client(base_url=mock.scenario_url("pw"), shared=spec, rpm=600,
                             logger=events) as client:
            shown = repr(client)
            for _ in range(3):
                data, meta = client.call_llm(BODY)
            stats = client.endpoint_stats()
    down = events.named("llm_shared_unavailable")
    assert len(down) == 1, events.items
    assert "refused the password" in down[0]["error_message"]
    assert down[0]["shared"] == f"redis://***@127.0.0.1:{locked.port}/0?timeout_ms=2000"
    assert f"shared='redis://***@127.0.0.1:{locked.port}/0?timeout_ms=2000'" in shown
    for text in (shown, json.dumps(events.items), repr(meta), json.dumps(stats, default=str)):
        assert "NOT-THE-PASSWORD" not in text


def test_unreachable_at_start(mock: MockServer) -> None:
    # Nothing listens there: the client is made, its calls go on the local
    # budget at once, and the first says so, once.
    mock.script("gone", [])
    with RedisServer() as gone:
        url = gone.url
    events = Events()
    with llmretry.Client(base_url=mock.scenario_url("gone"), shared=url, rpm=600,
                         logger=events) as client:
        for _ in range(3):
            data, meta = client.call_llm(BODY)
            assert meta.attempts == 1
    down = events.named("llm_shared_unavailable")
    assert len(down) == 1 and "cannot connect" in down[0]["error_message"], events.items


@pytest.mark.parametrize("spec, says", [
    ("redis://:SECRETPW@host:0", "port"),
    ("redis://:SECRETPW@host/one", "database"),
    ("redis://", "no host"),
    ("rediss://:SECRETPW@host", "TLS"),
    ("redis://:SECRETPW@host?db=1", "timeout_ms"),
    ("redis://:SECRETPW@host?timeout_ms=0", "timeout_ms"),
    ("redis://SECRETPW@host", "credentials"),
    ("memcached://:SECRETPW@host", "redis://"),
])
def test_bad_urls_are_refused(spec: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        llmretry.Client(shared=spec)
    assert "shared" in str(info.value) and says in str(info.value)
    assert "SECRETPW" not in str(info.value)


def test_cli_flag(redis: RedisServer, mock: MockServer, tmp_path: Any,
                  capsys: pytest.CaptureFixture[str]) -> None:
    from llmretry import cli
    mock.script("cli", [])
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(BODY) + "\n")
    base = ["batch", str(inp), "-o", str(tmp_path / "o"), "--failures", str(tmp_path / "f"),
            "--base-url", mock.scenario_url("cli")]
    assert cli.main(base + ["--shared", redis.url]) == 0, capsys.readouterr().err
    assert len(mock.requests("cli")) == 1
    capsys.readouterr()
    assert cli.main(base + ["--shared", "redis://:SECRETPW@h:0"]) == 2
    err = capsys.readouterr().err
    assert "shared" in err and "SECRETPW" not in err and "Traceback" not in err, err
    # Redis out of reach: the batch runs, and says so once, even without -v.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(base + ["--shared", f"redis://:SECRETPW@127.0.0.1:{port}/0"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip().startswith("shared")]
    assert len(lines) == 1 and "cannot connect" in lines[0], err
    assert "SECRETPW" not in err
