"""Writing a planned mock SSE stream on a connection: its waits, keep-alive
comments, split writes and end faults (the protocol is described in
``llmretry.testing._sse``)."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._sse_plan import Plan, split_point

Step = Dict[str, Any]

DEFAULT_STALL_MS = 30000
DEFAULT_SPLIT_DELAY_MS = 10
BOM = b"\xef\xbb\xbf"
# The longest a wait sleeps before looking at the stop flag again; stop()
# also shuts the sockets down, which wakes the poll at once.
_POLL_SLICE = 0.1


class ClientGone(Exception):
    """The client closed the connection mid-stream."""


class Stopped(Exception):
    """The server is stopping: write nothing more."""


# --------------------------------------------------------------------------
# Sending
# --------------------------------------------------------------------------

class Sender:
    """Writes one planned stream on a connection.

    ``write`` sends bytes (raising on a dead connection); ``reset`` aborts
    the connection with an RST; ``progress(events_sent)`` is told each
    time a data event has been written. Raises ClientGone or Stopped; any
    other outcome returns ``True`` when the connection may be reused.
    """

    def __init__(self, plan: Plan, opts: Dict[str, Any], step: Step,
                 sock: socket.socket, stop_event: threading.Event,
                 write: Callable[[bytes], None], reset: Callable[[], None],
                 progress: Callable[[int], None], chunked: bool) -> None:
        self.plan = plan
        self.sock = sock
        self.stop_event = stop_event
        self._write_raw = write
        self._reset = reset
        self._progress = progress
        self.chunked = chunked
        self.delay = opts.get("delay_ms", 0) / 1000.0
        self.first_delay = opts.get("first_delay_ms", 0) / 1000.0
        self.keepalive = (opts.get("keepalive_ms") or 0) / 1000.0
        self.stall = opts.get("stall_ms", step.get(
            "stall_ms", DEFAULT_STALL_MS)) / 1000.0
        self.split = opts.get("split_writes", False)
        self.split_delay = opts.get(
            "split_delay_ms", DEFAULT_SPLIT_DELAY_MS) / 1000.0
        self.pending_bom = BOM if opts.get("bom") else b""
        self.sent = 0
        self._watch = True
        self._poller: Optional[Any] = None
        if hasattr(select, "poll"):  # select() cannot take fds >= 1024
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)

    def run(self, head: bytes) -> bool:
        """Send the response head, then the stream."""
        self._send(head)
        plan = self.plan
        count = len(plan.events) if plan.end in ("done", "no_done") \
            else plan.after
        for event in plan.events[:count]:
            self._pause_before_event()
            self._event(event)
        if plan.end == "done":
            self._event(plan.done)
        elif plan.end == "error_event":
            self._pause_before_event()
            self._event(plan.error_event)
        elif plan.end == "reset":
            self._pause_before_event()
            self._reset()
            return False
        elif plan.end in ("drop", "stall"):
            self._pause_before_event()
            if plan.end == "stall":
                self._pause(self.stall, self.keepalive)
            return False
        if plan.hold:
            # A body that never ends: junk first if asked, then silence
            # until the client closes (or stall_ms).
            for junk in plan.junk:
                self._emit(junk)
            self._pause(self.stall, 0)
            return False
        if self.chunked:
            self._send(b"0\r\n\r\n")
            return True
        return False

    # -- writing ----------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self._write_raw(data)
        except Exception as exc:  # the handler's own "connection dead"
            if self.stop_event.is_set():
                raise Stopped() from exc
            raise ClientGone() from exc

    def _piece(self, data: bytes) -> None:
        if self.chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        self._send(data)

    def _emit(self, data: bytes) -> None:
        """One event or comment, split in two writes if asked."""
        data = self.pending_bom + data
        self.pending_bom = b""
        at = split_point(data, self.plan.le, self.split)
        if at:
            self._piece(data[:at])
            self._pause(self.split_delay, 0)
            data = data[at:]
        self._piece(data)

    def _event(self, data: bytes) -> None:
        self._emit(data)
        self.sent += 1
        self._progress(self.sent)

    # -- waiting ----------------------------------------------------------

    def _pause_before_event(self) -> None:
        self._pause(self.delay if self.sent else self.first_delay,
                    self.keepalive)

    def _pause(self, seconds: float, keepalive: float) -> None:
        """Wait, sending comments every ``keepalive`` s, watching the peer."""
        now = time.monotonic()
        deadline = now + seconds
        next_comment = now + keepalive if keepalive > 0 else float("inf")
        while True:
            if self.stop_event.is_set():
                raise Stopped()
            now = time.monotonic()
            if now >= next_comment and next_comment < deadline:
                # Due within the wait: sent even when this thread woke
                # late (a loaded machine), so every wait carries its
                # comments and a test can count on them.
                self._emit(self.plan.comment)
                next_comment += keepalive
                continue
            if now >= deadline:
                return
            timeout = min(deadline, next_comment, now + _POLL_SLICE) - now
            if self._watch:
                self._watch_peer(timeout)
            else:
                self.stop_event.wait(timeout)

    def _watch_peer(self, timeout: float) -> None:
        """Sleep up to ``timeout`` s; raise ClientGone on the peer's EOF."""
        try:
            if self._poller is not None:
                readable = bool(self._poller.poll(max(1, int(timeout * 1000))))
            else:
                readable = bool(select.select([self.sock], [], [], timeout)[0])
        except (OSError, ValueError):  # a descriptor select cannot take
            self._watch = False
            return
        if not readable:
            return
        try:
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:
            if self.stop_event.is_set():
                raise Stopped() from exc
            raise ClientGone() from exc
        if self.stop_event.is_set():
            raise Stopped()
        if not data:
            raise ClientGone()
        # The client sent more (a pipelined request): its bytes stay unread,
        # so the socket stays readable; stop watching rather than spin.
        self._watch = False


def head_headers(chunked: bool) -> List[Tuple[str, str]]:
    """The stream's own response headers (the step's may override them)."""
    out = [("Content-Type", "text/event-stream"),
           ("Cache-Control", "no-cache")]
    if chunked:
        out.append(("Transfer-Encoding", "chunked"))
    return out
