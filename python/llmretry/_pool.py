"""A bounded concurrency pool for batch jobs (the threads are C threads)."""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, List, TypeVar

from . import _llmretry

__all__ = ["map_with_concurrency"]

T = TypeVar("T")
R = TypeVar("R")


def map_with_concurrency(items: Iterable[T], limit: int,
                         worker: Callable[[T, int], R], *,
                         return_exceptions: bool = False) -> List[Any]:
    """Run ``worker(item, index)`` for every item, at most ``limit`` at once.

    Results come back in input order. Workers run on ``min(limit,
    len(items))`` threads, taking the GIL in turn; a ``call_llm`` inside a
    worker waits with the GIL released, so the calls overlap.

    With ``return_exceptions=False`` the first exception stops new items from
    starting, lets the running ones finish, and is raised. With True, each
    failed item's exception is returned in its place. Ctrl-C cancels the
    calls in flight and raises ``KeyboardInterrupt`` once the workers return.

    Example::

        answers = llmretry.map_with_concurrency(
            prompts, 4, lambda prompt, i: llmretry.call_llm(body_for(prompt)).data)
    """
    if isinstance(limit, bool):
        raise TypeError("limit must be an int, not bool")
    try:
        limit = operator.index(limit)
    except TypeError:
        raise TypeError(f"limit must be an int, not {type(limit).__name__}") from None
    if limit < 1:
        raise ValueError(f"limit must be >= 1 (got {limit})")
    if not callable(worker):
        raise TypeError(f"worker must be callable, not {type(worker).__name__}")
    if not isinstance(items, (list, tuple)):
        try:
            items = list(items)
        except TypeError:
            raise TypeError(f"items must be iterable, not {type(items).__name__}") from None
    if not items:
        return []
    return _llmretry.run_pool(items, min(limit, len(items)), worker,
                              bool(return_exceptions))
