"""Benchmark client: the openai SDK's ``AsyncOpenAI`` on asyncio, a task per
request under a semaphore of C (the SDK's default retries, max_retries=2).
See README.md."""

from __future__ import annotations

import asyncio
import sys
import _common as c

import openai


async def amain() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    # The SDK's default pool holds 1,000 connections and keeps 100 alive:
    # size it to C, otherwise C > 100 reconnects and C = 1,024 waits for a slot.
    http = openai.DefaultAsyncHttpxClient(limits=c.sdk_limits(args.concurrency))
    return await c.run_async_openai("openai_async", args, http)


if __name__ == "__main__":
    sys.exit(asyncio.run(amain()))
