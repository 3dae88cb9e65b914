"""Benchmark client: ``llmretry.map_with_concurrency(items, C, worker)``, each
worker calling ``llmretry.call_llm`` (llmretry's default policy and logger).
See README.md."""

from __future__ import annotations

import sys
from typing import Any

import _common as c

import llmretry


def run() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    # The engine runs at most max_in_flight calls (default 256): size it to
    # the pool so that C really are in flight.
    client = llmretry.Client(base_url=args.url, api_key=c.API_KEY,
                             max_in_flight=max(256, args.concurrency))

    def worker(_item: int, _index: int) -> Any:
        return llmretry.call_llm(c.body(), client=client).data["choices"][0]["message"]["content"]

    def batch(count: int, tally: c.Tally) -> None:
        results = llmretry.map_with_concurrency(range(count), args.concurrency, worker,
                                                return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                tally.fail(r)
            else:
                tally.success(r)

    try:
        return c.main("llmretry_map", args, batch)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(run())
