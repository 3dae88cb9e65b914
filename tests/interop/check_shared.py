"""One budget across processes (docs/shared.md) against a limiter nobody
here wrote: LiteLLM's proxy holding a model to 240 requests a minute (its
rpm, counted by the proxy; its answers say x-ratelimit-limit-requests), and
four processes each running call_many of 75 items with rpm=240, the
provider's limit as each is told it.

- Each alone: together they send four times the limit, and the proxy
  refuses some (the premise: a check that cannot fail otherwise).
- Through an shm store, then through a redis-server started here: they pace
  the limit together; none refused, none lost.

Each run has a model of its own (fake-shared-none, -shm, -redis), so that one
run's minute of counts does not meet the next. About 4 minutes (the run
alone waits for a minute to begin: the proxy counts calendar minutes). Run by
tools/interop.sh (``make interop``); each check prints one line; exits 1 when
any fails.

Usage: check_shared.py LITELLM_BASE_URL
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import uuid
from typing import List, Optional, Tuple

import llmretry
from interop_util import Checks

# The suites' throwaway redis-server.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from redis_server import RedisServer  # noqa: E402

KEY = "sk-1234"
PROCESSES, ITEMS, RPM = 4, 75, 240


def one_process(args: Tuple[str, Optional[str], str, int]) -> Tuple[int, int, int, List[str]]:
    """In a process of its own: its batch's ok, attempts and retries, and
    what it lost."""
    base_url, shared, model, index = args
    options: dict = {"base_url": base_url, "api_key": KEY, "logger": None, "rpm": RPM}
    if shared:
        options["shared"] = shared
    with llmretry.Client(**options) as client:
        bodies = [{"model": model, "messages": [{"role": "user", "content": f"p{index}-{i}"}]}
                  for i in range(ITEMS)]
        out = client.call_many(bodies, limit=4)
    lost = [repr(v)[:160] for v in out if not isinstance(v, llmretry.Result)]
    s = out.summary
    return s.ok, s.attempts, s.retries, lost


def run(base_url: str, shared: Optional[str], model: str) -> Tuple[int, int, int, List[str], float]:
    t0 = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        outs = pool.map(one_process, [(base_url, shared, model, i) for i in range(PROCESSES)])
    ok, attempts, retries = (sum(o[k] for o in outs) for k in range(3))
    lost = [x for o in outs for x in o[3]]
    return ok, attempts, retries, lost, time.monotonic() - t0


def main(base_url: str) -> int:
    checks = Checks()
    items = PROCESSES * ITEMS

    def alone() -> str:
        # LiteLLM counts each calendar minute apart: a run of ~20 s across a
        # minute's turn could stay under the limit in both. Started as a
        # minute begins, the four send their 300 within it.
        time.sleep(60.5 - time.time() % 60)
        ok, attempts, retries, lost, secs = run(base_url, None, "fake-shared-none")
        assert retries > 0, f"the premise: {PROCESSES} processes alone were never refused"
        return (f"{ok} of {items} ok, {retries} of {attempts} attempts refused "
                f"({retries / attempts:.0%}), {secs:.0f} s")

    def shared(spec: str, model: str) -> str:
        ok, attempts, retries, lost, secs = run(base_url, spec, model)
        assert ok == items and not lost, f"{ok} of {items} ok; {lost[:2]}"
        assert retries == 0, f"{retries} of {attempts} attempts refused"
        return f"{ok} of {items} ok, 0 of {attempts} attempts refused, {secs:.0f} s"

    def through_shm() -> str:
        name = f"interop-{uuid.uuid4().hex[:12]}"
        try:
            return shared(f"shm:{name}", "fake-shared-shm")
        finally:
            try:
                os.unlink(f"/dev/shm/llmretry-{name}")
            except FileNotFoundError:
                pass

    def through_redis() -> str:
        with RedisServer() as redis:
            return shared(redis.url, "fake-shared-redis")

    checks.check(f"{PROCESSES} processes alone at the proxy's rpm {RPM}", alone)
    checks.check(f"{PROCESSES} processes through an shm store", through_shm)
    checks.check(f"{PROCESSES} processes through Redis", through_redis)
    return checks.summary("shared budgets against LiteLLM")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
