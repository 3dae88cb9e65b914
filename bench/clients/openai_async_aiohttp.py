"""Benchmark client: the openai SDK's ``AsyncOpenAI`` with its aiohttp
transport (``openai[aiohttp]``, ``DefaultAioHttpClient``), a task per request
under a semaphore of C (max_retries=2, the SDK's default). Exits 3 when the
SDK has no aiohttp support here. See README.md."""

from __future__ import annotations

import asyncio
import sys
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
    return await c.run_async_openai("openai_async_aiohttp", args, http)


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
