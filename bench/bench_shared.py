"""Processes on one key against one limit (issue 28): the share of attempts a
provider refuses when N processes each pace themselves (shared=None) or share
one budget (shared="shm:NAME", or "redis://..." through a redis-server on
loopback; "redis1s": the same with ?timeout_ms=1000, a second before Redis
counts as unavailable), and what sharing costs when the limit is far from
binding. "outages": the llm_shared_unavailable events of all processes (each
a time the processes paced alone).

Limited runs: the mock enforces a sliding window (default 50 requests a
second, as a provider enforcing 3,000 a minute in one-second slices) and
states it in its headers; each process runs call_many over its share of the
items with the provider's limit configured (rpm=3000), as a user who read
their limit off the dashboard would. --limit tokens: the mock enforces a
token limit instead (4 tokens a request, the same 50 requests' worth a
second) and each process is configured with it (tpm); --limit none: the
request limit, and the processes configured with nothing (they learn it
from the mock's headers; sharing, from each other's, after a shared slow
start). A process count "2x4" is two groups of
four processes started as two separate pools, standing for two machines
(every process reaches the same Redis). Prints one line per (processes,
mode):

    RESULT procs=8 shared=none limit=requests items=800 ok=800 attempts=1412 refused=612 (43.3 %) \
        used=97.0 % of the limit, 16.5 s

Throughput run (--throughput): one process, call_many of N items at 64 in
flight against the mock without limits, rpm far above what is sent (so the
bucket is taken from every call but never holds one), in alternating rounds
per mode; prints the median calls/s per mode and its ratio to unshared:

    RESULT throughput shared=redis calls/s=1532 (rounds 1510 1532 1600) ratio=0.97 cpu_us=310

(ratio: the median of the same-round ratios to the first mode; cpu_us: the
client process's CPU per call, every thread included).

Usage: python3 bench/bench_shared.py [--procs 1,4,8,16,2x4] [--items-per-proc 100]
       [--rps 50] [--modes none,shm,redis] [--limit requests|tokens|none] [--throughput [--n 3000 --rounds 3]]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import llmretry
from llmretry.testing import MockServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
from redis_server import RedisServer  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Outages:
    """A logger counting the shared store's outages (the engine builds no
    other event for it)."""

    def __init__(self) -> None:
        self.n = 0
        bits = [i for i, name in enumerate(llmretry._llmretry.EVENT_NAMES)
                if name == "llm_shared_unavailable"]
        self.event_mask = lambda: sum(1 << i for i in bits)

    def __call__(self, ev: Dict[str, Any]) -> None:
        self.n += ev.get("event") == "llm_shared_unavailable"


# A request's tokens, as the mock charges them and the client estimates them:
# ceil(2 characters / 4) of prompt + max_tokens 3.
TOKENS = 4


def worker(url: str, n: int, rpm: int, tpm: int, shared: str) -> Dict[str, Any]:
    outages = Outages()
    if tpm:
        # The first token estimate of a process loads tiktoken when it is
        # installed (and, offline, fails to fetch its encoding: about 1 s on
        # this machine) before its first request: start-up, not pacing, kept
        # out of the span as the processes' other start-up is.
        from llmretry._tokens import estimate_tokens
        estimate_tokens(url, json.dumps(BODY).encode())
    with llmretry.Client(base_url=url, shared=shared or None, logger=outages,
                         rpm=rpm, tpm=tpm, max_retries=8, base_delay_ms=200) as client:
        start = time.time()
        out = client.call_many([BODY] * n, limit=16)
        return {"ok": out.summary.ok, "attempts": out.summary.attempts,
                "start": start, "end": time.time(), "outages": outages.n}


def store_for(mode: str, redis: Optional[RedisServer]) -> str:
    if mode == "shm":
        return f"shm:bench-{uuid.uuid4().hex[:10]}"
    if mode == "redis":
        assert redis is not None
        return redis.url
    if mode == "redis1s":               # a second before Redis counts as unavailable
        assert redis is not None
        return redis.url + "?timeout_ms=1000"
    return ""


def forget(shared: str) -> None:
    if shared.startswith("shm:"):
        try:
            os.unlink("/dev/shm/llmretry-" + shared[4:])
        except FileNotFoundError:
            pass


def parse_procs(spec: str) -> Tuple[int, int]:
    """"8" -> one group of 8; "2x4" -> two groups of 4."""
    if "x" in spec:
        groups, each = spec.split("x")
        return int(groups), int(each)
    return 1, int(spec)


def run(layout: str, per: int, rps: int, mode: str, redis: Optional[RedisServer],
        limit: str = "requests") -> str:
    groups, each = parse_procs(layout)
    with MockServer() as mock:
        name = f"lim{groups}x{each}{mode}{limit}"
        if limit == "tokens":
            # Usage as the mock charged it (its default usage says 12 prompt
            # tokens: every call's charge corrected up to 15 would pace at a
            # quarter of the limit).
            mock.script(name, [], after={"usage": {"prompt_tokens": TOKENS - 3,
                                                   "completion_tokens": 3,
                                                   "total_tokens": TOKENS}},
                        limits={"tpm": rps * TOKENS, "window_ms": 1000})
            rpm, tpm = 0, rps * TOKENS * 60
        else:
            mock.script(name, [], limits={"rpm": rps, "window_ms": 1000})
            rpm, tpm = (rps * 60 if limit == "requests" else 0), 0
        url = mock.scenario_url(name)
        shared = store_for(mode, redis)
        ctx = multiprocessing.get_context("spawn")
        outs: List[Dict[str, Any]] = []
        lock = threading.Lock()

        def group() -> None:
            with ctx.Pool(each) as pool:
                got = pool.starmap(worker, [(url, per, rpm, tpm, shared)] * each)
            with lock:
                outs.extend(got)

        t0 = time.monotonic()
        threads = [threading.Thread(target=group) for _ in range(groups)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        forget(shared)
        recs = mock.requests(name)
        refused = sum(1 for r in recs if r.get("rate_limited"))
        ok = sum(o["ok"] for o in outs)
        items = groups * each * per
        # The share of the limit used while the batch ran: from the first
        # process's start to the last one's end (not the processes' start-up).
        span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
        used = 100.0 * ok / (rps * span)
        return (f"RESULT procs={layout} shared={mode} limit={limit} items={items} ok={ok} "
                f"attempts={len(recs)} refused={refused} ({100.0 * refused / len(recs):.1f} %) "
                f"lost={items - ok} used={used:.1f} % of the limit over {span:.1f} s "
                f"({elapsed:.1f} s with start-up) outages={sum(o['outages'] for o in outs)}")


def fast_worker(url: str, n: int, shared: str) -> Tuple[float, float]:
    """call_many of n at 64 in flight, rpm far above what is sent: calls/s,
    and the process's CPU per call (us: every thread, the store's included)."""
    with llmretry.Client(base_url=url, shared=shared or None, logger=None, rpm=10_000_000,
                         max_retries=0) as client:
        client.call_many([BODY] * 64, limit=64)             # connections, the first slice
        t0, c0 = time.perf_counter(), time.process_time()
        out = client.call_many([BODY] * n, limit=64)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert out.summary.ok == n, out.summary
        return n / dt, cpu * 1e6 / n


def throughput(n: int, rounds: int, modes: List[str], redis: Optional[RedisServer]) -> None:
    rates: Dict[str, List[float]] = {m: [] for m in modes}
    cpus: Dict[str, List[float]] = {m: [] for m in modes}
    # The mock serves from this process; the client runs in another, so the
    # two do not share one GIL.
    ctx = multiprocessing.get_context("spawn")
    with MockServer() as mock, ctx.Pool(1) as pool:
        mock.script("fast", [])
        url = mock.scenario_url("fast")
        for _ in range(rounds):
            for mode in modes:
                shared = store_for(mode, redis)
                rate, cpu = pool.apply(fast_worker, (url, n, shared))
                rates[mode].append(rate)
                cpus[mode].append(cpu)
                forget(shared)
    # Rounds run back to back, mode after mode: on a shared machine the
    # same-round ratio is steadier than the ratio of medians.
    for mode in modes:
        ratio = statistics.median(r / b for r, b in zip(rates[mode], rates[modes[0]]))
        print(f"RESULT throughput shared={mode} calls/s={statistics.median(rates[mode]):.0f} "
              f"(rounds {' '.join(f'{r:.0f}' for r in rates[mode])}) ratio={ratio:.2f} "
              f"cpu_us={statistics.median(cpus[mode]):.0f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,4,8,16,2x4")
    ap.add_argument("--items-per-proc", type=int, default=100)
    ap.add_argument("--rps", type=int, default=50)
    ap.add_argument("--modes", default="none,shm,redis")
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", choices=["requests", "tokens", "none"], default="requests",
                    help="what the mock limits and the processes are configured with")
    a = ap.parse_args()
    modes = a.modes.split(",")
    redis = RedisServer().start() if any(m.startswith("redis") for m in modes) else None
    try:
        if a.throughput:
            throughput(a.n, a.rounds, modes, redis)
            return
        for layout in a.procs.split(","):
            for mode in modes:
                print(run(layout, a.items_per_proc, a.rps, mode, redis, a.limit), flush=True)
    finally:
        if redis is not None:
            redis.stop()


if __name__ == "__main__":
    main()
