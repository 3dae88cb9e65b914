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
from conftest import wait_until

import llmretry
from llmretry.testing import MockServer
from redis_server import RedisServer
# The same three 503s in a process of its own; a store in /dev/shm.
from test_shared import _open_the_breaker, shm_store

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


# A store of either kind (the tests that hold for both).
@pytest.fixture(params=["shm", "redis"])
def store(request: pytest.FixtureRequest, redis: RedisServer) -> Iterator[str]:
    if request.param == "redis":
        yield patient(redis)
        return
    with shm_store("test-py-limits") as spec:
        yield spec


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


def _batches_at_once(clients: List[Any], n: int, limit: int) -> List[Any]:
    """A call_many of n bodies on each client, all in threads at once; the
    clients closed after. The batches' results, in the clients' order."""
    outs: List[Any] = [None] * len(clients)

    def run(i: int) -> None:
        outs[i] = clients[i].call_many([BODY] * n, limit=limit)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    return outs


def test_two_clients_share_a_rate_limit(redis: RedisServer, mock: MockServer) -> None:
    # A provider's 1,200 a minute enforced in any second (20), and two
    # clients each configured with it: through Redis they send 20 a second
    # together (each alone would send 20: about half refused).
    mock.script("lim", [], limits={"rpm": 20, "window_ms": 1000})
    url = mock.scenario_url("lim")
    clients = [llmretry.Client(base_url=url, shared=patient(redis), rpm=1200, max_retries=5,
                               logger=None) for _ in range(2)]
    outs = _batches_at_once(clients, 15, 8)
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


def test_a_breaker_opened_in_another_process(store: str, mock: MockServer) -> None:
    """The other process's failures opened it here too (shm and Redis): the
    call fails at once and nothing reaches the server."""
    mock.script("down", [], after={"status": 503})
    url = mock.scenario_url("down")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_open_the_breaker, (url, store)) == 3
    with llmretry.Client(base_url=url, shared=store, max_retries=0, breaker_failures=3,
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


# ---- what processes say of the limits (docs/shared.md), through either store ----

_poll = wait_until          # conftest's poll


def test_the_stricter_limit_wins(store: str, mock: MockServer) -> None:
    # The provider allows 20 a second; one client says so (rpm=1200), the
    # other says ten times as much. Sharing the endpoint, both pace at the
    # stricter: paced at its own 12,000 a minute the second would send its
    # calls in a burst and see most of them refused.
    mock.script("strict", [], limits={"rpm": 20, "window_ms": 1000, "rate_headers": False})
    url = mock.scenario_url("strict")
    a = llmretry.Client(base_url=url, shared=store, rpm=1200, max_retries=5, logger=None)
    b = llmretry.Client(base_url=url, shared=store, rpm=12000, max_retries=5, logger=None)
    try:
        a.call_llm(BODY)
        b.call_llm(BODY)
        # a's claim is in force for b (through Redis: within a round trip).
        assert _poll(lambda: b.endpoint_stats()[0]["rpm"] == 1200), b.endpoint_stats()
        outs: List[Any] = [None, None]

        def run(i: int, client: llmretry.Client) -> None:
            outs[i] = client.call_many([BODY] * 12, limit=8)

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        a.close()
        b.close()
    assert [o.summary.ok for o in outs] == [12, 12]
    stats = mock.limit_stats("strict")
    assert stats is not None and stats["admitted"] == 26
    assert stats["refused"] <= 1, stats


def test_a_limit_learned_by_one_client_paces_another(store: str, mock: MockServer) -> None:
    # One client's answer says the limit (10 a second); the other, with
    # nothing configured and no answer of its own yet, paces by it instead
    # of sending its 12 calls at once (3 or more refused).
    mock.script("learned", [], limits={"rpm": 10, "window_ms": 1000})
    url = mock.scenario_url("learned")
    with llmretry.Client(base_url=url, shared=store, logger=None) as a, \
            llmretry.Client(base_url=url, shared=store, max_retries=5, logger=None) as b:
        a.call_llm(BODY)
        if store.startswith("redis"):
            assert _poll(lambda: redis_has(store, "a2", "600"))
        out = b.call_many([BODY] * 12, limit=12)
    assert out.summary.ok == 12
    stats = mock.limit_stats("learned")
    assert stats is not None and stats["refused"] <= 1, stats


def redis_has(url: str, field: str, value: str) -> bool:
    """Whether some endpoint's hash in the Redis of `url` holds field = value."""
    return value in redis_fields(url, field)


def redis_fields(url: str, field: str) -> List[Any]:
    """`field` of every endpoint's hash in the Redis of `url` (None: unset)."""
    port = int(url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        f = s.makefile("rwb")

        def command(*args: str) -> Any:
            f.write(f"*{len(args)}\r\n".encode() + b"".join(
                f"${len(a)}\r\n{a}\r\n".encode() for a in args))
            f.flush()
            return read()

        def read() -> Any:
            line = f.readline().rstrip(b"\r\n")
            kind, rest = line[:1], line[1:]
            if kind == b"*":
                return [read() for _ in range(int(rest))]
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2].decode()
            return rest.decode()

        keys = command("KEYS", "llmretry:1:*")
        return [command("HGET", k, field) for k in keys]


@pytest.mark.parametrize("which", ["requests", "tokens"])
def test_what_remains_holds_every_client(store: str, mock: MockServer, which: str) -> None:
    # One client's answer says none of the limit is left until it resets in
    # 5 s; the other, which knows nothing of it, does not send before then:
    # its call (1 s deadline) ends at the deadline with no attempt made.
    # (Each on its own budget, the second sends at once and is served.)
    mock.script("hold", [{"headers": {f"x-ratelimit-remaining-{which}": "0",
                                      f"x-ratelimit-reset-{which}": "5s"}}], after={})
    url = mock.scenario_url("hold")
    with llmretry.Client(base_url=url, shared=store, logger=None) as a, \
            llmretry.Client(base_url=url, shared=store, deadline_ms=1000, max_retries=0,
                            logger=None) as b:
        held = sum(v is not None for v in redis_fields(store, "pz")) if "redis" in store else 0
        a.call_llm(BODY)
        if store.startswith("redis"):       # a's hold has reached Redis
            assert _poll(lambda: sum(v is not None for v in redis_fields(store, "pz")) > held)
        with pytest.raises(llmretry.DeadlineExceededError) as info:
            b.call_llm(BODY)
        assert info.value.attempts == 0
    assert len(mock.requests("hold")) == 1


def test_a_shared_slow_start(store: str, mock: MockServer) -> None:
    # Two clients, nothing configured or known of the limit, 20 calls each
    # at once against a server answering in 600 ms: together at most 16 go
    # before the first answer (without a shared slow start, all 40).
    mock.script("start", [], after={"delay_ms": 600})
    url = mock.scenario_url("start")
    clients = [llmretry.Client(base_url=url, shared=store, logger=None) for _ in range(2)]
    outs = _batches_at_once(clients, 20, 20)
    assert [o.summary.ok for o in outs] == [20, 20]
    times = sorted(r["time"] for r in mock.requests("start"))     # handled in any order
    early = sum(1 for t in times if t < times[0] + 0.4)
    assert len(times) == 40 and 1 <= early <= 16, (early, len(times))
