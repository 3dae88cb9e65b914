"""asyncio batches: ``acall_many`` (an engine batch stepped on the loop)
and ``amap_with_concurrency`` (workers whose calls share one engine group
per engine, the _APool); the loop's channels and Ctrl-C handling are
_aio.py's.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import (Any, Awaitable, Callable, Dict, Iterable, List,
                    Optional, Tuple, TypeVar, Union)

from ._aio import _INT32_MAX, _current_pool, _sigint, _waiting_task
from ._batch import Batch, BatchResult, interrupted, not_started_error, set_accounting
from ._logging import DEFAULT
from ._pool import check_map_args
from .errors import LLMError

__all__ = ["amany", "amap_with_concurrency"]

T = TypeVar("T")
R = TypeVar("R")

# ---------------------------------------------------------------------------
# Pacing of amap_with_concurrency's workers: the batch's group per engine

class _APool:
    """An amap_with_concurrency batch, for the calls its workers make: one
    engine group (limit, 429 pauses, deadline) per engine they use."""

    __slots__ = ("limit", "adaptive", "deadline_at", "_groups")

    def __init__(self, limit: int, deadline_ms: Optional[int], adaptive: bool) -> None:
        self.limit = min(limit, _INT32_MAX)
        self.adaptive = adaptive
        self.deadline_at = None if deadline_ms is None else time.monotonic() + deadline_ms / 1000
        self._groups: Dict[int, Tuple[Any, Any]] = {}

    def left_ms(self) -> Optional[int]:
        if self.deadline_at is None:
            return None
        return max(0, int((self.deadline_at - time.monotonic()) * 1000))

    def group_for(self, engine: Any) -> Any:
        entry = self._groups.get(id(engine))
        if entry is None or entry[0] is not engine:
            group = engine.group(self.limit, deadline_ms=self.left_ms(), adaptive=self.adaptive)
            entry = self._groups[id(engine)] = (engine, group)
        return entry[1]

    def stats(self) -> Dict[str, int]:
        out: Dict[str, int] = {"pauses": 0, "halvings": 0}
        for _engine, group in self._groups.values():
            gs = group.stats()
            out["pauses"] += gs["pauses"]
            out["halvings"] += gs["halvings"]
        return out


# ---------------------------------------------------------------------------
# Batches

async def amany(job: Any) -> None:
    """Run an _EngineBatch on this loop: its BatchRun stepped whenever its
    descriptor is readable. Cancelling cancels what has not finished."""
    loop = asyncio.get_running_loop()
    run = job.engine.batch(*job.args, **job.kwargs)
    fut: "asyncio.Future[None]" = loop.create_future()

    def step() -> None:
        if fut.done():
            return
        try:
            if run.step():
                fut.set_result(None)
        except Exception as exc:
            fut.set_exception(exc)
        except BaseException:
            fut.cancel()
            raise

    fd = run.fileno()
    loop.add_reader(fd, step)
    task = _waiting_task()
    try:
        step()                      # the first submissions
        await fut
    finally:
        if task is not None:
            _sigint.discard(task)
        if not loop.is_closed():
            loop.remove_reader(fd)
        run.close()                 # the totals; cancels what is unfinished


async def amap_with_concurrency(items: Iterable[T], limit: int,
                                worker: Callable[[T, int], Awaitable[R]], *,
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
    """Await ``worker(item, index)`` for every item, at most ``limit`` at
    once, on this event loop; results in input order as a
    :class:`~llmretry.BatchResult`.

    :func:`llmretry.map_with_concurrency` for coroutines: the same batch
    policy applies to the calls the workers make (``acall_llm``,
    ``astream_llm``): a 429 naming a wait pauses the new calls of its model,
    ``adaptive`` halves the window on a burst of 429s, ``deadline_ms``
    bounds the whole batch (items not started in time fail with
    :class:`~llmretry.DeadlineExceededError`); ``failures_path``,
    ``resume``, ``progress``, ``on_result`` and the summary event to
    ``logger`` as there. With ``return_exceptions=False`` the first
    exception stops new items, lets the running ones finish and is raised.
    Cancelling the awaiting task cancels every worker.

    Example::

        async def summarize(doc: str, i: int) -> str:
            res = await llmretry.acall_llm(body_for(doc))
            return res.data["choices"][0]["message"]["content"]

        out = await llmretry.amap_with_concurrency(docs, 16, summarize,
                                                   return_exceptions=True)
    """
    seq, limit, deadline_ms = check_map_args(items, limit, worker, return_exceptions,
                                             deadline_ms, adaptive)
    batch = Batch(seq, failures_path=failures_path, resume=resume, progress=progress,
                  on_result=on_result, logger=logger)
    try:
        return await _amap_run(batch, seq, limit, worker, return_exceptions, deadline_ms,
                               adaptive)
    except KeyboardInterrupt as exc:
        raise interrupted(batch, exc) from None


async def _amap_run(batch: Batch, seq: List[Any], limit: int, worker: Any,
                    return_exceptions: bool, deadline_ms: Optional[int],
                    adaptive: bool) -> BatchResult:
    first_error: List[BaseException] = []
    first_not_started: List[LLMError] = []
    with batch:
        batch.open()
        to_run = list(batch.to_run)
        pool = _APool(limit, deadline_ms, adaptive)
        acc = batch.acc
        pending = iter(to_run)

        async def runner() -> None:
            # This task's context: its calls count for the batch and go
            # through its group (context variables, copied by each task).
            _current_pool.set(pool)
            set_accounting(acc)
            for i in pending:
                if first_error:
                    return
                left = pool.left_ms()
                if left is not None and left <= 0:
                    err = not_started_error(deadline_ms)
                    batch.item_done(i, err, True, not_started=True)
                    if not first_not_started:
                        first_not_started.append(err)
                    continue
                try:
                    value: Any = await worker(seq[i], i)
                    failed = False
                except Exception as exc:
                    value, failed = exc, True
                    if not return_exceptions and not first_error:
                        first_error.append(exc)
                try:
                    batch.item_done(i, value, failed)
                except BaseException as exc:    # recording it failed: stop the batch
                    if not first_error:
                        first_error.append(exc)
                    raise

        tasks = [asyncio.ensure_future(runner()) for _ in range(min(limit, len(to_run)))]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not first_error:
                raise
        finally:
            batch.stats = pool.stats()
        if first_error:
            raise first_error[0]
    result = batch.result()
    if first_not_started and not return_exceptions:
        raise first_not_started[0]
    return result
