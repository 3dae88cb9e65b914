"""What every Python benchmark client shares: the command line, the request,
the timing and the result line of the client contract (bench/clients/README.md).

A client module defines how to make its client and run one batch, then calls
:func:`main`. Everything is measured the same way: ``time.perf_counter`` for
the wall time and ``getrusage(RUSAGE_SELF)`` (every thread of the process)
for the CPU, both over the timed batch only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict

MODEL = "bench-model"
API_KEY = "bench-key"
PROMPT = "Say hi"

# How many failures a client describes on stderr (the rest are only counted).
MAX_REPORTED = 5


@dataclass(frozen=True)
class Args:
    url: str            # BASE, e.g. http://127.0.0.1:18089/v1
    concurrency: int
    requests: int
    warmup: int


def parse_args(description: str) -> Args:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:18089/v1")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--warmup", type=int, default=0)
    a = p.parse_args()
    if a.concurrency < 1 or a.requests < 1 or a.warmup < 0:
        p.error("--concurrency and --requests must be >= 1, --warmup >= 0")
    return Args(a.url.rstrip("/"), a.concurrency, a.requests, a.warmup)


def body() -> Dict[str, Any]:
    """A fresh request body (as application code builds one per call)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}


def raise_nofile(need: int) -> None:
    """Lift the soft open-files limit to the hard one: 1,024 connections
    do not fit under the common default soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < need + 64:
        warn(f"open-files limit {soft} may be too low for {need} connections")


def sdk_limits(n: int) -> Any:
    """A connection-pool size of ``n`` (all kept alive) for the openai SDK's
    http client: ``httpx2.Limits`` for openai >= 3, ``httpx.Limits`` before."""
    try:
        import httpx2 as hx
    except ImportError:
        import httpx as hx  # type: ignore[no-redef]
    return hx.Limits(max_connections=n, max_keepalive_connections=n)


def warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Tally:
    """Counts outcomes; describes the first few failures on stderr.

    Only the exception's type and its first line go out, never a request:
    the clients' error messages do not carry the API key, and the prompt
    is not in them either.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.ok = 0
        self.failed = 0

    def success(self, content: Any) -> None:
        if isinstance(content, str):
            self.ok += 1
        else:
            self.fail(TypeError(f"choices[0].message.content is {type(content).__name__}"))

    def fail(self, exc: BaseException) -> None:
        self.failed += 1
        if self.failed <= MAX_REPORTED:
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            warn(f"{self.name}: request failed: {type(exc).__name__}: {first}")


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def report(ok: int, failed: int, seconds: float, cpu: float) -> None:
    """The contract's result: one JSON object, the last line of stdout."""
    print(json.dumps({"ok": ok, "failed": failed, "seconds": round(seconds, 6),
                      "cpu_seconds": round(cpu, 6)}), flush=True)


Batch = Callable[[int, Tally], None]   # run COUNT requests, counting into the tally


def main(name: str, args: Args, run: Batch) -> int:
    """Warm up (untimed), then time one batch of ``args.requests``."""
    if args.warmup:
        warm = Tally(name + " (warm-up)")
        run(args.warmup, warm)
        if warm.failed:
            warn(f"{name}: {warm.failed} of {args.warmup} warm-up requests failed")
    tally = Tally(name)
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    run(args.requests, tally)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    report(tally.ok, tally.failed, seconds, cpu)
    return 0


AsyncBatch = Callable[[int, Tally], Awaitable[None]]


async def amain(name: str, args: Args, run: AsyncBatch) -> int:
    """:func:`main` for asyncio clients (call it inside the running loop,
    after making the client)."""
    if args.warmup:
        warm = Tally(name + " (warm-up)")
        await run(args.warmup, warm)
        if warm.failed:
            warn(f"{name}: {warm.failed} of {args.warmup} warm-up requests failed")
    tally = Tally(name)
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    await run(args.requests, tally)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    report(tally.ok, tally.failed, seconds, cpu)
    return 0


async def gather_bounded(count: int, limit: int, one: Callable[[], Awaitable[Any]],
                         tally: Tally) -> None:
    """Run ``one()`` ``count`` times, at most ``limit`` at once: the usual
    asyncio pattern (a task per request, a semaphore of ``limit``). ``one``
    returns the response's content; an exception counts as a failure."""
    sem = asyncio.Semaphore(limit)

    async def bounded() -> None:
        async with sem:
            try:
                content = await one()
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                tally.fail(exc)
                return
        tally.success(content)

    await asyncio.gather(*(bounded() for _ in range(count)))


async def run_async_openai(name: str, args: Args, http_client: Any) -> int:
    """The openai SDK's ``AsyncOpenAI`` over ``http_client`` (its httpx or
    aiohttp transport), a task per request under a semaphore of C, with the
    SDK's default retries (max_retries=2)."""
    import openai

    client = openai.AsyncOpenAI(base_url=args.url, api_key=API_KEY, max_retries=2,
                                http_client=http_client)

    async def one() -> Any:
        completion = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}])
        return completion.choices[0].message.content

    async def batch(count: int, tally: Tally) -> None:
        await gather_bounded(count, args.concurrency, one, tally)

    try:
        return await amain(name, args, batch)
    finally:
        await client.close()
