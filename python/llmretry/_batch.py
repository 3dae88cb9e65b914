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

import contextvars
import errno
import importlib
import json
import logging
import os
import stat
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Set, TextIO, Tuple, Union)

from ._logging import DEFAULT, LOGGER_NAME, event_sink
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
        pauses: times a 429's wait paused every new start.
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


# ---------------------------------------------------------------------------
# The record on disk

_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_LINE_LOOSE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def done_path_for(failures_path: str) -> str:
    """The progress file that goes with a failures file."""
    return failures_path + ".done"


def _file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for an error message."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def record_path(path: str, what: str) -> str:
    """Where a record file named ``path`` is written: ``path`` itself, or the
    file a symbolic link there points to (written through: the link is
    never replaced). An existing path that is not a regular file is refused
    with an OSError naming it (IsADirectoryError for a directory): a record
    is rewritten by renaming a new file over it and read back on resume,
    and a rename over a FIFO or a device would replace it."""
    try:
        mode: Optional[int] = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None     # a new file (or the target of a dangling link, created)
    if mode is not None and not stat.S_ISREG(mode):
        kind = _file_kind(mode)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, f"{what} is {kind}", path)
        raise OSError(errno.EINVAL, f"{what} is {kind}, not a regular file", path)
    return os.path.realpath(path) if os.path.islink(path) else path


def _path_arg(value: Any) -> str:
    """A failures_path argument as a str path (TypeError otherwise)."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise TypeError(f"failures_path must be a str or os.PathLike, "
                        f"not {type(value).__name__}")
    if not path:
        raise ValueError("failures_path must not be empty")
    if "\0" in path:
        raise ValueError("failures_path must not contain NUL")
    return path


def _read_lines(path: str) -> List[str]:
    """A file's lines; a torn last line (no newline) is dropped."""
    return list(iter_lines(path))


def iter_lines(path: str) -> Iterator[str]:
    """A file's non-blank lines, read one at a time (a record of a million
    items is never in memory whole); a torn last line (no newline) is
    dropped."""
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return      # a line cut short
            if raw.strip():
                yield raw[:-1].decode("utf-8", "replace")


# The most items a record may name when the batch's length is not known
# (an iterable read lazily): a bigger index is a file from something else
# (and its bitmap would take 2**28 / 8 bytes = 32 MB at most).
MAX_UNSIZED_INDEX = 2 ** 28


class IndexSet:
    """A set of item indices as a bitmap: the record of a million-item batch
    in 125 KB, where a set of ints takes some 60 MB. Indices are from 0 to
    ``limit - 1``; ``complement=True`` makes it the set of every index *not*
    added (what a failures file alone says is ok)."""

    __slots__ = ("_bits", "_count", "limit", "complement")

    def __init__(self, indices: Iterable[int] = (), limit: int = MAX_UNSIZED_INDEX,
                 complement: bool = False) -> None:
        self._bits = bytearray()
        self._count = 0
        self.limit = limit
        self.complement = complement
        for i in indices:
            self.add(i)

    def add(self, i: int) -> None:
        """Add ``i`` (ValueError naming it when it is not below ``limit``)."""
        if not 0 <= i < self.limit:
            raise ValueError(f"index {i} is out of range (the batch has {self.limit} items)")
        byte, bit = i >> 3, 1 << (i & 7)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if not self._bits[byte] & bit:
            self._bits[byte] |= bit
            self._count += 1

    def discard(self, i: int) -> None:
        """Remove ``i`` if it is there."""
        if self._has(i):
            self._bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
            self._count -= 1

    def _has(self, i: int) -> bool:
        byte = i >> 3
        return 0 <= i and byte < len(self._bits) and bool(self._bits[byte] & (1 << (i & 7)))

    def __contains__(self, i: object) -> bool:
        return isinstance(i, int) and self._has(i) != self.complement

    def count(self, n: int) -> int:
        """How many of the indices 0 .. n-1 are in the set."""
        added = self._count if n >= self.limit else sum(1 for i in self._added() if i < n)
        return n - added if self.complement else added

    def _added(self) -> Iterator[int]:
        for byte, v in enumerate(self._bits):
            if v:
                for bit in range(8):
                    if v & (1 << bit):
                        yield byte * 8 + bit

    def __iter__(self) -> Iterator[int]:
        """The indices in increasing order (not for a complement)."""
        if self.complement:
            raise TypeError("a complement IndexSet has no end")
        return self._added()

    def __len__(self) -> int:
        if self.complement:
            raise TypeError("a complement IndexSet has no length")
        return self._count


def read_failures(path: str) -> Dict[int, Dict[str, Any]]:
    """The records of a failures file by index (the last one wins).

    Lines that are not whole JSON objects with an integer ``index`` (a line
    cut short by a crash) are ignored.
    """
    out: Dict[int, Dict[str, Any]] = {}
    for line in iter_lines(path):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and type(rec.get("index")) is int:
            out[rec["index"]] = rec
    return out


def read_done(path: str) -> Tuple[Optional[int], Set[int]]:
    """A progress file's item count (None if its header is missing) and indices."""
    items, done = _read_done(path, None)
    return items, set(done)


def _check_items(path: str, items: Optional[int], n: Optional[int]) -> None:
    if items is not None and n is not None and items != n:
        raise ValueError(f"{path} records a batch of {items} items, "
                         f"not {n}: is this the same batch?")


def _out_of_range(path: str, index: int, n: Optional[int]) -> ValueError:
    size = f"{n} items" if n is not None else f"fewer than {MAX_UNSIZED_INDEX} items"
    return ValueError(f"the record of {path} names item {index}, "
                      f"but the batch has {size}: is this the same batch?")


def _read_done(path: str, n: Optional[int]) -> Tuple[Optional[int], IndexSet]:
    """read_done as an IndexSet, read line by line: a batch of ``n`` items
    (None: not known) refuses a header for another length, and indices
    outside it."""
    items: Optional[int] = None
    done = IndexSet(limit=MAX_UNSIZED_INDEX if n is None else n)
    for k, line in enumerate(iter_lines(path)):
        if k == 0 and line.startswith("{"):
            try:
                header = json.loads(line)
            except ValueError:
                continue
            if isinstance(header, dict) and type(header.get("items")) is int:
                items = header["items"]
                _check_items(path, items, n)
            continue
        try:
            i = int(line)
        except ValueError:
            continue
        try:
            done.add(i)
        except ValueError:
            raise _out_of_range(path, i, n) from None
    return items, done


def _failed_indices(path: str) -> Iterator[int]:
    """The indices a failures file lists, read line by line (each line
    parsed, then dropped: the items in it are not kept)."""
    for line in iter_lines(path):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and type(rec.get("index")) is int:
            yield rec["index"]


def error_record(exc: BaseException) -> Dict[str, Any]:
    """The ``error`` object of a failures-file line."""
    if isinstance(exc, LLMError):
        rec: Dict[str, Any] = {"kind": exc.kind, "status": exc.status,
                               "message": exc.message, "request_id": exc.request_id,
                               "attempts": exc.attempts}
        if getattr(exc, "validation_errors", None):
            rec["validation_errors"] = exc.validation_errors    # where, never what
        return rec
    return {"kind": "exception", "type": type(exc).__name__, "status": None,
            "message": str(exc), "request_id": None, "attempts": None}


def _item_json(item: Any) -> Any:
    """A call_many body as JSON: dicts as they are, texts parsed when they parse."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        item = bytes(item).decode("utf-8", "replace")
    if isinstance(item, str):
        try:
            return json.loads(item)
        except (ValueError, RecursionError):
            return item
    return item


def _write_all(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def temp_beside(path: str) -> Tuple[str, Any]:
    """A new temporary file next to ``path`` (same file system, so it can be
    renamed over it), open for writing in binary: (its name, the file).
    Never through a symbolic link left at its name."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    return tmp, os.fdopen(fd, "wb")


class Journal:
    """The failures file and its progress file (see the module docstring)."""

    def __init__(self, path: str, items: Optional[Sequence[Any]], *, parse_items: bool,
                 n: Optional[int] = None) -> None:
        self.path = path
        self.done_path = done_path_for(path)
        # None: items read lazily, each failure's item given to record_failure.
        self.items = items
        self.n = len(items) if items is not None else n
        self.parse_items = parse_items  # call_many bodies: texts become JSON
        self._fail_fd = -1
        self._done_fd = -1

    def open(self, resume: bool, already_ok: Optional[Iterable[int]] = None) -> IndexSet:
        """Start a run; returns the indices already ok (not to be run).

        ``already_ok``, when given, overrides what the files say (the CLI
        knows it from its results file). The batch's length may be unknown
        (None: an iterable read lazily); then the progress file's header
        says ``"items": null`` and no length is checked.
        """
        # Before anything is read or written: a FIFO would block the reads,
        # and a directory, a FIFO or a device must not be renamed over.
        fail_at = record_path(self.path, "failures_path")
        done_at = record_path(self.done_path, "failures_path's progress file")
        n = self.n
        limit = MAX_UNSIZED_INDEX if n is None else n
        ok = IndexSet(limit=limit)
        if already_ok is not None:
            try:
                ok = already_ok if isinstance(already_ok, IndexSet) else IndexSet(
                    already_ok, limit=limit)
            except ValueError:
                raise _out_of_range(self.path, max(already_ok), n) from None
        elif resume and os.path.exists(self.done_path):
            _, ok = _read_done(self.done_path, n)
        elif resume and os.path.exists(self.path):
            if n is None:
                # "Every item it does not list" has no end to write down.
                raise ValueError(f"resume from {self.path} without its progress file "
                                 f"{self.done_path} needs the batch's length: give the "
                                 f"bodies as a list (or a sized iterable)")
            ok = IndexSet(limit=limit, complement=True)
            for i in _failed_indices(self.path):
                try:
                    ok.add(i)
                except ValueError:
                    raise _out_of_range(self.path, i, n) from None
        # The progress file first: a stop between the two leaves the old
        # failures listed, and they are not ok, so they still run.
        try:
            self._write_done(done_at, n, ok)
        except OSError as exc:
            # Name the progress file, not its temporary copy.
            raise type(exc)(exc.errno, exc.strerror, self.done_path) from None
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._done_fd = os.open(done_at, flags, 0o644)
        try:
            self._fail_fd = os.open(fail_at, flags | os.O_TRUNC, 0o644)
        except BaseException:
            os.close(self._done_fd)
            self._done_fd = -1
            raise
        return ok

    def _write_done(self, path: str, n: Optional[int], ok: IndexSet) -> None:
        """The progress file afresh (atomically) at ``path``: its header and
        ``ok``, written a block at a time."""
        tmp, fh = temp_beside(path)
        with fh:
            fh.write((_LINE.encode({"llmretry_done": 1, "items": n}) + "\n").encode("ascii"))
            if ok.complement:   # a failures file alone: every index it does not list
                assert n is not None
                indices: Iterable[int] = (i for i in range(n) if i in ok)
            else:
                indices = ok
            block: List[str] = []
            for i in indices:
                block.append(f"{i}\n")
                if len(block) >= 65536:
                    fh.write("".join(block).encode("ascii"))
                    block.clear()
            fh.write("".join(block).encode("ascii"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def record_failure(self, index: int, exc: BaseException, item: Any = None) -> None:
        """Append item ``index``'s failure (``item``: the item, when the
        batch is read lazily)."""
        if self.items is not None:
            item = self.items[index]
            item = _item_json(item)
        rec: Dict[str, Any] = {"index": index, "item": item, "error": error_record(exc)}
        line = getattr(exc, "input_line", None)     # the CLI's bad input lines
        if line is not None:
            rec["line"] = line
        try:
            line = _LINE.encode(rec)
        except (TypeError, ValueError, RecursionError):
            rec = {"index": index, "item": None, "item_repr": repr(item),
                   "error": rec["error"]}
            line = _LINE_LOOSE.encode(rec)
        _write_all(self._fail_fd, (line + "\n").encode("utf-8"))

    def record_ok(self, index: int) -> None:
        _write_all(self._done_fd, f"{index}\n".encode("ascii"))

    def close(self) -> None:
        for name in ("_fail_fd", "_done_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)


# ---------------------------------------------------------------------------
# Progress


class ProgressBar:
    """A progress display: a tqdm bar when tqdm is installed (``tqdm.auto``:
    a widget in Jupyter, text on stderr elsewhere), else one plain line on
    stderr.

    On a terminal the plain line is redrawn in place (``\r``) at most ten
    times a second; elsewhere (a log file, a pipe) a new line is printed at
    most every ten seconds (a long batch must not fill a CI log), and once
    at the end. :meth:`write` prints a line
    above the bar (``tqdm.write``, or clearing the plain line first), so
    that logs and the bar do not mix.
    """

    TTY_INTERVAL_S = 0.1    # redraws in place on a terminal
    LOG_INTERVAL_S = 10.0   # new lines elsewhere

    def __init__(self, desc: str = "llmretry", stream: Optional[TextIO] = None) -> None:
        self._clock: Callable[[], float] = time.monotonic   # a test's fake clock
        self.desc = desc
        self._stream = stream
        self._bar: Any = None
        self._tqdm_write: Optional[Callable[..., Any]] = None
        self._use_tqdm: Optional[bool] = None
        self._tty = False
        self._done = 0
        self._failed = 0
        self._total: Optional[int] = 0
        self._t0 = self._clock()
        self._last_draw = 0.0
        self._last_text = ""
        self._drawn = 0     # length of the plain line on screen; 0: none
        self._closed = False
        self._lock = threading.RLock()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def start(self, total: Optional[int]) -> None:
        """Show the bar for ``total`` items (None: not known, a lazy batch)."""
        with self._lock:
            self._total = total
            self._t0 = self._clock()
            try:    # optional: not a dependency
                # tqdm.auto: a widget in Jupyter, text elsewhere.
                tqdm: Any = importlib.import_module("tqdm.auto").tqdm
            except ImportError:
                self._use_tqdm = False
                isatty = getattr(self.stream, "isatty", None)
                self._tty = bool(isatty()) if callable(isatty) else False
                self._draw(force=True)
                return
            kw = dict(total=total, desc=self.desc, unit="item", file=self.stream,
                      dynamic_ncols=True)
            try:
                self._bar = tqdm(**kw)
            except ImportError:
                # Jupyter without ipywidgets: tqdm.notebook cannot draw its
                # widget ("IProgress not found"); tqdm's text bar can.
                tqdm = importlib.import_module("tqdm").tqdm
                self._bar = tqdm(**kw)
            self._use_tqdm = True
            self._tqdm_write = tqdm.write

    def __call__(self, done: int, total: Optional[int], failed: int) -> None:
        self.update(done, total, failed)

    def update(self, done: int, total: Optional[int], failed: int) -> None:
        """A progress callback: ``done`` of ``total`` finished, ``failed`` failed."""
        with self._lock:
            if self._use_tqdm is None:
                self.start(total)
            if self._closed:
                return
            delta = done - self._done
            changed_failed = failed != self._failed
            self._done, self._failed, self._total = done, failed, total
            if self._bar is not None:
                if changed_failed:
                    self._bar.set_postfix_str(f"failed={failed}", refresh=False)
                if delta > 0:
                    self._bar.update(delta)
                elif changed_failed:
                    self._bar.refresh()
            else:
                self._draw(force=total is not None and done >= total)

    def _line(self) -> str:
        if self._total is None:
            return f"{self.desc}: {self._done} done, {self._failed} failed"
        pct = 100 * self._done // self._total if self._total else 100
        return f"{self.desc}: {self._done}/{self._total} ({pct}%), {self._failed} failed"

    def _draw(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_draw < (self.TTY_INTERVAL_S if self._tty
                                                  else self.LOG_INTERVAL_S):
            return
        line = self._line()
        if line == self._last_text and (force or not self._tty):
            return      # nothing new to show
        self._last_draw = now
        self._last_text = line
        line += f", {now - self._t0:.1f} s"
        if self._tty:
            pad = " " * max(self._drawn - len(line), 0)
            self.stream.write("\r" + line + pad)
            self._drawn = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def write(self, message: str) -> None:
        """Print ``message`` as a line of its own, above the bar."""
        with self._lock:
            if self._tqdm_write is not None and not self._closed:
                self._tqdm_write(message, file=self.stream)
                return
            if self._drawn and not self._closed:
                self.stream.write("\r" + " " * self._drawn + "\r" + message + "\n")
                self._drawn = 0
                self._last_text = ""
                self._draw(force=True)
            else:
                self.stream.write(message + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line. Idempotent."""
        with self._lock:
            if self._closed:
                return
            if self._bar is not None:
                self._bar.close()
            elif self._use_tqdm is False:
                self._draw(force=True)
                if self._tty and self._drawn:
                    self.stream.write("\n")
                    self.stream.flush()
                self._drawn = 0
            self._closed = True


def _progress_arg(progress: Any) -> Union[None, ProgressBar, ProgressCallback]:
    if progress is None or progress is False:
        return None
    if progress is True:
        return ProgressBar()
    if isinstance(progress, ProgressBar) or callable(progress):
        return progress  # type: ignore[no-any-return]
    raise TypeError(f"progress must be a bool or a callable (done, total, failed), "
                    f"not {type(progress).__name__}")


# ---------------------------------------------------------------------------
# The summary event

def _report_logger_error(exc: BaseException) -> None:
    sys.stderr.write("Exception ignored in the logger of llm_batch_summary:\n")
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


def emit_summary(logger: Any, summary: BatchSummary) -> Dict[str, Any]:
    """Send the ``llm_batch_summary`` event to ``logger`` (a logger argument).

    A ``logging`` logger gets it at INFO when nothing failed, else at
    WARNING; a callable gets the dict. Returns the event.
    """
    event: Dict[str, Any] = {"event": "llm_batch_summary", "request_id": None,
                             "attempt": None, "model": None}
    event.update(summary.as_dict())
    if logger is None:
        return event
    level = logging.WARNING if summary.failed or not summary.completed else logging.INFO
    target: Any = logging.getLogger(LOGGER_NAME) if logger is DEFAULT else logger
    try:
        if isinstance(target, (logging.Logger, logging.LoggerAdapter)):
            if target.isEnabledFor(level):
                msg = f"llm_batch_summary {_LINE_LOOSE.encode(event)}"
                if isinstance(target, logging.LoggerAdapter):
                    msg, kwargs = target.process(msg, {})
                    extra = dict(kwargs.get("extra") or {})
                    extra["llmretry_event"] = event
                    kwargs["extra"] = extra
                    target.logger.log(level, msg, **kwargs)
                else:
                    target.log(level, msg, extra={"llmretry_event": event})
        else:
            target(event)
    except Exception as exc:    # a broken logger never loses the batch's results
        _report_logger_error(exc)
    return event


def check_logger(logger: Any) -> None:
    """TypeError for a logger argument that is not DEFAULT, None, a Logger,
    an adapter or a callable."""
    event_sink(logger)


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
        not_started)."""
        results, to_run = self.results, self.runnable
        assert results is not None      # needs_each_item() when not kept
        ok = failed = not_started = 0
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
