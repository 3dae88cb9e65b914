"""The ``llmretry`` command's events: printed on stderr (``--verbose``),
written to ``--events`` files, the shared store's notices."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, TextIO

from . import _llmretry
from ._logging import jsonl_logger
from ._cli_args import UsageError


def _event_printer(write: Callable[[str], None]) -> Callable[[Dict[str, Any]], None]:
    """A logger printing one line per retry and per give-up."""
    last_failure: Dict[str, str] = {}
    lock = threading.Lock()

    def on_event(ev: Dict[str, Any]) -> None:
        name = ev.get("event")
        rid = str(ev.get("request_id") or "")[:8]
        with lock:
            if name == "llm_request_failed":
                ra = f", Retry-After: {ev['retry_after']}" if ev.get("retry_after") else ""
                last_failure[rid] = f"HTTP {ev.get('status')}{ra}"
            elif name == "llm_request_error":
                last_failure[rid] = f"{ev.get('error_kind')}: {ev.get('error_message')}"
            elif name == "llm_retry_scheduled":
                write(f"  retry   {rid}  attempt {ev.get('attempt', 0) + 1} failed "
                      f"({last_failure.pop(rid, '?')}); next in {ev.get('delay_ms')} ms "
                      f"({ev.get('delay_source')})")
            elif name == "llm_request_gave_up":
                what = last_failure.pop(rid, str(ev.get("error_kind")))
                write(f"  FAILED  {rid}  after {ev.get('attempts')} attempt(s): {what} "
                      f"({ev.get('reason')})")
            elif name == "llm_shared_unavailable":
                write(f"  shared  {ev.get('error_message')}: this process paces alone "
                      f"until it is back")
            elif name == "llm_shared_recovered":
                write(f"  shared  {ev.get('shared')} is back after {ev.get('down_ms')} ms")

    return on_event


class _EventsFile:
    """``--events PATH``: every event appended as a JSON line, written
    through (never replaced: a FIFO, a terminal or a symbolic link's target
    gets them; ``-``: standard output). The first write error (ENOSPC from
    /dev/full) stops the writing, and :meth:`close` reports it."""

    def __init__(self, path: str) -> None:
        self.name = "standard output" if path == "-" else path
        self.error: Optional[OSError] = None
        self.own = path != "-"
        try:
            self.stream: TextIO = (open(path, "a", encoding="utf-8") if self.own
                                   else sys.stdout)
        except OSError as exc:
            raise UsageError(f"cannot open {path}: {exc.strerror}") from None
        self.write = jsonl_logger(self.stream)

    def __call__(self, event: Dict[str, Any]) -> None:
        if self.error is None:
            try:
                self.write(event)
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        """Close the file; a UsageError naming it if a write failed."""
        try:
            if self.own and not self.stream.closed:
                self.stream.close()
        except OSError as exc:
            self.error = self.error or exc
        if self.error is not None:
            error, self.error = self.error, None
            raise UsageError(f"cannot write --events {self.name}: {error.strerror}")


def _close_events(opened: List[_EventsFile], report: bool = True) -> None:
    """Close the events files; raise the first write error when ``report``."""
    first: Optional[UsageError] = None
    for events in opened:
        try:
            events.close()
        except UsageError as exc:
            first = first or exc
    if first is not None and report:
        raise first


def _logger(args: argparse.Namespace, write: Callable[[str], None],
            opened: List[_EventsFile]) -> Optional[Callable[[Dict[str, Any]], None]]:
    sinks: List[Callable[[Dict[str, Any]], Any]] = []
    if args.verbose:
        sinks.append(_event_printer(write))
    if args.events:
        events = _EventsFile(args.events)
        opened.append(events)
        sinks.append(events)
    if not args.verbose and (getattr(args, "shared", None) or os.environ.get("LLMRETRY_SHARED")):
        sinks.append(_shared_notices(write))
    if not sinks:
        return None
    if len(sinks) == 1:
        return sinks[0]

    def both(ev: Dict[str, Any]) -> None:
        for sink in sinks:
            sink(ev)

    return both


def _shared_notices(write: Callable[[str], None]) -> Callable[[Dict[str, Any]], None]:
    """Without -v, a shared store that goes away or comes back is still said
    (the engine builds no other event for it)."""
    printer = _event_printer(write)
    bits = sum(1 << i for i, name in enumerate(_llmretry.EVENT_NAMES)
               if name.startswith("llm_shared_"))

    def on_event(ev: Dict[str, Any]) -> None:
        if str(ev.get("event", "")).startswith("llm_shared_"):
            printer(ev)

    on_event.event_mask = lambda: bits  # type: ignore[attr-defined]
    return on_event


def _stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
