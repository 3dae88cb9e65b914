"""Benchmark client: plain ``aiohttp`` with a simple retry loop (3 attempts on
429/5xx and connection errors or timeouts, exponential backoff with jitter or
the server's Retry-After seconds); a task per request under a semaphore of C.
See README.md."""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any, Optional

import _common as c

import aiohttp

ATTEMPTS = 3
BASE_DELAY_S = 0.5


def retry_after_s(value: Optional[str]) -> Optional[float]:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def amain() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    url = args.url + "/chat/completions"
    # aiohttp's connector holds 100 connections by default: size it to C.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=args.concurrency),
        headers={"Authorization": f"Bearer {c.API_KEY}"},
        timeout=aiohttp.ClientTimeout(total=60),
    )

    async def one() -> Any:
        for attempt in range(ATTEMPTS):
            last = attempt == ATTEMPTS - 1
            delay = BASE_DELAY_S * 2 ** attempt + random.uniform(0, BASE_DELAY_S)
            try:
                async with session.post(url, json=c.body()) as resp:
                    if (resp.status == 429 or resp.status >= 500) and not last:
                        await resp.read()
                        named = retry_after_s(resp.headers.get("Retry-After"))
                        delay = delay if named is None else named
                    else:
                        resp.raise_for_status()
                        data = await resp.json()
                        return data["choices"][0]["message"]["content"]
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                if last:
                    raise
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def batch(count: int, tally: c.Tally) -> None:
        await c.gather_bounded(count, args.concurrency, one, tally)

    try:
        return await c.amain("aiohttp_raw", args, batch)
    finally:
        await session.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
