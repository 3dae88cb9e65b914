"""A batch's usage accounting: what its calls report (attempts, retries,
usage), through a context variable for calls made in a worker."""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Dict, Mapping, Optional


# Usage accounting. Calls made inside a map_with_concurrency worker report to
# the batch through a context variable (the pool's threads are C threads that
# run the workers one item at a time; amap_with_concurrency's are tasks).

class Accounting:
    """Attempts and token usage summed over the calls of a batch."""

    __slots__ = ("lock", "attempts", "retries", "resends", "prompt_tokens",
                 "completion_tokens", "total_tokens")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts = 0
        self.retries = 0
        self.resends = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.total_tokens = 0

    def add(self, attempts: int, retries: int, usage: Optional[Mapping[str, Any]],
            resends: int = 0) -> None:
        """Count calls: their attempts, retries, re-sends and usage."""
        with self.lock:
            self.attempts += attempts
            self.retries += retries
            self.resends += resends
            if usage:
                self.prompt_tokens += usage.get("prompt_tokens") or 0
                self.completion_tokens += usage.get("completion_tokens") or 0
                self.total_tokens += usage.get("total_tokens") or 0

    def add_outcome(self, out: Mapping[str, Any]) -> None:
        """Count one call outcome of the extension (ok or not)."""
        attempts = out.get("attempts") or 0
        # Every attempt's tokens, a failed call's too: what the batch is billed.
        self.add(attempts, max(attempts - 1, 0), out.get("usage_total"),
                 out.get("resends") or 0)

    def add_meta(self, meta: Any) -> None:
        """Count one successful call by its Meta."""
        self.add(meta.attempts, max(meta.attempts - 1, 0),
                 getattr(meta, "usage_total", None) or meta.usage)

    def merge(self, other: "Accounting") -> None:
        """Add another batch's totals (a batch run inside a worker)."""
        self.add(other.attempts, other.retries, other.usage(), other.resends)

    def usage(self) -> Dict[str, int]:
        """The token counts so far, as a usage dict."""
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


# A context variable, not a thread-local: each thread has its own context,
# and so does each asyncio task (amap_with_concurrency's workers share one
# thread but not their batch).
_accounting: "contextvars.ContextVar[Optional[Accounting]]" = contextvars.ContextVar(
    "llmretry_batch_accounting", default=None)


def current_accounting() -> Optional[Accounting]:
    """The accounting of the batch whose worker runs here (this thread, this
    asyncio task), if any."""
    return _accounting.get()


def set_accounting(acc: Optional[Accounting]) -> Optional[Accounting]:
    """Make ``acc`` the batch accounting here; returns the previous one."""
    prev = _accounting.get()
    _accounting.set(acc)
    return prev
