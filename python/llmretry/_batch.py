"""The batch layer: failures file, resume, usage summary, progress.

:func:`llmretry.call_many` and :func:`llmretry.map_with_concurrency` run a
batch through one :class:`Batch`, which sees every item finish (on the
thread that waits for a ``call_many``, on the pool's threads for
``map_with_concurrency``) and keeps the batch's record.

The record on disk (``failures_path=P``)
----------------------------------------

Two append-only files, each line written whole by one ``write(2)`` on a
descriptor opened with ``O_APPEND`` as soon as the item finishes, so that a
crash or Ctrl-C leaves them consistent:

``P`` (the failures file)
    One JSON line per item that failed in the latest run::

        {"index": 7, "item": {...the body or item...},
         "error": {"kind": "http_status", "status": 400, "message": "...",
                   "request_id": "...", "attempts": 1}}

    An item that JSON cannot encode is written as ``"item": null`` with its
    ``repr()`` under ``"item_repr"``. An exception that is not an
    :class:`~llmretry.LLMError` (a ``map_with_concurrency`` worker's own
    error) has ``"kind": "exception"`` and its class under ``"type"``. The
    file holds the items as given, prompts included: keep it where you keep
    the input.

``P + ".done"`` (the progress file)
    A header line ``{"llmretry_done": 1, "items": N}``, then the index of
    every item that succeeded, one per line. ``N`` is null for an iterable
    of unknown length read lazily (then no length is checked on resume).

At every moment each item is in exactly one of three states: *ok* (its index
is in the progress file), *failed* (in the failures file, and not ok), or
*not run yet* (in neither: not reached, or in flight when the run was
stopped).

Resume
------

``resume=True`` runs every item that is not ok, and only those: the failed
ones and the ones never run (an earlier run stopped by Ctrl-C, a crash or
``return_exceptions=False``). The ok items are not run again; their slots
in the returned list hold :data:`SKIPPED`. Which items are ok comes from the
progress file; without one (a failures file from elsewhere), every item not
listed in the failures file counts as ok, so just the listed ones run. With
neither file it is a first run. A resume run starts by rewriting the
progress file with the ok indices (atomically) and emptying the failures
file, then appends as items finish, as any run does: the state stays
consistent whenever the run stops. Without ``resume`` a run starts both
files afresh.

A lazy batch (``call_many`` over an iterable that is not a list or tuple)
reads its items again from the start on resume and skips the ok ones as
they come; the record is read into a bitmap (an :class:`IndexSet`), so a
million-item batch costs 125 KB, and a failing item is held only while it
is in flight. Resuming one from a failures file alone (no progress file)
needs its length, and raises ValueError without it.

The record only says *which* items succeeded: keep their results yourself
(``on_result`` is called for each item before it is marked ok, so a crash
between the two runs the item again rather than losing its result).
"""


from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

# Accounting is the pool's and the results' as _batch.<name>.
from ._accounting import Accounting as Accounting, current_accounting as current_accounting
from ._accounting import set_accounting as set_accounting
from ._batch_progress import ProgressBar, _progress_arg, check_logger, emit_summary
from ._batch_record import MAX_UNSIZED_INDEX, Journal, _path_arg
# The record's names that others use as _batch.<name> (the CLI, batch_api).
from ._batch_record import IndexSet as IndexSet, _file_kind as _file_kind
from ._batch_record import _write_all as _write_all, done_path_for as done_path_for
from ._batch_record import error_record as error_record, iter_lines as iter_lines
from ._batch_record import read_done as read_done, read_failures as read_failures
from ._batch_record import record_path as record_path, temp_beside as temp_beside
from . import _llmretry
from ._logging import DEFAULT
from .errors import LLMError, error_from_outcome

__all__ = ["SKIPPED", "BatchSummary", "BatchResult", "Batch", "ProgressBar",
           "read_failures", "read_done", "done_path_for", "current_accounting",
           "not_started_error"]

# (done, total, failed); total None: a lazy batch of unknown length.
ProgressCallback = Callable[[int, Optional[int], int], Any]
OnResult = Callable[[int, Any], Any]

# ---------------------------------------------------------------------------
# Results


class _Skipped:
    """The type of :data:`SKIPPED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SKIPPED"

    def __reduce__(self) -> str:
        return "SKIPPED"

    def __bool__(self) -> bool:
        return False


SKIPPED: Any = _Skipped()
"""The slot of an item a resumed batch did not run: an earlier run of the
same batch completed it (see ``resume`` in :func:`llmretry.call_many`)."""


@dataclass(frozen=True)
class BatchSummary:
    """What a batch did, as returned in ``BatchResult.summary``.

    It is also emitted once, at the end of the batch (Ctrl-C included), as
    an ``llm_batch_summary`` event to the batch's logger: at INFO when no
    item failed, else at WARNING.

    Attributes:
        items: the items given.
        ok: items that succeeded in this run.
        failed: items that failed in this run (``not_started`` included).
        not_started: items the batch deadline stopped before they started.
        skipped: items not run because an earlier run completed them
            (``resume``).
        attempts: HTTP attempts made, retries included.
        retries: attempts beyond each call's first.
        resends: requests sent again at once, not counted as attempts: a
            stream the server refused, a kept-alive connection that had
            died (safe mode) or held stray bytes. The server saw
            ``attempts + resends`` requests at most. Counted for
            ``call_many``; ``map_with_concurrency`` counts 0.
        prompt_tokens, completion_tokens, total_tokens: usage summed over
            every attempt that returned one (``usage_total``): the answers
            that failed validation, and failed calls' attempts, are billed too.
        elapsed_ms: the batch's wall time.
        pauses: times a 429's wait paused the new starts of its model.
        halvings: times a burst of 429s halved the number of items in flight.
        completed: False when the batch was stopped before every item
            finished (Ctrl-C, an exception from ``on_result``, or the first
            failure with ``return_exceptions=False``); those items are
            neither ok nor failed, and a resume runs them.
    """

    items: int
    ok: int
    failed: int
    not_started: int
    skipped: int
    attempts: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    elapsed_ms: int
    pauses: int
    halvings: int
    completed: bool
    resends: int = 0

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict."""
        return asdict(self)

    def format(self) -> str:
        """A one-paragraph human-readable account (what the CLI prints)."""
        lines = [f"{self.items} items: {self.ok} ok, {self.failed} failed"
                 + (f" ({self.not_started} not started before the deadline)"
                    if self.not_started else "")
                 + (f", {self.skipped} done earlier" if self.skipped else "")
                 + ("" if self.completed else
                    f", {self.items - self.ok - self.failed - self.skipped} not run"),
                 f"{self.attempts} attempts ({self.retries} retries"
                 + (f", {self.resends} free re-sends" if self.resends else "") + "), "
                 f"{self.elapsed_ms / 1000:.1f} s"
                 + (f", {self.pauses} pool-wide pause(s) on Retry-After"
                    if self.pauses else "")
                 + (f", {self.halvings} halving(s) of the window" if self.halvings else ""),
                 f"tokens: {self.prompt_tokens} prompt + {self.completion_tokens} "
                 f"completion = {self.total_tokens}"]
        return "\n".join(lines)


class BatchResult(List[Any]):
    """A batch's results in input order, with its :class:`BatchSummary`.

    A list: each slot holds the item's result (a :class:`~llmretry.Result`
    for ``call_many``, the worker's value for ``map_with_concurrency``), its
    exception when it failed, or :data:`SKIPPED` when a resumed batch did
    not run it.
    """

    summary: BatchSummary

    def __init__(self, values: Iterable[Any], summary: BatchSummary) -> None:
        super().__init__(values)
        self.summary = summary

    def errors(self) -> List[Tuple[int, BaseException]]:
        """The failed items as ``(index, exception)`` pairs, in input order."""
        return [(i, v) for i, v in enumerate(self) if isinstance(v, BaseException)]

    def __repr__(self) -> str:
        s = self.summary
        return (f"BatchResult(items={s.items}, ok={s.ok}, failed={s.failed}, "
                f"skipped={s.skipped})")


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a notebook's interrupt) during ``call_many`` or
    ``map_with_concurrency``: a ``KeyboardInterrupt`` that keeps what
    finished before it.

    ``partial`` (also ``result``) is the batch's :class:`BatchResult`: each
    item that finished holds its value or its exception, as in a complete
    run; the items that had not finished hold None (:data:`SKIPPED` those
    a resumed run did not run). Its summary has ``completed=False``.
    The calls in flight were cancelled; the failures file, when there is
    one, records every item that finished, so ``resume`` runs the rest.

    Example::

        try:
            out = llmretry.call_many(bodies, limit=4)
        except llmretry.BatchInterrupted as stop:
            out = stop.partial      # keep what is done
    """

    __module__ = "llmretry"     # its public name, in tracebacks too

    def __init__(self, partial: BatchResult) -> None:
        s = partial.summary
        super().__init__(f"batch interrupted: {s.ok} ok, {s.failed} failed, "
                         f"{s.items - s.ok - s.failed - s.skipped} unfinished "
                         f"of {s.items} items")
        self.partial = partial

    @property
    def result(self) -> BatchResult:
        """The same as :attr:`partial`."""
        return self.partial

    def __reduce__(self) -> Tuple[Any, ...]:
        return (BatchInterrupted, (self.partial,))


def interrupted(batch: "Batch", exc: KeyboardInterrupt) -> KeyboardInterrupt:
    """What to raise for a KeyboardInterrupt that ended ``batch`` (already
    finished): a BatchInterrupted with its partial result, unless ``exc``
    already is one (a nested batch's: it carries that batch's items)."""
    if isinstance(exc, BatchInterrupted):
        return exc
    return BatchInterrupted(batch.result()).with_traceback(exc.__traceback__)


def not_started_error(deadline_ms: Optional[int]) -> LLMError:
    """The DeadlineExceededError of an item the batch deadline kept from starting."""
    when = f" ({deadline_ms} ms)" if deadline_ms is not None else ""
    return error_from_outcome({
        "kind": "deadline_exceeded", "reason": "deadline", "attempt": 0, "attempts": 0,
        "message": f"the batch deadline{when} passed before this item started",
    })


# ---------------------------------------------------------------------------
# One run of a batch

class Batch:
    """One run of a batch: its record, progress, accounting and summary.

    Use it as a context manager around the run, and call :meth:`item_done`
    as each item finishes (from any thread). Leaving the context ends the
    progress display, closes the files and emits the summary event, also
    when an exception (Ctrl-C) ends the run.
    """

    def __init__(self, items: Optional[Sequence[Any]], *, failures_path: Any = None,
                 resume: bool = False, progress: Any = False,
                 on_result: Optional[OnResult] = None, logger: Any = DEFAULT,
                 parse_items: bool = False, keep_results: bool = True,
                 n: Optional[int] = None) -> None:
        if not isinstance(resume, bool):
            raise TypeError(f"resume must be a bool, not {type(resume).__name__}")
        path = None if failures_path is None else _path_arg(failures_path)
        if resume and path is None:
            raise ValueError("resume=True needs failures_path (the record of the earlier run)")
        if on_result is not None and not callable(on_result):
            raise TypeError(f"on_result must be callable or None, "
                            f"not {type(on_result).__name__}")
        if not isinstance(keep_results, bool):
            raise TypeError(f"keep_results must be a bool, not {type(keep_results).__name__}")
        check_logger(logger)
        self.items = items
        # items None: a lazy batch (see wants()), of n items when known.
        self.lazy = items is None
        self.n: Optional[int] = len(items) if items is not None else n
        self.resume = resume
        self.progress = _progress_arg(progress)
        self.on_result = on_result
        self.logger = logger
        self.keep_results = keep_results
        self.journal = (Journal(path, items, parse_items=parse_items, n=self.n)
                        if path is not None else None)
        # The values by index; None when not kept (keep_results=False). A
        # lazy batch grows it as items are read (wants()).
        self.results: Optional[List[Any]] = (
            None if not keep_results else [] if self.lazy else [SKIPPED] * len(items or ()))
        self.to_run: List[int] = [] if self.lazy else list(range(len(items or ())))
        # to_run less the items failed before the run (open's `invalid`).
        self.runnable: List[int] = self.to_run
        # A lazy batch: the indices not to run, how many items were read and
        # how many of those run.
        self.ok = IndexSet()
        self._read = 0
        self._wanted = 0
        self.acc = Accounting()
        self.stats: Dict[str, int] = {}
        self.summary: Optional[BatchSummary] = None
        self._lock = threading.RLock()
        self._done = 0
        self._ok = 0
        self._failed = 0
        self._not_started = 0
        self._completed = False
        self._t0 = time.monotonic()

    # -- the run ---------------------------------------------------------------

    def open(self, already_ok: Optional[Set[int]] = None,
             invalid: Optional[Mapping[int, BaseException]] = None) -> "Batch":
        """Read the record (resume) and decide what runs: :attr:`to_run`.

        ``invalid``: items that cannot be sent (the CLI's bad input lines
        under --skip-invalid), by index; each one that is to run is
        recorded at once as failed with its exception, and is left out of
        :attr:`runnable`, the items the run submits.
        """
        if self.journal is not None:
            ok = self.journal.open(self.resume, already_ok)
        else:
            ok = IndexSet(() if already_ok is None else already_ok,
                          limit=MAX_UNSIZED_INDEX if self.n is None else self.n)
        self.ok = ok
        if self.lazy:
            # What runs is decided item by item as they are read (wants()).
            self._t0 = time.monotonic()
            if isinstance(self.progress, ProgressBar):
                self.progress.start(self._total())
            return self
        n = len(self.to_run)
        if ok.complement or len(ok):
            self.to_run = [i for i in range(n) if i not in ok]
        self.runnable = self.to_run
        if self.results is not None:
            for i in self.to_run:
                self.results[i] = None
        self._t0 = time.monotonic()
        if isinstance(self.progress, ProgressBar):
            self.progress.start(len(self.to_run))
        if invalid:
            self.runnable = [i for i in self.to_run if i not in invalid]
            for i in self.to_run:
                if i in invalid:
                    self.item_done(i, invalid[i], True)
        return self

    def _total(self) -> Optional[int]:
        """How many items this run runs: None while a lazy batch of unknown
        length is still being read."""
        if not self.lazy:
            return len(self.to_run)
        if self.n is not None:
            return self.n - self.ok.count(self.n)
        return None

    def wants(self, index: int) -> bool:
        """A lazy batch reads item ``index`` (in order, from 0): whether it
        is to run (False: an earlier run completed it)."""
        run = index not in self.ok
        self._read = index + 1
        self._wanted += run
        if self.results is not None:
            self.results.append(None if run else SKIPPED)
        return run

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.finish(completed=exc_type is None)

    def item_done(self, index: int, value: Any, failed: bool,
                  outcome: Optional[Mapping[str, Any]] = None,
                  not_started: bool = False, item: Any = None) -> None:
        """Item ``index`` finished with ``value`` (its exception when ``failed``).

        ``outcome`` (call_many) is the extension's outcome dict, counted for
        attempts and usage. ``item``: the item, for the failures file of a
        lazy batch (which keeps no items). Calls the user's ``on_result``
        first, then records the item and reports progress; one item at a
        time, whatever thread it finished on.
        """
        if outcome is not None:
            self.acc.add_outcome(outcome)
        if self.results is not None:
            self.results[index] = value
        with self._lock:
            if self.on_result is not None:
                self.on_result(index, value)
            if self.journal is not None:
                if failed:
                    self.journal.record_failure(index, value, item)
                else:
                    self.journal.record_ok(index)
            self._done += 1
            if failed:
                self._failed += 1
                if not_started:
                    self._not_started += 1
            else:
                self._ok += 1
            if self.progress is not None:
                self.progress(self._done, self._total(), self._failed)

    def needs_each_item(self) -> bool:
        """Whether something wants each item as it finishes (a record,
        progress, on_result, a subclass's item_done); if not, a run may
        hand over its values at the end (:meth:`record_values`)."""
        return (self.journal is not None or self.progress is not None
                or self.on_result is not None or self.results is None
                or type(self).item_done is not Batch.item_done)

    def record_values(self, values: Sequence[Any],
                      convert: Callable[[Any], Tuple[Any, bool, bool]]) -> None:
        """Record a run not watched item by item: ``values[k]`` is item
        ``runnable[k]``'s value, None when it did not finish: a success, or
        an outcome dict that ``convert`` turns into (value, failed,
        not_started). ``values`` may be :attr:`results` itself, filled in
        place by a run of every item."""
        results, to_run = self.results, self.runnable
        assert results is not None      # needs_each_item() when not kept
        ok = failed = not_started = 0
        if values is results:
            # Filled in place (every item ran): only the outcome dicts to
            # convert, found by the extension (most values are Results).
            finished, outcomes = _llmretry._batch_tally(results)
            for k in outcomes:
                results[k], bad, late = convert(results[k])
                failed += bad
                not_started += bad and late
            ok = finished - failed
        else:
            for k, value in enumerate(values):
                if value is None:
                    continue
                if type(value) is not dict:
                    ok += 1
                else:
                    value, bad, late = convert(value)
                    if bad:
                        failed += 1
                        not_started += late
                    else:
                        ok += 1
                results[to_run[k]] = value
        with self._lock:
            self._done += ok + failed
            self._ok += ok
            self._failed += failed
            self._not_started += not_started

    def add_totals(self, stats: Mapping[str, int]) -> None:
        """The engine's numbers for a run: its pacing (pauses, halvings)
        and what its calls added up to (attempts, retries, tokens)."""
        self.stats = dict(stats)
        self.acc.add(stats.get("attempts", 0), stats.get("retries", 0), stats,
                     stats.get("resends", 0))

    def finish(self, completed: bool) -> BatchSummary:
        """End the run: close the record and progress, emit the summary."""
        if self.summary is not None:
            return self.summary
        try:
            if isinstance(self.progress, ProgressBar):
                self.progress.close()
        finally:
            if self.journal is not None:
                self.journal.close()
        outer = current_accounting()
        if outer is not None and outer is not self.acc:
            outer.merge(self.acc)
        a = self.acc
        if self.lazy:
            # Unknown length: the items read (a stopped run: so far).
            items = self.n if self.n is not None else self._read
            total = self._total()
            to_run = total if total is not None else self._wanted
        else:
            items, to_run = len(self.items or ()), len(self.to_run)
        self.summary = BatchSummary(
            items=items, ok=self._ok, failed=self._failed, not_started=self._not_started,
            skipped=items - to_run, attempts=a.attempts, retries=a.retries,
            prompt_tokens=a.prompt_tokens, completion_tokens=a.completion_tokens,
            total_tokens=a.total_tokens,
            elapsed_ms=int((time.monotonic() - self._t0) * 1000),
            pauses=self.stats.get("pauses", 0), halvings=self.stats.get("halvings", 0),
            completed=completed and self._done == to_run, resends=a.resends)
        emit_summary(self.logger, self.summary)
        return self.summary

    def result(self) -> BatchResult:
        """The results in input order, with the summary (after :meth:`finish`);
        an empty one when they were not kept (keep_results=False)."""
        summary = self.summary if self.summary is not None else self.finish(True)
        return BatchResult(self.results if self.results is not None else (), summary)
