"""A bounded concurrency pool for batch jobs (the threads are C threads)."""

from __future__ import annotations

import contextvars
import operator
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, Union

from . import _llmretry
from ._batch import Batch, BatchResult, interrupted, not_started_error, set_accounting
from ._logging import DEFAULT
from .errors import LLMError

__all__ = ["map_with_concurrency", "check_map_args"]

T = TypeVar("T")
R = TypeVar("R")

_INT64_MAX = 2 ** 63 - 1


def map_with_concurrency(items: Iterable[T], limit: int,
                         worker: Callable[[T, int], R], *,
                         # BEGIN GENERATED map-keywords (tools/gen_surface.py's BATCH_KEYWORDS: do not edit)
                         return_exceptions: bool = False,
                         deadline_ms: Optional[int] = None,
                         failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                         resume: bool = False,
                         progress: Union[bool, Callable[[int, int, int], Any]] = False,
                         adaptive: bool = True,
                         on_result: Optional[Callable[[int, Any], Any]] = None,
                         logger: Any = DEFAULT,
                         # END GENERATED map-keywords
                         ) -> BatchResult:
    """Run ``worker(item, index)`` for every item, at most ``limit`` at once.

    Results come back in input order, as a :class:`~llmretry.BatchResult`
    (a list, with ``.summary``). Workers run on ``min(limit, len(items))``
    threads, taking the GIL in turn; a ``call_llm`` inside a worker waits
    with the GIL released, so the calls overlap.

    With ``return_exceptions=False`` the first exception stops new items from
    starting, lets the running ones finish, and is raised. With True, each
    failed item's exception is returned in its place. Ctrl-C cancels the
    calls in flight and, once the workers return, raises
    :class:`~llmretry.BatchInterrupted` (a ``KeyboardInterrupt``) whose
    ``partial`` holds what finished.

    The batch policy of :func:`llmretry.call_many` applies to the calls the
    workers make (``call_llm`` and friends):

    * a 429 whose wait the server names pauses the new starts of the
      model it refused for that long; with ``adaptive`` the number of items
      running halves on a burst of 429s and grows back on successes, never
      above ``limit``;
    * ``deadline_ms`` bounds the whole batch: calls in workers get the
      smaller of their own deadline and the time left, and items not
      started in time fail with :class:`~llmretry.DeadlineExceededError`
      (in place with ``return_exceptions=True``, else the first is raised
      once the batch ends);
    * ``failures_path``, ``resume``, ``progress`` and ``on_result(index,
      value)``: as in :func:`llmretry.call_many` (a failed item's value is
      its exception; an item that JSON cannot encode is recorded by
      ``repr``). ``on_result`` and ``progress`` run on the pool's threads,
      one item at a time;
    * the summary counts the attempts and tokens of every call made by the
      workers, and goes to ``logger`` as an ``llm_batch_summary`` event.

    Example::

        answers = llmretry.map_with_concurrency(
            prompts, 4, lambda prompt, i: llmretry.call_llm(body_for(prompt)).data,
            return_exceptions=True, failures_path="failed.jsonl")
    """
    seq, limit, deadline_ms = check_map_args(items, limit, worker, return_exceptions,
                                             deadline_ms, adaptive)
    batch = Batch(seq, failures_path=failures_path, resume=resume, progress=progress,
                  on_result=on_result, logger=logger)
    try:
        return _run(batch, seq, limit, worker, return_exceptions, deadline_ms, adaptive)
    except KeyboardInterrupt as exc:
        raise interrupted(batch, exc) from None


def _run(batch: Batch, seq: List[Any], limit: int, worker: Callable[[Any, int], Any],
         return_exceptions: bool, deadline_ms: Optional[int], adaptive: bool) -> BatchResult:
    first_not_started: Optional[LLMError] = None
    with batch:
        batch.open()
        to_run = batch.to_run
        if to_run:
            whole = len(to_run) == len(seq)
            acc = batch.acc
            # An exception from recording an item (on_result, progress, the
            # failures file) stops the batch: later items are not run (with
            # return_exceptions=True run_pool would keep going by itself).
            broken: List[BaseException] = []

            # Workers see the caller's context variables (a trace's current
            # span, a request's id), as asyncio's tasks and to_thread do;
            # each item runs in its own copy, so none sees another's changes.
            caller = contextvars.copy_context()

            def work(item: Any, k: int) -> Any:
                set_accounting(acc)     # in this item's own context
                return worker(item, k if whole else to_run[k])

            def run(item: Any, k: int) -> Any:
                if broken:
                    raise _llmretry.PoolStop
                return caller.copy().run(work, item, k)

            def done(k: int, value: Any, failed: bool) -> None:
                if broken:
                    return
                try:
                    batch.item_done(k if whole else to_run[k], value, bool(failed))
                except BaseException as exc:
                    broken.append(exc)
                    raise

            stats: Dict[str, int] = {}
            out = _llmretry.run_pool(seq if whole else [seq[i] for i in to_run],
                                     min(limit, len(to_run)), run, return_exceptions,
                                     deadline_ms=deadline_ms, adaptive=adaptive,
                                     on_result=done, stats=stats)
            if broken:
                raise broken[0]
            batch.stats = stats
            for k, value in enumerate(out):
                if value is _llmretry.NOT_STARTED:
                    err = not_started_error(deadline_ms)
                    batch.item_done(to_run[k], err, True, not_started=True)
                    if first_not_started is None:
                        first_not_started = err
    result = batch.result()
    if first_not_started is not None and not return_exceptions:
        raise first_not_started
    return result


def check_map_args(items: Iterable[Any], limit: Any, worker: Any, return_exceptions: Any,
                   deadline_ms: Any, adaptive: Any) -> Tuple[List[Any], int, Optional[int]]:
    """map_with_concurrency's arguments checked (also amap_with_concurrency's):
    the items as a list, the limit and the deadline as ints."""
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
    if deadline_ms is not None:
        if isinstance(deadline_ms, bool):
            raise TypeError("deadline_ms must be an int or None, not bool")
        try:
            deadline_ms = operator.index(deadline_ms)
        except TypeError:
            raise TypeError(f"deadline_ms must be an int or None, "
                            f"not {type(deadline_ms).__name__}") from None
        if deadline_ms < 0:
            raise ValueError(f"deadline_ms must be >= 0 or None (got {deadline_ms})")
        if deadline_ms > _INT64_MAX:    # the pool reads a C int64
            raise ValueError(f"deadline_ms is out of range (got {deadline_ms})")
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive must be a bool, not {type(adaptive).__name__}")
    if not isinstance(return_exceptions, bool):
        raise TypeError(f"return_exceptions must be a bool, "
                        f"not {type(return_exceptions).__name__}")
    if not isinstance(items, (list, tuple)):
        try:
            items = list(items)
        except TypeError:
            raise TypeError(f"items must be iterable, not {type(items).__name__}") from None
    seq: List[Any] = items if isinstance(items, list) else list(items)
    return seq, limit, deadline_ms
