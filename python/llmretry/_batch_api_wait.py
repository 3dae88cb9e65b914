"""Waiting for a Batch API job as the command line and run() do: Ctrl-C
detaches (BatchDetached: the batches go on), a second one cancels them."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from .batch_api import BatchJob


class BatchDetached(KeyboardInterrupt):
    """Ctrl-C while waiting for the batches: they go on at the provider.
    ``job`` holds them; ``resume=True`` (``--resume``) with the same input
    and record picks them up. ``cancelled`` is True when a second Ctrl-C
    cancelled them instead."""

    def __init__(self, job: "BatchJob", cancelled: bool = False) -> None:
        what = "cancelled" if cancelled else "detached: the batches go on"
        super().__init__(f"batch API job {what} ({', '.join(job.batch_ids)}); "
                         f"record: {job.record_path}")
        self.job = job
        self.cancelled = cancelled


# Raised to the callers of llmretry.batch_api, and named as they import it.
BatchDetached.__module__ = "llmretry.batch_api"


def _sleep(seconds: float) -> None:
    """time.sleep in slices of at most 50 ms: a SIGINT that another thread
    (the engine's) took does not wake this one's sleep, and Python raises
    KeyboardInterrupt only when this thread runs again."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def _interruptible_wait(job: BatchJob, progress: Any, grace_s: float,
                        say: Callable[[str], None],
                        on_submitted: Optional[Callable[[BatchJob], None]] = None) -> None:
    """Submit what is not submitted yet, then job.wait(); Ctrl-C detaches
    (BatchDetached: the batches created go on, resume submits the rest), a
    second one within ``grace_s`` cancels the batches and waits for them to
    end."""
    try:
        job._submit()
        if on_submitted is not None:
            on_submitted(job)
        job.wait(progress=progress)
        return
    except KeyboardInterrupt:
        pass
    _detach_or_cancel(job, grace_s, say)


def _detach_or_cancel(job: BatchJob, grace_s: float, say: Callable[[str], None]) -> None:
    """After a Ctrl-C: raise BatchDetached, cancelling the batches first
    when a second Ctrl-C comes within ``grace_s``."""
    try:
        # Inside the try: a second Ctrl-C as soon as the notice is out counts.
        say(f"llmretry: detaching from {len(job.batch_ids)} batch(es); they go on at the "
            f"provider (resume to collect them). Ctrl-C again within {grace_s:g} s "
            f"cancels them.")
        _sleep(grace_s)
    except KeyboardInterrupt:
        say("llmretry: cancelling the batches and waiting for them to end...")
        job.cancel(wait=True)
        if job.creating_file_id is not None:
            why = ("has not listed it" if job.api.has_list else
                   "lists no batches (GET /batches: not found)")
            say(f"llmretry: a batch was being created from file {job.creating_file_id}; "
                f"the provider {why}, so it was not cancelled. If the provider made it, it "
                f"runs: cancel it at the provider.")
        raise BatchDetached(job, cancelled=True) from None
    raise BatchDetached(job)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
