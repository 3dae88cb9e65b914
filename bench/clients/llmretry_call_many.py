"""Benchmark client: ``llmretry.call_many(bodies, limit=C)``, the batch on the
engine's I/O thread (llmretry's default policy and logger). See README.md."""

from __future__ import annotations

import sys

import _common as c

import llmretry


def run() -> int:
    args = c.parse_args(__doc__ or "")
    c.raise_nofile(args.concurrency)
    # The engine runs at most max_in_flight calls (default 256): size it to
    # the batch's limit so that C really are in flight.
    client = llmretry.Client(base_url=args.url, api_key=c.API_KEY,
                             max_in_flight=max(256, args.concurrency))

    def batch(count: int, tally: c.Tally) -> None:
        results = llmretry.call_many([c.body() for _ in range(count)],
                                     limit=args.concurrency, client=client)
        for r in results:
            if isinstance(r, llmretry.Result):
                tally.success(r.data["choices"][0]["message"]["content"])
            else:
                tally.fail(r)

    try:
        return c.main("llmretry_call_many", args, batch)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(run())
