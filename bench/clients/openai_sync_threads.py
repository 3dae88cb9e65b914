"""Benchmark client: the openai SDK's sync ``OpenAI`` client shared by a
``ThreadPoolExecutor`` of C threads (the SDK's default retries, max_retries=2).
See README.md."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _common as c

import openai


def run() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    # The SDK's default pool holds 1,000 connections and keeps 100 alive:
    # size it to C, otherwise C > 100 reconnects and C = 1,024 waits for a slot.
    http = openai.DefaultHttpxClient(limits=c.sdk_limits(args.concurrency))
    client = openai.OpenAI(base_url=args.url, api_key=c.API_KEY, max_retries=2,
                           http_client=http)

    def one(_i: int) -> Any:
        completion = client.chat.completions.create(
            model=c.MODEL, messages=[{"role": "user", "content": c.PROMPT}])
        return completion.choices[0].message.content

    def batch(count: int, tally: c.Tally) -> None:
        with ThreadPoolExecutor(args.concurrency) as pool:
            futures = [pool.submit(one, i) for i in range(count)]
            for f in futures:
                exc = f.exception()
                if exc is not None:
                    tally.fail(exc)
                else:
                    tally.success(f.result())

    try:
        return c.main("openai_sync_threads", args, batch)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(run())
