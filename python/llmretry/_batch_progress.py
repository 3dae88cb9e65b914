"""A batch's progress (the bar, or a callback) and its summary event."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, TextIO, Union

from ._batch_record import _LINE_LOOSE
from ._logging import DEFAULT, LOGGER_NAME, event_sink

if TYPE_CHECKING:
    from ._batch import BatchSummary, ProgressCallback


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
