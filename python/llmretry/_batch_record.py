"""A batch's record on disk: the failures file and its ``.done`` companion,
their paths and lines, the set of finished indices, the journal that
writes them as items finish."""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from .errors import LLMError


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
    return {rec["index"]: rec for rec in _failure_records(path)}


def _failure_records(path: str) -> Iterator[Dict[str, Any]]:
    """A failures file's whole records, read line by line (each line parsed,
    then dropped: the items in it are not kept)."""
    for line in iter_lines(path):
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and type(rec.get("index")) is int:
            yield rec


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
    """The indices a failures file lists (_failure_records)."""
    return (rec["index"] for rec in _failure_records(path))


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
