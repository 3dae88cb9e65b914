"""map_with_concurrency, and the GIL being released while calls wait."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import FAST, SECRET_KEY, Events, Scenario, secret_body


class Tracker:
    """Counts workers running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.started: List[int] = []
        self.finished: List[int] = []
        self.threads: set = set()

    def enter(self, index: int) -> None:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
            self.started.append(index)
            self.threads.add(threading.get_ident())

    def leave(self, index: int) -> None:
        with self.lock:
            self.now -= 1
            self.finished.append(index)


def test_ordered_results_and_limit() -> None:
    tr = Tracker()
    items = list(range(12))

    def worker(item: int, index: int) -> Any:
        assert item == items[index]
        tr.enter(index)
        try:
            time.sleep(0.01 * ((12 - index) % 4 + 2))  # finish out of order
            return item * 10
        finally:
            tr.leave(index)

    t0 = time.monotonic()
    out = llmretry.map_with_concurrency(items, 3, worker)
    took = time.monotonic() - t0
    assert out == [i * 10 for i in items]
    assert tr.max == 3, f"{tr.max} workers ran at once with limit 3"
    assert sorted(tr.finished) == items
    assert len(tr.threads) <= 3
    assert took < 0.42, f"no concurrency: {took:.2f} s (0.42 s sequentially)"


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_limit_respected(limit: int) -> None:
    tr = Tracker()

    def worker(item: int, index: int) -> int:
        tr.enter(index)
        time.sleep(0.02)
        tr.leave(index)
        return index

    out = llmretry.map_with_concurrency(range(10), limit, worker)
    assert out == list(range(10))
    assert tr.max == limit


def test_limit_above_len() -> None:
    out = llmretry.map_with_concurrency(["a", "b"], 64, lambda item, index: (item, index))
    assert out == [("a", 0), ("b", 1)]


def test_empty() -> None:
    calls: List[Any] = []
    assert llmretry.map_with_concurrency([], 4, lambda i, n: calls.append(i)) == []
    assert llmretry.map_with_concurrency(iter(()), 4, lambda i, n: calls.append(i)) == []
    assert calls == []


_CALLER_VAR: "contextvars.ContextVar[str]" = contextvars.ContextVar("test_pool_caller",
                                                                     default="unset")


def test_workers_see_the_callers_context() -> None:
    """Workers run on the pool's threads with the caller's context variables
    (what OpenTelemetry keeps its current span in), each item in its own
    copy: a worker's change is seen by neither the caller nor other items."""
    _CALLER_VAR.set("caller")
    seen: List[Any] = []

    def worker(item: int, i: int) -> str:
        before = _CALLER_VAR.get()
        _CALLER_VAR.set(f"item {i}")
        seen.append(threading.get_ident())
        return before

    out = llmretry.map_with_concurrency(range(20), 4, worker)
    assert list(out) == ["caller"] * 20
    assert _CALLER_VAR.get() == "caller"
    assert threading.get_ident() not in seen     # they did run on other threads


def test_any_iterable() -> None:
    gen = (x * x for x in range(5))
    assert llmretry.map_with_concurrency(gen, 2, lambda item, i: item + i) == [
        0, 2, 6, 12, 20]


def test_return_exceptions() -> None:
    boom = {3: ValueError("three"), 6: KeyError("six")}

    def worker(item: int, index: int) -> int:
        if index in boom:
            raise boom[index]
        return item

    out = llmretry.map_with_concurrency(range(8), 3, worker, return_exceptions=True)
    assert len(out) == 8
    for i, v in enumerate(out):
        if i in boom:
            assert v is boom[i]
        else:
            assert v == i


def test_first_failure_stops_new_starts() -> None:
    """Item 0 fails while item 1 runs: 1 finishes, nothing else starts."""
    tr = Tracker()
    one_started = threading.Event()
    failure = RuntimeError("item 0 failed")

    def worker(item: int, index: int) -> int:
        tr.enter(index)
        try:
            if index == 0:
                assert one_started.wait(10)
                raise failure
            if index == 1:
                one_started.set()
                time.sleep(0.3)  # still running when item 0 fails
            return index
        finally:
            tr.leave(index)

    with pytest.raises(RuntimeError) as info:
        llmretry.map_with_concurrency(range(10), 2, worker)
    assert info.value is failure
    assert sorted(tr.started) == [0, 1], f"started after the failure: {tr.started}"
    assert sorted(tr.finished) == [0, 1], "the running item must finish before the raise"
    assert tr.now == 0


def test_failure_with_limit_one_stops_at_once() -> None:
    seen: List[int] = []

    def worker(item: int, index: int) -> int:
        seen.append(index)
        if index == 2:
            raise ValueError("two")
        return index

    with pytest.raises(ValueError, match="two"):
        llmretry.map_with_concurrency(range(10), 1, worker)
    assert seen == [0, 1, 2]


def test_worker_base_exceptions_propagate() -> None:
    class Stop(BaseException):
        pass

    def worker(item: int, index: int) -> int:
        if index == 1:
            raise Stop()
        return index

    with pytest.raises(Stop):
        llmretry.map_with_concurrency(range(3), 1, worker)


def test_calls_inside_workers(scen: Scenario) -> None:
    scen.script([], after={"delay_ms": 200})
    tr = Tracker()
    per_item: Dict[int, Any] = {}

    def worker(item: str, index: int) -> str:
        tr.enter(index)
        try:
            events = Events()
            res = llmretry.call_llm(secret_body(item), base_url=scen.url, api_key=SECRET_KEY,
                                    logger=events, **FAST)
            per_item[index] = (threading.get_ident(), events)
            return res.meta.request_id
        finally:
            tr.leave(index)

    items = [f"item{i}" for i in range(8)]
    t0 = time.monotonic()
    ids = llmretry.map_with_concurrency(items, 4, worker)
    took = time.monotonic() - t0
    assert len(set(ids)) == 8
    assert tr.max == 4
    assert took < 8 * 0.2 * 0.75, f"8 calls of 200 ms with limit 4 took {took:.2f} s"
    for ident, events in per_item.values():
        assert set(events.threads) == {ident}, "events must arrive on the worker's thread"
    assert len(scen.requests()) == 8


def test_client_map_with_concurrency(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    try:
        out = c.map_with_concurrency(range(4), 2,
                                     lambda item, i: c.call_llm({"model": "m", "n": item}
                                                                ).meta.status)
    finally:
        c.close()
    assert out == [200] * 4


@pytest.mark.slow
def test_gil_released_while_waiting(scen: Scenario) -> None:
    """16 threads x a 300 ms answer finish far sooner than 16 x 300 ms."""
    scen.script([], after={"delay_ms": 300})
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    errors: List[BaseException] = []
    statuses: List[int] = []
    start = threading.Barrier(17)

    def worker() -> None:
        try:
            start.wait(10)
            statuses.append(c.call_llm(secret_body("gil")).meta.status)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        start.wait(10)
        t0 = time.monotonic()
        for t in threads:
            t.join(30)
        took = time.monotonic() - t0
    finally:
        c.close()
    assert not errors, errors
    assert statuses == [200] * 16
    assert 0.29 <= took < 2.5, f"16 concurrent 300 ms calls took {took:.2f} s"
    assert len(scen.requests()) == 16


def test_python_threads_run_during_a_call(scen: Scenario) -> None:
    """A pure-Python thread keeps making progress while a call waits."""
    scen.script([{"delay_ms": 500}])
    stop = threading.Event()
    ticks = [0]

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = ticks[0]
        llmretry.call_llm(secret_body("spin"), base_url=scen.url, api_key=SECRET_KEY,
                          logger=None, **FAST)
        during = ticks[0] - before
    finally:
        stop.set()
        t.join(5)
    assert during >= 50, f"only {during} ticks during a 500 ms call"


def test_concurrent_calls_on_a_fresh_client_go_out_at_once(scen: Scenario) -> None:
    """A batch on a new client must not queue behind the first response.

    Four calls of a 1 s answer at limit 4: all four requests should reach
    the server together (not one, then three once it has answered, as when
    the engine waits to learn whether the first connection can multiplex).
    """
    scen.script([], after={"delay_ms": 1000})
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, logger=None)
    try:
        t0 = time.monotonic()
        out = c.map_with_concurrency(range(4), 4,
                                     lambda item, i: c.call_llm(secret_body("cold")).meta.status)
        took = time.monotonic() - t0
    finally:
        c.close()
    assert out == [200] * 4
    times = sorted(r["time"] for r in scen.requests())
    assert len(times) == 4
    spread = times[-1] - times[0]
    assert spread < 0.5, (f"the 4 requests reached the server over {spread:.2f} s "
                          f"(took {took:.2f} s): concurrent calls were serialised")
    assert took < 1.8, f"4 concurrent 1 s calls took {took:.2f} s"
