"""A cookbook-style rate-limited batch processor: the peer of llmretry's
rate limits in bench/bench_rate.py (issue 18).

It follows the logic of the openai-cookbook's
``examples/api_request_parallel_processor.py``, the script people are
pointed to for "stay under my rate limits while processing a file", written
here anew for this benchmark (asyncio + aiohttp, as the original):

- one scheduling loop takes the next job (a retry first, else a new one),
  refills two capacities, requests and tokens, at the configured per-minute
  rates and capped at one minute's worth (so it starts with a full minute
  available), and starts the job as a task once both cover it;
- a job costs its estimated tokens: prompt tokens plus ``n * max_tokens``
  (15 when unset); the original counts the prompt with tiktoken, here it is
  ceil(characters / 4), the estimate the mock server itself charges (no
  tokenizer download, and an exact estimate favours this client);
- a failed attempt goes to a retry queue until its attempts are used up
  (``max_attempts``, 5), then the job counts as failed;
- after a rate-limit error the loop stops starting jobs until
  ``pause_after_rate_limit_s`` (15 s) have passed since the latest one; the
  loop sleeps 1 ms per turn.

Differences from the original, none of them in the scheduling: the results
stay in memory instead of a JSONL file; a rate-limit error is recognised by
the HTTP status 429 or "Rate limit" in its message (the current original
compares the error's ``code`` with the string ``'429'``, which OpenAI's
``rate_limit_exceeded`` code never equals, so as published it would never
pause); an optional ``deadline_s`` stops starting jobs (the benchmark's cap
on a slow run), the unstarted ones being reported as not run.

As a script::

    python3 bench/clients/cookbook_processor.py REQUESTS.jsonl --url URL \\
        --rpm 6000 --tpm 1000000 [--api-key KEY] [--max-attempts 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import aiohttp

Body = Dict[str, Any]


@dataclass
class Tally:
    """Counters of one run (the original's status tracker)."""

    started: int = 0
    in_progress: int = 0        # the loop ends when this is back to 0
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0
    rate_limit_errors: int = 0
    api_errors: int = 0         # other error responses
    other_errors: int = 0       # exceptions (connection, JSON)
    pauses: int = 0
    last_rate_limit_at: float = 0.0


@dataclass
class Job:
    index: int
    body: Body
    tokens: int
    attempts_left: int
    errors: List[str] = field(default_factory=list)


def estimate_tokens(body: Body) -> int:
    """Tokens a chat request consumes: its prompt plus n completions of
    ``max_tokens`` (15 when unset, the original's default)."""
    chars = 0
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
    completion = body.get("max_tokens", 15)
    return (chars + 3) // 4 + body.get("n", 1) * completion


def _is_rate_limit(status: int, doc: Any) -> bool:
    if status == 429:
        return True
    error = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(error, dict) and "Rate limit" in str(error.get("message", ""))


async def _attempt(job: Job, session: aiohttp.ClientSession, url: str,
                   headers: Dict[str, str], retries: "asyncio.Queue[Job]",
                   results: List[Any], tally: Tally) -> None:
    """One attempt of a job: store its answer, or queue it for a retry."""
    error: Optional[str] = None
    try:
        async with session.post(url, headers=headers, json=job.body) as resp:
            status = resp.status
            doc = await resp.json(content_type=None)
        if status >= 400 or (isinstance(doc, dict) and "error" in doc):
            error = f"HTTP {status}"
            if _is_rate_limit(status, doc):
                tally.rate_limit_errors += 1
                tally.last_rate_limit_at = time.monotonic()
            else:
                tally.api_errors += 1
    except Exception as exc:    # as the original: any failure is retried
        tally.other_errors += 1
        error = type(exc).__name__
    if error is None:
        results[job.index] = doc
        tally.succeeded += 1
        tally.in_progress -= 1
        return
    job.errors.append(error)
    if job.attempts_left > 0:
        retries.put_nowait(job)
    else:
        results[job.index] = RuntimeError(f"failed after all attempts: {job.errors}")
        tally.failed += 1
        tally.in_progress -= 1


async def process(bodies: List[Body], url: str, *, api_key: str,
                  max_requests_per_minute: float, max_tokens_per_minute: float,
                  max_attempts: int = 5, pause_after_rate_limit_s: float = 15.0,
                  loop_sleep_s: float = 0.001,
                  deadline_s: Optional[float] = None) -> "tuple[List[Any], Tally]":
    """Send every body to ``url`` (the full chat-completions URL) under the
    given per-minute limits. Returns (results in input order: the response
    JSON, an exception for a failed job, None for one never started before
    ``deadline_s``), and the tally."""
    results: List[Any] = [None] * len(bodies)
    tally = Tally()
    retries: "asyncio.Queue[Job]" = asyncio.Queue()
    headers = {"Authorization": f"Bearer {api_key}"}
    fresh: Iterator[int] = iter(range(len(bodies)))
    fresh_left = True
    pending: Optional[Job] = None
    # Both capacities start full: a whole minute's worth.
    req_capacity = max_requests_per_minute
    tok_capacity = max_tokens_per_minute
    refilled_at = time.monotonic()
    stop_at = None if deadline_s is None else refilled_at + deadline_s
    tasks: "set[asyncio.Task[None]]" = set()
    async with aiohttp.ClientSession() as session:   # default connector, as the original
        while True:
            if stop_at is not None and time.monotonic() >= stop_at:
                fresh_left = False      # the cap: start nothing new, retries included
                if pending is not None:
                    tally.in_progress -= 1
                    pending = None
                while not retries.empty():
                    retries.get_nowait()
                    tally.in_progress -= 1
            if pending is None:
                if not retries.empty():
                    pending = retries.get_nowait()
                elif fresh_left:
                    i = next(fresh, None)
                    if i is None:
                        fresh_left = False
                    else:
                        pending = Job(i, bodies[i], estimate_tokens(bodies[i]), max_attempts)
                        tally.started += 1
                        tally.in_progress += 1
            now = time.monotonic()
            elapsed = now - refilled_at
            refilled_at = now
            req_capacity = min(max_requests_per_minute,
                               req_capacity + max_requests_per_minute * elapsed / 60.0)
            tok_capacity = min(max_tokens_per_minute,
                               tok_capacity + max_tokens_per_minute * elapsed / 60.0)
            if pending is not None and req_capacity >= 1 and tok_capacity >= pending.tokens:
                req_capacity -= 1
                tok_capacity -= pending.tokens
                pending.attempts_left -= 1
                tally.attempts += 1
                task = asyncio.create_task(
                    _attempt(pending, session, url, headers, retries, results, tally))
                tasks.add(task)                 # keep a reference until it ends
                task.add_done_callback(tasks.discard)
                pending = None
            if tally.in_progress == 0 and not fresh_left:
                break
            await asyncio.sleep(loop_sleep_s)
            # Cool down after a rate-limit error: nothing starts meanwhile.
            now = time.monotonic()
            since = now - tally.last_rate_limit_at
            if since < pause_after_rate_limit_s:
                tally.pauses += 1
                wait = pause_after_rate_limit_s - since
                if stop_at is not None:         # not past the benchmark's cap
                    wait = max(0.0, min(wait, stop_at - now))
                await asyncio.sleep(wait)
        if tasks:                               # after the cap: the ones in flight
            await asyncio.gather(*tasks)
    return results, tally


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests", help="JSONL file, one chat-completions body a line")
    ap.add_argument("--url", required=True, help="the full chat-completions URL")
    ap.add_argument("--api-key", default="bench-key")
    ap.add_argument("--rpm", type=float, default=1500.0)
    ap.add_argument("--tpm", type=float, default=125000.0)
    ap.add_argument("--max-attempts", type=int, default=5)
    args = ap.parse_args(argv)
    with open(args.requests, encoding="utf-8") as f:
        bodies = [json.loads(line) for line in f if line.strip()]
    results, tally = asyncio.run(process(
        bodies, args.url, api_key=args.api_key, max_requests_per_minute=args.rpm,
        max_tokens_per_minute=args.tpm, max_attempts=args.max_attempts))
    print(json.dumps({"ok": tally.succeeded, "failed": tally.failed,
                      "attempts": tally.attempts,
                      "rate_limit_errors": tally.rate_limit_errors}))
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
