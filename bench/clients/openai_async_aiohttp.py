"""Benchmark client: the openai SDK's ``AsyncOpenAI`` with its aiohttp
transport (``openai[aiohttp]``, ``DefaultAioHttpClient``), a task per request
under a semaphore of C (max_retries=2, the SDK's default). Exits 3 when the
SDK has no aiohttp support here. See README.md."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import _common as c

import openai

UNAVAILABLE = 3     # the contract's "skipped" exit code


async def amain() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    factory = getattr(openai, "DefaultAioHttpClient", None)
    if factory is None:
        c.warn(f"openai_async_aiohttp: skipped: openai {openai.__version__} has no "
               "DefaultAioHttpClient (needs openai >= 1.79 with the aiohttp extra)")
        return UNAVAILABLE
    try:
        # Its connector (aiohttp.TCPConnector) takes limit=max_connections.
        http = factory(limits=c.sdk_limits(args.concurrency))
    except RuntimeError as exc:     # the SDK's message when aiohttp is missing
        c.warn(f"openai_async_aiohttp: skipped: {exc} (pip install 'openai[aiohttp]')")
        return UNAVAILABLE
    client = openai.AsyncOpenAI(base_url=args.url, api_key=c.API_KEY, max_retries=2,
                                http_client=http)

    async def one() -> Any:
        completion = await client.chat.completions.create(
            model=c.MODEL, messages=[{"role": "user", "content": c.PROMPT}])
        return completion.choices[0].message.content

    async def batch(count: int, tally: c.Tally) -> None:
        await c.gather_bounded(count, args.concurrency, one, tally)

    try:
        return await c.amain("openai_async_aiohttp", args, batch)
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
