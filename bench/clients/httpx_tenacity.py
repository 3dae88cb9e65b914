"""Benchmark client: ``httpx.AsyncClient`` + ``tenacity``, what a team writes
by hand: 3 attempts, retry on 408/429/5xx, timeouts and network errors,
exponential backoff with jitter; a task per request under a semaphore of C.
See README.md."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import _common as c

import httpx
from tenacity import (retry, retry_if_exception, stop_after_attempt, wait_exponential,
                      wait_random)


def transient(exc: BaseException) -> bool:
    """The failures worth another attempt (the same rule as peers_python.py)."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return status in (408, 429) or (500 <= status <= 599 and status not in (501, 505))
    return isinstance(exc, (httpx.TimeoutException, httpx.NetworkError,
                            httpx.RemoteProtocolError))


async def amain() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    # httpx's default pool is 100 connections, 20 kept alive: size it to C.
    client = httpx.AsyncClient(
        base_url=args.url,
        headers={"Authorization": f"Bearer {c.API_KEY}"},
        timeout=httpx.Timeout(60.0),
        limits=httpx.Limits(max_connections=args.concurrency,
                            max_keepalive_connections=args.concurrency),
    )

    # Backoff 0.8 s, 1.6 s, ... (max 30 s) plus up to 0.8 s of jitter: the
    # tenacity docs' pattern (wait_exponential_jitter's arguments changed in 9.x).
    @retry(retry=retry_if_exception(transient), stop=stop_after_attempt(3),
           wait=wait_exponential(multiplier=0.8, max=30) + wait_random(0, 0.8), reraise=True)
    async def one() -> Any:
        response = await client.post("/chat/completions", json=c.body())
        response.raise_for_status()
        return response.json()["choices"][0]["message"]["content"]

    async def batch(count: int, tally: c.Tally) -> None:
        await c.gather_bounded(count, args.concurrency, one, tally)

    try:
        return await c.amain("httpx_tenacity", args, batch)
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
