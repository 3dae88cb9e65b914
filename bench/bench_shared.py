"""Processes on one key against one limit (issue 28): the share of attempts a
provider refuses when N processes each pace themselves (shared=None) or share
one budget (shared="shm:NAME").

The mock enforces a sliding window (default 50 requests a second, as a provider
enforcing 3,000 a minute in one-second slices) and states it in its headers;
each process runs call_many over its share of the items with the provider's
limit configured (rpm=3000), as a user who read their limit off the
dashboard would. Prints one line per (processes, mode):

    RESULT procs=8 shared=none items=800 ok=800 attempts=1412 refused=612 (43.3 %) \
        used=97.0 % of the limit, 16.5 s

Usage: python3 bench/bench_shared.py [--procs 1,4,8,16] [--items-per-proc 100]
       [--rps 50] [--modes none,shm]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import uuid
from typing import Any, Dict, List

import llmretry
from llmretry.testing import MockServer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def worker(url: str, n: int, rpm: int, shared: str) -> Dict[str, Any]:
    with llmretry.Client(base_url=url, shared=shared or None, logger=None,
                         rpm=rpm, max_retries=8, base_delay_ms=200) as client:
        start = time.time()
        out = client.call_many([BODY] * n, limit=16)
        return {"ok": out.summary.ok, "attempts": out.summary.attempts,
                "start": start, "end": time.time()}


def run(procs: int, per: int, rps: int, mode: str) -> str:
    with MockServer() as mock:
        name = f"lim{procs}{mode}"
        mock.script(name, [], limits={"rpm": rps, "window_ms": 1000})
        url = mock.scenario_url(name)
        shared = f"shm:bench-{uuid.uuid4().hex[:10]}" if mode == "shm" else ""
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(procs) as pool:
            t0 = time.monotonic()
            outs: List[Dict[str, Any]] = pool.starmap(
                worker, [(url, per, rps * 60, shared)] * procs)
            elapsed = time.monotonic() - t0
        if shared:
            try:
                os.unlink("/dev/shm/llmretry-" + shared[4:])
            except FileNotFoundError:
                pass
        recs = mock.requests(name)
        refused = sum(1 for r in recs if r.get("rate_limited"))
        ok = sum(o["ok"] for o in outs)
        items = procs * per
        # The share of the limit used while the batch ran: from the first
        # process's start to the last one's end (not the processes' start-up).
        span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
        used = 100.0 * ok / (rps * span)
        return (f"RESULT procs={procs} shared={mode} items={items} ok={ok} "
                f"attempts={len(recs)} refused={refused} ({100.0 * refused / len(recs):.1f} %) "
                f"used={used:.1f} % of the limit over {span:.1f} s ({elapsed:.1f} s with start-up)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,4,8,16")
    ap.add_argument("--items-per-proc", type=int, default=100)
    ap.add_argument("--rps", type=int, default=50)
    ap.add_argument("--modes", default="none,shm")
    a = ap.parse_args()
    for procs in [int(p) for p in a.procs.split(",")]:
        for mode in a.modes.split(","):
            print(run(procs, a.items_per_proc, a.rps, mode), flush=True)


if __name__ == "__main__":
    main()
