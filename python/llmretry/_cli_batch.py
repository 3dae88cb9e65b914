"""``llmretry batch``: the results file, interrupts, the run and its
summary."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from . import _batch, _batch_api_cli
from ._bodies import _LazyBodies
from ._client import Client, Result
from .errors import InvalidResponseError, LLMError
from ._cli_args import PROG, UsageError, _client_defaults, _make_client, _read_schema
from ._cli_events import _EventsFile, _close_events, _logger, _stderr_line
from ._cli_input import (InvalidInputError, MAX_BAD_LINES, _Input, _LINE, _bad_lines_error,
                         _line_index, _read_response_format, _read_results, _requests,
                         _result_line, _scan_requests)


class _Output:
    """Where ``-o PATH`` goes. A regular file (or a new one) is written in
    place: appended as items finish, then replaced by its sorted copy (a
    rename). A stream, that is standard output (``-o -``), a FIFO or a
    character device (``/dev/null``, a terminal), is written through at the
    end, in input order; its lines wait in a temporary file meanwhile. A
    symbolic link is followed: the file it points to is written, the link
    stays. Anything else (a directory, a block device, a socket) is a usage
    error, before anything runs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = "standard output" if path == "-" else path
        self.regular = path != "-"
        if path == "-":
            return
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None     # a new file (or the target of a dangling link, created)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None
        if mode is not None and not stat.S_ISREG(mode):
            if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
                raise UsageError(f"-o {path}: it is {_batch._file_kind(mode)}, not a file "
                                 f"to write results to")
            self.regular = False
        elif os.path.islink(path):
            # The rename that rewrites the file goes to the link's target:
            # renamed over the link, it would replace the link itself.
            self.path = os.path.realpath(path)

    def open_stream(self) -> Any:
        """A stream output, open for writing (binary): at the start, so that
        a path that cannot be written fails before any call (a FIFO waits
        here for its reader)."""
        if self.path == "-":
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", None)
            if out is None:
                raise UsageError("-o -: standard output does not take bytes here")
            return out
        try:
            return open(self.path, "wb")
        except OSError as exc:
            raise UsageError(f"cannot write {self.name}: {exc.strerror}") from None


class _ResultsFile:
    """The results file: appended as items finish (so a crash or Ctrl-C
    leaves every finished item in it, in the order they finished), sorted
    into input order at the end by an external merge sort (runs of at most
    SORT_RUN_BYTES in memory), so that memory does not grow with the batch.
    For a stream output (:class:`_Output`) the file is a temporary one,
    copied to the stream at the end (sorted) or when the run stops (as
    it is)."""

    SORT_RUN_BYTES = 4 << 20
    SORT_RUN_LINES = 10000

    def __init__(self, output: _Output, kept: Optional[_batch.IndexSet]) -> None:
        self.output = output
        self.fd = -1
        self.stream: Any = None
        self.spool_dir: Optional[str] = None
        if output.regular:
            self.path = output.path
        else:
            import tempfile
            self.stream = output.open_stream()
            self.spool_dir = tempfile.mkdtemp(prefix="llmretry-results-")
            self.path = os.path.join(self.spool_dir, "results.jsonl")
        try:
            tmp, out = _batch.temp_beside(self.path)
            with out:
                if kept is not None and len(kept):
                    # The earlier run's ok lines (the last of each wins at the end).
                    for line in _batch.iter_lines(self.path):
                        index, ok = _line_index(line)
                        if ok and index in kept:
                            out.write(line.encode("utf-8") + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._drop_stream()
            raise UsageError(f"cannot write {output.name}: {exc.strerror}") from None

    def append(self, index: int, value: Any) -> None:
        _batch._write_all(self.fd, (_result_line(index, value) + "\n").encode("utf-8"))

    def close(self) -> None:
        """Stop appending. A stream output not yet written gets the lines
        that finished, in the order they finished (the run was stopped)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.stream is not None:
            try:
                self._deliver(self.path)
            except UsageError as exc:
                _stderr_line(f"{PROG}: {exc}")

    def _deliver(self, path: str) -> None:
        """Copy ``path`` to the stream output, then close it and drop the
        temporary files (once). A write error (ENOSPC from /dev/full, EPIPE
        from a reader that left) is a UsageError naming the output."""
        stream = self.stream
        try:
            with open(path, "rb") as src:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    stream.write(block)
            stream.flush()
        except OSError as exc:
            raise UsageError(f"cannot write {self.output.name}: {exc.strerror}") from None
        finally:
            self._drop_stream()

    def _drop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if self.spool_dir is not None:
            import shutil
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            self.spool_dir = None
        if stream is not None and self.output.path != "-":
            try:
                stream.close()
            except OSError:
                pass    # a buffered write that failed was reported by flush()

    def finish(self, n: int) -> None:
        """Rewrite the file in input order, one line per request (the last
        line of each index wins; a missing one was completed by an earlier
        run whose result is gone); a stream output gets it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        import heapq
        import tempfile
        folder = tempfile.mkdtemp(prefix=".llmretry-sort-",
                                  dir=os.path.dirname(os.path.abspath(self.path)))
        try:
            runs: List[Any] = []
            chunk: List[Tuple[int, str]] = []
            size = 0

            def spill() -> None:
                chunk.sort(key=lambda kv: kv[0])    # stable: later lines stay later
                fh = tempfile.TemporaryFile(dir=folder)
                fh.write("".join(f"{i} {line}\n" for i, line in chunk).encode("utf-8"))
                fh.seek(0)
                runs.append(fh)
                chunk.clear()

            for line in _batch.iter_lines(self.path):
                index, _ok = _line_index(line, strict=False)   # this run's, or checked
                if index is None or not 0 <= index < n:
                    continue
                chunk.append((index, line))
                size += len(line)
                if size >= self.SORT_RUN_BYTES or len(chunk) >= self.SORT_RUN_LINES:
                    spill()
                    size = 0
            if runs:
                spill()
                merged: Iterable[Tuple[int, str]] = heapq.merge(
                    *(_run_lines(fh) for fh in runs), key=lambda kv: kv[0])
            else:
                chunk.sort(key=lambda kv: kv[0])
                merged = chunk
            tmp, out = _batch.temp_beside(self.path)
            with out:
                nxt = 0         # the next index to write
                held: Optional[str] = None
                block: List[str] = []

                def put(text: str) -> None:
                    block.append(text)
                    if len(block) >= 4096:
                        out.write("".join(block).encode("utf-8"))
                        block.clear()

                for index, line in merged:
                    if held is not None and index != nxt:
                        put(held + "\n")
                        held = None
                        nxt += 1
                    while nxt < index:
                        put(_skipped_line(nxt))
                        nxt += 1
                    held = line     # a later line of the same index replaces it
                if held is not None:
                    put(held + "\n")
                    nxt += 1
                while nxt < n:
                    put(_skipped_line(nxt))
                    nxt += 1
                out.write("".join(block).encode("utf-8"))
                out.flush()
                os.fsync(out.fileno())
            if self.stream is not None:
                self._deliver(tmp)
            else:
                os.replace(tmp, self.path)
        finally:
            import shutil
            for fh in locals().get("runs", []):
                fh.close()
            shutil.rmtree(folder, ignore_errors=True)


def _run_lines(fh: Any) -> Iterator[Tuple[int, str]]:
    """A sorted run's (index, line) pairs, as spilled by _ResultsFile.finish."""
    for raw in fh:
        index, _, line = raw.decode("utf-8").rstrip("\n").partition(" ")
        yield int(index), line


def _skipped_line(index: int) -> str:
    return _LINE.encode({"index": index, "ok": True, "skipped": True}) + "\n"


class _Interrupts:
    """Ctrl-C deferred while an item is being recorded, so that its result
    line and its record are written both or neither."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False

    def handler(self, signum: int, frame: Any) -> None:
        if self.depth:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                self.pending = False
                raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = signal.signal(signal.SIGINT, self.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)


class _CliBatch(_batch.Batch):
    """A Batch whose items are recorded with Ctrl-C deferred."""

    interrupts: _Interrupts

    def item_done(self, index: int, value: Any, failed: bool,
                  outcome: Optional[Any] = None, not_started: bool = False,
                  item: Any = None) -> None:
        if not failed and isinstance(value, Result) and not _writable(value):
            value, failed = _unwritable(value), True
        with self.interrupts.critical():
            super().item_done(index, value, failed, outcome, not_started, item)


def _writable(res: Result) -> bool:
    """Whether a result's data can be written as a results line: data that
    Python's decoder just managed to read (near its recursion limit) may be
    too deep for its encoder, which runs on a deeper stack."""
    try:
        _LINE.encode(res.data)
    except RecursionError:
        return False
    return True


def _unwritable(res: Result) -> LLMError:
    """A success the results file cannot hold, as the invalid response it is
    to this command: a failure, listed as such and run again by --resume."""
    m = res.meta
    return InvalidResponseError(
        f"HTTP {m.status} with a body nested too deeply to be written as a results line",
        status=m.status, attempt=m.attempt, attempts=m.attempts, request_id=m.request_id,
        reason="not_retryable", model=m.model, duration_ms=m.duration_ms,
        total_ms=m.total_ms)


def run_batch(args: argparse.Namespace) -> int:
    """``llmretry batch``: returns the exit status.

    The input is read twice, a line at a time, and results are written as
    items finish: memory does not grow with the number of lines (the batch
    keeps no results, its record is a bitmap)."""
    inp = _Input(args.input)
    try:
        return _run_batch(args, inp)
    finally:
        inp.close()


def _run_batch(args: argparse.Namespace, inp: _Input) -> int:
    output = _Output(os.fspath(args.output))
    if args.failures is not None:
        _check_failures_path(args.failures)
        if output.regular and os.path.realpath(args.failures) == os.path.realpath(output.path):
            raise UsageError("--failures and -o must be different files")
    if output.path == "-" and args.events == "-":
        raise UsageError("-o - and --events - cannot both write to standard output")
    fmt = None if args.response_format is None \
        else _read_response_format(args.response_format, args.endpoint)
    n, bad, linenos = _scan_requests(inp, args.model, args.stream, fmt)
    # A stream output holds no earlier results: --resume goes by --failures.
    kept = _read_results(output.path, n) if args.resume and output.regular else None
    already_ok: Optional[_batch.IndexSet] = None
    if kept is not None:
        already_ok = kept
    elif args.resume and args.failures is None:
        already_ok = _batch.IndexSet(limit=max(n, 1))   # nothing to resume from: a first run
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    bar = _batch.ProgressBar(desc=PROG) if show_progress else None
    write = bar.write if bar is not None else _stderr_line
    opened: List[_EventsFile] = []
    results: Optional[_ResultsFile] = None
    client: Optional[Client] = None
    interrupts = _Interrupts()
    try:
        logger = _logger(args, write, opened)
        client = _make_client(args, logger)
        options = _client_defaults(args)
        if args.call_deadline_ms is not None:
            options["deadline_ms"] = args.call_deadline_ms
        if args.schema is not None:
            options["schema"] = _read_schema(args.schema)
        plan, prep = client._batch_prep(args.policy, options)
        if bad and not args.skip_invalid:
            raise _bad_lines_error(args.input, bad)
        invalid = {k: InvalidInputError(why, linenos[k]) for k, why in bad.items()}
        for k in sorted(bad)[:MAX_BAD_LINES]:
            write(f"{PROG}: skipped: {bad[k]}")
        if len(bad) > MAX_BAD_LINES:
            write(f"{PROG}: skipped {len(bad) - MAX_BAD_LINES} more bad lines")
        results = _ResultsFile(output, kept)
        if args.via == "batch-api":
            # This module holds the helpers it uses (PROG, UsageError,
            # _CliBatch, _requests, _bad_lines_error, _print_summary).
            return _batch_api_cli.run(args, sys.modules[__name__], inp, n, bad, client, options,
                                      logger, results, kept, bar, output, interrupts, write)
        batch = _CliBatch(None, n=n, failures_path=args.failures,
                          resume=args.resume and args.failures is not None,
                          progress=bar if bar is not None else False,
                          on_result=results.append, logger=logger, parse_items=True,
                          keep_results=False)
        batch.interrupts = interrupts
        source = _LazyBodies(_requests(inp, args.model, args.stream, bad, fmt), prep)
        try:
            with interrupts.installed():
                client._run_batch(batch, source, plan, args.limit, args.deadline_ms,
                                  args.adaptive, already_ok=already_ok, invalid=invalid)
        except KeyboardInterrupt:
            results.close()
            if batch.summary is not None:
                _print_summary(batch.summary, output.name, args.failures, interrupted=True)
            return 130
        except OSError as exc:
            raise UsageError(f"{exc.filename or 'a file'}: {exc.strerror}") from None
        results.finish(n)
        summary = batch.summary
        assert summary is not None
        _print_summary(summary, output.name, args.failures, interrupted=False)
        client.close()      # no event after this
        _close_events(opened)
        return 0 if summary.failed == 0 else 1
    finally:
        if results is not None:
            results.close()
        if client is not None:
            client.close()
        _close_events(opened, report=False)


def _check_failures_path(path: str) -> None:
    """--failures names a regular file (or a new one), as its progress file
    does: both are read back by --resume and the progress file is replaced
    by a rename. Checked before anything runs or is written."""
    if path == "-":
        raise UsageError("--failures -: the failures file is read back by --resume, "
                         "so it must be a file")
    try:
        _batch.record_path(path, "the failures file")
        _batch.record_path(_batch.done_path_for(path), "the progress file of --failures")
    except OSError as exc:
        raise UsageError(f"--failures {exc.filename}: {exc.strerror}") from None


def _print_summary(summary: _batch.BatchSummary, output: str, failures: Optional[str],
                   interrupted: bool) -> None:
    head = "interrupted" if interrupted else "done"
    text = summary.format().replace("\n", "\n  ")
    lines = [f"{PROG} batch {head}: {text}", f"  results: {output}"]
    if failures is not None:
        lines.append(f"  failures: {failures} ({summary.failed} this run)")
    if interrupted or summary.failed:
        lines.append("  run the same command with --resume to retry what did not succeed")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
