"""asyncio surface (issue 17): acall_llm, astream_llm, acall_many,
amap_with_concurrency on the client's engine, one channel per loop."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Set

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, child_env

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-aio"}]}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def external_mock() -> Iterator[str]:
    """A mock in its own process: this process's threads are only ours."""
    proc = subprocess.Popen([sys.executable, "-m", "llmretry.testing", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _put(base: str, name: str, steps: List[Dict[str, Any]],
         after: Any = None) -> str:
    import urllib.request
    script: Dict[str, Any] = {"steps": steps}
    if after is not None:
        script["after"] = after
    req = urllib.request.Request(f"{base}/_mock/scenarios/{name}", method="PUT",
                                 data=json.dumps(script).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
    return f"{base}/s/{name}/v1"


def _os_threads() -> Set[str]:
    """The ids of this process's threads now. Compared as sets, not counted:
    a thread another test left behind may end meanwhile (seen under xdist),
    and a count would then hide a new one."""
    return set(os.listdir("/proc/self/task"))


class HangingServer:
    """Accepts connections, reads the request and never answers; records
    when each client closes its connection (recv gives EOF)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.accepted = 0
        self.received = 0       # connections whose request bytes came in
        self.closed_at: List[float] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        first = True
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if data and first:
                    first = False
                    with self._lock:
                        self.received += 1
                if not data:
                    with self._lock:
                        self.closed_at.append(time.monotonic())
                    return

    def wait_closed(self, n: int, timeout: float = 5.0) -> bool:
        return self.wait(lambda: len(self.closed_at) >= n, timeout)

    def wait(self, cond: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Poll cond (under the lock) until it holds or timeout passes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if cond():
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------------
# One call

def test_acall_llm_gives_the_result_and_its_events_on_the_loop_thread(scen: Any) -> None:
    scen.script([{"status": 503}, {"content": "hello"}])
    events: List[Dict[str, Any]] = []
    threads: List[int] = []

    def logger(ev: Dict[str, Any]) -> None:
        events.append(ev)
        threads.append(threading.get_ident())

    async def main() -> Any:
        res = await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                       logger=logger, **FAST)
        return res, threading.get_ident()

    res, loop_thread = run(main())
    assert res.data["choices"][0]["message"]["content"] == "hello"
    assert res.meta.attempts == 2
    names = [e["event"] for e in events]
    assert names == ["llm_request_started", "llm_request_failed", "llm_retry_scheduled",
                     "llm_request_started", "llm_request_succeeded"]
    assert set(threads) == {loop_thread}
    assert SECRET_KEY not in repr(res) and "SECRET-PROMPT" not in repr(res)


def test_acall_llm_raises_the_typed_error_with_its_request_id(scen: Any) -> None:
    scen.script([], after={"status": 400, "error_code": "bad"})

    async def main() -> None:
        await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY, logger=None,
                                 request_id="rid-aio-1", **FAST)

    with pytest.raises(llmretry.HTTPStatusError) as ei:
        run(main())
    assert ei.value.status == 400 and ei.value.request_id == "rid-aio-1"
    assert SECRET_KEY not in str(ei.value)


def test_acall_llm_checks_its_arguments_before_any_io(scen: Any) -> None:
    async def main() -> None:
        await llmretry.acall_llm(BODY, base_url=scen.url, max_retries="3")

    with pytest.raises(TypeError, match="max_retries"):
        run(main())

    async def unknown() -> None:
        await llmretry.acall_llm(BODY, base_url=scen.url, max_retry=3)

    with pytest.raises(TypeError, match="max_retry"):
        run(unknown())
    assert scen.requests() == []


def test_a_validator_runs_on_the_loop_thread_and_its_verdict_retries(scen: Any) -> None:
    scen.script([{"content": "bad"}, {"content": "good"}])
    seen: List[int] = []

    def validate(data: Any) -> bool:
        seen.append(threading.get_ident())
        return bool(data["choices"][0]["message"]["content"] == "good")

    async def main() -> Any:
        return (await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                         logger=None, validate=validate,
                                         retry_invalid_response=True, **FAST),
                threading.get_ident())

    res, loop_thread = run(main())
    assert res.meta.attempts == 2 and set(seen) == {loop_thread}


def test_300_calls_of_300_ms_overlap_with_no_thread_per_call(external_mock: str) -> None:
    url = _put(external_mock, "slow300", [], after={"delay_ms": 300})
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, max_in_flight=512)
    counts: List[int] = []

    async def main() -> float:
        await client.acall_llm(BODY, base_url=url)      # the engine's thread is up
        before = _os_threads()
        t0 = time.monotonic()
        calls = [asyncio.ensure_future(client.acall_llm(BODY, base_url=url))
                 for _ in range(300)]
        await asyncio.sleep(0.1)    # a window for threads that must not start
        counts.append(len(_os_threads() - before))   # threads started since
        results = await asyncio.gather(*calls)
        assert all(r.meta.status == 200 for r in results)
        return time.monotonic() - t0

    try:
        secs = run(main())
    finally:
        client.close()
    # One after another they would take 90 s; at once, about 0.3 s (the
    # mock's threads are in its own process: none of these is ours). The
    # bound leaves room for a loaded machine (the suite runs 4 workers on 2
    # cores: 3 s was missed) and still fails for calls that do not overlap.
    assert secs < 20.0, secs
    assert counts == [0]


def test_the_loop_is_never_blocked_during_retries_and_backoff(scen: Any) -> None:
    scen.script([{"status": 503, "delay_ms": 250}, {"status": 503, "delay_ms": 250},
                 {"delay_ms": 250}])
    ticks: List[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main() -> Any:
        t = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        t0 = time.monotonic()
        res = await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                       logger=None, timeout_ms=5000, max_retries=3,
                                       base_delay_ms=250, max_delay_ms=250, jitter="none")
        t.cancel()
        return res, time.monotonic() - t0

    res, secs = run(main())
    assert res.meta.attempts == 3
    assert secs >= 1.25                      # 3 × 250 ms answers + 2 × 250 ms backoff
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) >= secs / 0.01 * 0.5, (len(ticks), secs)
    # A loop blocked by an answer's wait or a backoff misses 250 ms of ticks;
    # a loaded machine delays a 10 ms tick by up to ~100 ms (seen at load 16).
    assert max(gaps) < 0.2, max(gaps)


# ---------------------------------------------------------------------------
# Cancellation at every stage

def test_cancelling_an_attempt_in_flight_closes_the_connection_at_once() -> None:
    hang = HangingServer()
    events: List[Dict[str, Any]] = []

    async def main() -> float:
        task = asyncio.ensure_future(llmretry.acall_llm(
            BODY, base_url=hang.url, api_key=SECRET_KEY, logger=events.append,
            timeout_ms=30000, max_retries=0))
        while hang.received < 1:            # the request is out: an attempt in flight
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert hang.wait_closed(1, 2.0)
        end = time.monotonic() + 10         # the call's last event comes on the loop
        while not (events and events[-1]["event"] == "llm_request_gave_up") and \
                time.monotonic() < end:
            await asyncio.sleep(0.01)
        return hang.closed_at[0] - t0

    try:
        closed_after = run(main())
    finally:
        hang.close()
    assert closed_after < 0.5
    assert events[-1]["event"] == "llm_request_gave_up" and events[-1]["reason"] == "cancelled"


def test_asyncio_timeout_cancels_a_backoff_wait(scen: Any) -> None:
    scen.script([{"status": 503}], after={"content": "late"})

    async def main() -> float:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                         logger=None, max_retries=3, base_delay_ms=5000,
                                         max_delay_ms=5000, jitter="none")
        return time.monotonic() - t0

    secs = run(main())
    assert secs < 1.0
    time.sleep(0.2)     # a look for a request that must not come: only time can show it
    assert len(scen.requests()) == 1      # the retry after the backoff never went


def test_cancelling_a_call_queued_for_a_slot_never_sends_it() -> None:
    hang = HangingServer()
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, max_in_flight=1,
                             timeout_ms=30000, max_retries=0)

    async def main() -> None:
        first = asyncio.ensure_future(client.acall_llm(BODY, base_url=hang.url))
        queued = asyncio.ensure_future(client.acall_llm(BODY, base_url=hang.url))
        while hang.accepted < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)    # the second waits for the slot: nothing shows it
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert hang.wait_closed(1, 2.0)
        await asyncio.sleep(0.2)    # a look for a connection that must not come

    try:
        run(main())
        assert hang.accepted == 1       # the queued call never connected
    finally:
        client.close()
        hang.close()


def test_a_loop_closed_with_calls_in_flight_leaves_them_cancelled() -> None:
    hang = HangingServer()
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, timeout_ms=30000,
                             max_retries=0)
    loop = asyncio.new_event_loop()
    try:
        tasks = [loop.create_task(client.acall_llm(BODY, base_url=hang.url))
                 for _ in range(5)]

        async def all_sent() -> None:       # the loop runs while the calls go out
            end = time.monotonic() + 10
            while hang.received < 5 and time.monotonic() < end:
                await asyncio.sleep(0.01)
        loop.run_until_complete(all_sent())
        assert hang.accepted == 5
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    finally:
        loop.close()
    assert hang.wait_closed(5, 3.0)
    # The client still works on a new loop.
    try:
        with pytest.raises(llmretry.LLMError):
            run(client.acall_llm(BODY, base_url="http://127.0.0.1:9/v1", timeout_ms=500))
    finally:
        client.close()
        hang.close()


# ---------------------------------------------------------------------------
# Several loops, one client

def test_loops_in_two_threads_share_a_client_and_never_take_each_others_calls(
        scen: Any) -> None:
    scen.script([], after={"delay_ms": 20})
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url)
    out: Dict[str, List[str]] = {}

    def loop_thread(name: str) -> None:
        async def main() -> List[str]:
            rs = await asyncio.gather(*[client.acall_llm(BODY, request_id=f"{name}-{i}")
                                        for i in range(40)])
            return [r.meta.request_id for r in rs]
        out[name] = asyncio.run(main())

    try:
        ts = [threading.Thread(target=loop_thread, args=(n,)) for n in ("a", "b")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
    finally:
        client.close()
    assert out["a"] == [f"a-{i}" for i in range(40)]
    assert out["b"] == [f"b-{i}" for i in range(40)]


# ---------------------------------------------------------------------------
# Streams

def test_astream_llm_yields_chunks_then_the_assembled_result(scen: Any) -> None:
    scen.script([{"stream": {"chunks": 5, "delay_ms": 10}, "content": "hello world"}])

    async def main() -> Any:
        texts = []
        async with llmretry.astream_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                        logger=None, **FAST) as s:
            async for text in s.text_deltas():
                texts.append(text)
            res = await s.result()
        return texts, res, s

    texts, res, s = run(main())
    assert "".join(texts) == "hello world" and len(texts) == 5
    assert res.data["choices"][0]["message"]["content"] == "hello world"
    assert res.meta.stream is True and s.chunks_read >= 5
    assert "SECRET" not in repr(s)


def test_astream_interrupted_after_a_chunk_raises_stream_interrupted(scen: Any) -> None:
    scen.script([{"stream": {"chunks": 4, "end": "drop", "after": 2, "delay_ms": 100},
                  "content": "abcd"}])

    async def main() -> List[str]:
        got: List[str] = []
        async with llmretry.astream_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                        logger=None, **FAST) as s:
            async for text in s.text_deltas():
                got.append(text)
        return got

    with pytest.raises(llmretry.StreamInterruptedError) as ei:
        run(main())
    assert ei.value.chunks_delivered >= 1
    assert len(scen.requests()) == 1          # nothing retried after the commit point


def test_leaving_an_astream_early_closes_the_connection(scen: Any) -> None:
    scen.script([{"stream": {"chunks": 50, "delay_ms": 50}, "content": "x" * 50}])

    async def main() -> None:
        async with llmretry.astream_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                        logger=None, **FAST) as s:
            async for _chunk in s:
                break

    run(main())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not scen.requests()[0].get("client_gone"):
        time.sleep(0.05)
    rec = scen.requests()[0]
    assert rec["client_gone"] is True and rec["events_sent"] < 50


# ---------------------------------------------------------------------------
# Batches

def test_acall_many_keeps_order_failures_in_place_and_a_failures_file(
        scen: Any, tmp_path: Any) -> None:
    scen.script([], after={"delay_ms": 5})
    bad = scen.server.scenario_url(scen.name + "_bad")
    scen.server.script(scen.name + "_bad", [], {"status": 400, "error_code": "bad"})
    bodies = [dict(BODY, model=f"m{i}") for i in range(30)]
    ticks: List[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def main() -> Any:
        t = asyncio.ensure_future(ticker())
        ok = await llmretry.acall_many(bodies, limit=4, base_url=scen.url, api_key=SECRET_KEY,
                                       logger=None, **FAST)
        failed = await llmretry.acall_many(bodies[:3], limit=2, base_url=bad,
                                           api_key=SECRET_KEY, logger=None,
                                           failures_path=str(tmp_path / "f.jsonl"), **FAST)
        t.cancel()
        return ok, failed

    ok, failed = run(main())
    assert [r.data["model"] for r in ok] == [f"m{i}" for i in range(30)]
    assert ok.summary.ok == 30 and ok.summary.total_tokens == 30 * 15
    assert all(isinstance(e, llmretry.HTTPStatusError) for e in failed)
    lines = (tmp_path / "f.jsonl").read_text().splitlines()
    assert len(lines) == 3 and SECRET_KEY not in "".join(lines)
    assert len(ticks) > 5                   # the loop ran meanwhile


def test_cancelling_acall_many_cancels_its_calls_and_keeps_the_record(
        scen: Any, tmp_path: Any) -> None:
    hang = HangingServer()
    path = tmp_path / "failed.jsonl"

    async def main() -> None:
        task = asyncio.ensure_future(llmretry.acall_many(
            [BODY] * 10, limit=3, base_url=hang.url, api_key=SECRET_KEY, logger=None,
            timeout_ms=30000, max_retries=0, failures_path=str(path)))
        while hang.accepted < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        run(main())
        assert hang.wait_closed(3, 3.0)
        assert hang.accepted == 3           # the rest never started
    finally:
        hang.close()
    # The record says nothing finished: resuming runs all ten.
    again = run(llmretry.acall_many([BODY] * 10, limit=3, base_url=scen.url,
                                    api_key=SECRET_KEY, logger=None, failures_path=str(path),
                                    resume=True, **FAST))
    assert again.summary.ok == 10 and len(scen.requests()) == 10


def test_amap_pauses_new_calls_on_a_429_with_retry_after(scen: Any) -> None:
    scen.script([{"status": 429, "retry_after": "1"}], after={"content": "ok"})
    starts: List[float] = []

    async def worker(item: int, i: int) -> int:
        starts.append(time.monotonic())
        res = await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                       logger=None, **FAST)
        return res.meta.attempts

    async def main() -> Any:
        return await llmretry.amap_with_concurrency(range(6), 1, worker, logger=None)

    t0 = time.monotonic()
    out = run(main())
    assert list(out) == [2, 1, 1, 1, 1, 1]
    times = [r["time"] for r in scen.requests()]
    # After the 429 every start waited for its 1 s: the retry and the others.
    assert times[1] - times[0] >= 0.9
    assert out.summary.ok == 6 and out.summary.attempts == 7
    assert time.monotonic() - t0 < 5


def test_amap_return_exceptions_and_first_error(scen: Any) -> None:
    async def worker(item: int, i: int) -> int:
        await asyncio.sleep(0.001)
        if item % 3 == 0:
            raise ValueError(f"no {item}")
        return item * 2

    out = run(llmretry.amap_with_concurrency(range(7), 3, worker, return_exceptions=True,
                                             logger=None))
    assert [type(v).__name__ if isinstance(v, Exception) else v for v in out] == \
        ["ValueError", 2, 4, "ValueError", 8, 10, "ValueError"]
    with pytest.raises(ValueError, match="no 0"):
        run(llmretry.amap_with_concurrency(range(7), 3, worker, logger=None))
    with pytest.raises(TypeError, match="limit"):
        run(llmretry.amap_with_concurrency(range(3), "2", worker))  # type: ignore[arg-type]


def test_amap_deadline_fails_items_not_started_and_bounds_calls(scen: Any) -> None:
    scen.script([], after={"delay_ms": 400})

    async def worker(item: int, i: int) -> Any:
        return (await llmretry.acall_llm(BODY, base_url=scen.url, api_key=SECRET_KEY,
                                         logger=None, timeout_ms=5000, max_retries=0)).meta

    t0 = time.monotonic()
    out = run(llmretry.amap_with_concurrency(range(4), 1, worker, deadline_ms=600,
                                             return_exceptions=True, logger=None))
    assert time.monotonic() - t0 < 1.5
    kinds = [type(v).__name__ for v in out]
    assert kinds[0] == "Meta"
    assert all(k == "DeadlineExceededError" for k in kinds[1:]), kinds


# ---------------------------------------------------------------------------
# Lifecycle

def test_each_asyncio_run_leaves_no_descriptor_open(scen: Any) -> None:
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, base_url=scen.url)
    try:
        run(client.acall_llm(BODY))
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(60):
            run(client.acall_llm(BODY))     # a new loop each time: a new channel
        assert len(os.listdir("/proc/self/fd")) - before <= 2
    finally:
        client.close()
    assert len(os.listdir("/proc/self/fd")) < before


def test_closing_the_client_ends_the_calls_awaited_on_a_loop() -> None:
    hang = HangingServer()
    client = llmretry.Client(api_key=SECRET_KEY, logger=None, timeout_ms=30000,
                             max_retries=0)

    async def main() -> float:
        task = asyncio.ensure_future(client.acall_llm(BODY, base_url=hang.url))
        while hang.accepted < 1:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        client.close()
        with pytest.raises(llmretry.CallCancelledError):
            await asyncio.wait_for(task, 5)
        return time.monotonic() - t0

    try:
        assert run(main()) < 1.0
    finally:
        hang.close()
