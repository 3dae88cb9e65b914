"""The mock's chat endpoint: a scripted reply to one request (statuses,
faults, delays, streams, outages)."""

from __future__ import annotations

import copy
import json
import selectors
import socket
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from . import _sse
from ._connection import _Abort, _Connection
from ._scripts import (DEFAULT_INTERVAL_MS, DEFAULT_STALL_MS, DEFAULT_USAGE, OUTAGE_BODY, Record,
                       Step, _CHUNK, _HANG_POLL, _NO_BODY_STATUSES, _PADDING)
from ._replies import _api_of, _huge_parts, _merge_headers, _response_body, _step_headers

if TYPE_CHECKING:
    from ._state import _Clock


class _ChatReplies(_Connection):
    """The scripted replies of the chat (and completions, responses,
    embeddings) endpoint."""

    # -- chat endpoint ----------------------------------------------------

    def _chat(self, name: str, body: bytes) -> None:
        headers: Dict[str, str] = {}
        for key, value in self.headers.items():
            key = key.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers \
                else value
        record: Record = {
            "index": 0, "time": self.arrival, "method": self.command,
            "path": self.path, "headers": headers,
            "body": body.decode("utf-8", errors="replace"),
            "client_port": int(self.client_address[1]),
            "connection": self.conn_id, "step": 0,
        }
        request_model: Optional[str] = None
        doc: Any = None
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and isinstance(doc.get("model"), str):
                request_model = doc["model"]
        except ValueError:
            pass
        name = self.server.state.routed(name, request_model)

        def stream_fields(chosen: Step) -> Record:
            # A streamed response's record has its live fields from the
            # start, so a test may read them during the step's delay; so
            # has an idle_close_ms step's.
            live: Record = {}
            if chosen.get("idle_close_ms") is not None:
                live["idle_closed"] = False
            if _sse.stream_options(chosen, doc) is None:
                return live
            return {**live, "events_sent": 0, "client_gone": False}

        admission = self.server.state.consume(name, record, stream_fields,
                                              doc)
        if admission.outage is not None:
            self._outage(admission.outage, record)
            return
        if admission.refusal is not None:
            # Refused at once, like a provider: no step, no delay, no stream.
            self._send(429, admission.refusal, admission.headers)
            return
        step, n = admission.step, admission.n
        if step.get("idle_close_ms") is not None:
            # Armed now, acted on only if the answer keeps the connection.
            self._idle_close = (step["idle_close_ms"] / 1000.0, record)

        self._delay(admission.clock, step.get("delay_ms", 0) / 1000.0)
        fault = step.get("fault")
        if fault == "reset":
            self._reset()
            return
        if fault == "close":
            self.close_connection = True
            return
        if fault == "no_headers":
            self.close_connection = True
            self._wait(step.get("stall_ms", DEFAULT_STALL_MS) / 1000.0)
            return

        status = step.get("status", 200)
        # The step's own headers come last, so a step may override (or
        # garble) a rate-limit header.
        extra = _merge_headers(admission.headers, _step_headers(step))
        stream = _sse.stream_options(step, doc)
        if stream is not None:
            self._send_stream(step, stream, status, extra, n, request_model,
                              doc, record)
            return
        if fault == "huge":
            self._send_huge(step, status, extra, n, request_model)
            return
        if (status in _NO_BODY_STATUSES and fault is None
                and "body" not in step):
            payload = self._head(status, extra, None)
            body_out = b""
        else:
            body_out = _response_body(step, status, n, request_model,
                                      _api_of(self._route_path()), doc)
            payload = self._head(status, extra, len(body_out))
        if fault in ("stall_body", "truncate"):
            self.close_connection = True
            self._write(payload + body_out[:len(body_out) // 2])
            if fault == "stall_body":
                self._wait(step.get("stall_ms", DEFAULT_STALL_MS) / 1000.0)
            return
        payload += body_out
        if fault == "trickle":
            interval = step.get("interval_ms", DEFAULT_INTERVAL_MS) / 1000.0
            for i in range(len(payload)):
                if i:
                    self._wait(interval)
                self._write(payload[i:i + 1])
            return
        self._write(payload)

    def _delay(self, clock: _Clock, seconds: float) -> None:
        """A step's ``delay_ms``, timed on its scenario's clock (an advance
        shortens it); abort the connection if the server stops."""
        if seconds > 0 and not self.server.state.sleep(
                clock, seconds, self.server.stop_event):
            raise _Abort()
        if self.server.stop_event.is_set():
            raise _Abort()

    def _outage(self, mode: str, record: Record) -> None:
        """Answer (or not) a request that met an outage."""
        if mode == "503":
            self._send(503, OUTAGE_BODY)
        elif mode == "reset":
            self._reset()
        elif mode == "close":
            self.close_connection = True
        else:  # "hang"
            self.close_connection = True
            self._hang()
            self.server.state.update(record, client_gone=True)

    def _hang(self) -> None:
        """Answer nothing until the client closes the connection; raise
        _Abort when the server stops."""
        stop = self.server.stop_event
        with selectors.DefaultSelector() as selector:
            selector.register(self.connection, selectors.EVENT_READ)
            while not stop.is_set():
                if not selector.select(_HANG_POLL):
                    continue
                try:
                    data = self.connection.recv(
                        1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""      # reset by the client: gone too
                if not data:
                    break
                # Pipelined bytes stay unread, so the socket stays readable:
                # stop watching rather than spin, and hold until stop().
                selector.unregister(self.connection)
                stop.wait()
        if stop.is_set():    # stop() shuts the socket down: not the client
            raise _Abort()

    def _send_stream(self, step: Step, opts: Dict[str, Any], status: int,
                     extra: Sequence[Tuple[str, str]], n: int,
                     request_model: Optional[str], request: Any,
                     record: Record) -> None:
        """An SSE response (see llmretry.testing._sse for the protocol)."""
        state = self.server.state
        plan = _sse.Plan(
            step, opts, n, step.get("model", request_model or "mock-model"),
            step.get("usage", copy.deepcopy(DEFAULT_USAGE)),
            _sse.include_usage(request))
        # HTTP/1.0 has no chunked coding: the body ends with the connection.
        framing = opts.get("framing", "chunked")
        chunked = framing == "chunked" and self.request_version != "HTTP/1.0"
        if not chunked:
            self.close_connection = True
        length = plan.declared_length() if framing == "length" else None
        headers = _merge_headers(_sse.head_headers(chunked), extra)
        sender = _sse.Sender(
            plan, opts, step, self.connection, self.server.stop_event,
            self._write, self._reset,
            lambda sent: state.update(record, events_sent=sent), chunked)
        try:
            reusable = sender.run(self._head(status, headers, length))
        except _sse.ClientGone:
            state.update(record, client_gone=True)
            reusable = False
        except _sse.Stopped:
            reusable = False
        if not reusable:
            self.close_connection = True

    def _send_huge(self, step: Step, status: int,
                   extra: Sequence[Tuple[str, str]], n: int,
                   request_model: Optional[str]) -> None:
        prefix, padding, suffix = _huge_parts(step, n, request_model)
        total = len(prefix) + padding + len(suffix)
        self._write(self._head(status, extra, total) + prefix)
        view = memoryview(_PADDING)
        while padding > 0:
            if self.server.stop_event.is_set():
                raise _Abort()
            count = min(padding, _CHUNK)
            self._write(view[:count])  # type: ignore[arg-type]
            padding -= count
        self._write(suffix)
