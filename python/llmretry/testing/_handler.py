"""The mock's request handler: one keep-alive connection, its control API
(``/_mock/...``) and its scripted replies."""

from __future__ import annotations

import copy
import email.utils
import json
import os
import selectors
import socket
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

from . import _batches, _sse
from ._scripts import (DEFAULT_INTERVAL_MS, DEFAULT_STALL_MS, DEFAULT_USAGE, OUTAGE_BODY, Record,
                       ScriptError, Step, _CHUNK, _HANG_POLL, _MAX_BODY, _NO_BODY_STATUSES,
                       _PADDING)
from ._replies import (_api_of, _huge_parts, _merge_headers, _reason, _response_body,
                       _step_headers, _strict_refusal)

if TYPE_CHECKING:
    from ._server import _HTTPServer


class _Abort(Exception):
    """The connection is gone (or must go): write nothing more."""


class _BadRequest(Exception):
    """A request whose body cannot be framed; answer 400 and close."""


class _Handler(BaseHTTPRequestHandler):
    """One keep-alive connection: control API and scripted chat replies."""

    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "llmretry-mock/0.1"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.conn_id = self.server.connection_id(self.request)
        self._dead = False
        # (seconds, record) of an answered step's idle_close_ms, or None.
        self._idle_close: Optional[Tuple[float, Record]] = None

    # -- plumbing ---------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Stay quiet: no per-request logging."""

    def handle_one_request(self) -> None:
        idle, self._idle_close = self._idle_close, None
        if idle is not None and not self._request_within(idle[0]):
            # A keep-alive timeout (uvicorn's): close the idle connection
            # (FIN) before the record says so, so a client told of it can
            # never send on the connection first.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.server.state.update(idle[1], idle_closed=True)
            return
        try:
            super().handle_one_request()
        except _Abort:
            self.close_connection = True

    def _request_within(self, seconds: float) -> bool:
        """Does the next request (or the client's EOF, or a stop) come
        within ``seconds``? Bytes already buffered count at once."""
        self.connection.settimeout(seconds)
        try:
            self.rfile.peek(1)
            return True
        except socket.timeout:
            return False
        except OSError:
            return True     # the request read will meet it
        finally:
            self.connection.settimeout(None)

    def _write(self, data: bytes) -> None:
        if self._dead:
            raise _Abort()
        try:
            self.wfile.write(data)
        except OSError as exc:
            self._dead = True
            raise _Abort() from exc

    def _wait(self, seconds: float) -> None:
        """Sleep ``seconds``; abort the connection if the server stops."""
        if seconds > 0 and self.server.stop_event.wait(seconds):
            raise _Abort()
        if self.server.stop_event.is_set():
            raise _Abort()

    def _reset(self) -> None:
        """Close the socket with a TCP RST and forget it."""
        sock = self.connection
        self._dead = True
        self.close_connection = True
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            # rfile/wfile keep the socket object alive, so close the file
            # descriptor itself; later calls on the object fail harmlessly.
            os.close(sock.detach())
        except OSError:
            pass

    def _head(self, status: int, headers: Sequence[Tuple[str, str]],
              body_length: Optional[int]) -> bytes:
        base: List[Tuple[str, str]] = [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Content-Type", "application/json"),
        ]
        if body_length is not None:
            base.append(("Content-Length", str(body_length)))
        merged = _merge_headers(base, headers)
        for name, value in merged:
            if name.lower() == "connection" and value.lower() == "close":
                self.close_connection = True
        names = {name.lower() for name, _ in merged}
        if "connection" not in names:
            if self.close_connection:
                merged.append(("Connection", "close"))
            elif self.request_version == "HTTP/1.0":
                merged.append(("Connection", "keep-alive"))
        lines = [f"HTTP/1.1 {status} {_reason(status)}"]
        lines.extend(f"{name}: {value}" for name, value in merged)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    def _send(self, status: int, body: Optional[bytes],
              headers: Sequence[Tuple[str, str]] = ()) -> None:
        if body is None:
            self._write(self._head(status, headers, None))
        else:
            self._write(self._head(status, headers, len(body)) + body)

    def _send_json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode("utf-8"))

    def _send_error_json(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {
            "message": message, "type": "invalid_request_error",
            "code": None}})

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text.strip())
        except ValueError:
            raise _BadRequest("bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise _BadRequest("bad Content-Length")
        body = self.rfile.read(length)
        if len(body) != length:
            raise _Abort()  # the client went away mid-body
        return body

    def _read_chunked(self) -> bytes:
        parts: List[bytes] = []
        while True:
            line = self.rfile.readline(65537)
            if not line:
                raise _Abort()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest("bad chunk size") from None
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = self.rfile.readline(65537)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            data = self.rfile.read(size)
            if len(data) != size:
                raise _Abort()
            parts.append(data)
            self.rfile.readline(65537)

    def _route_path(self) -> str:
        target = self.path
        if target.startswith(("http://", "https://")):
            return urlsplit(target).path or "/"
        return target.split("?", 1)[0].split("#", 1)[0]

    # -- methods ----------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except _BadRequest as exc:
            self.close_connection = True
            self._send_error_json(400, str(exc))
            return
        path = self._route_path()
        method = self.command
        if _batches.handles(path):     # the Files and Batch APIs (strict or not)
            status, ctype, doc = self.server.state.batch_store.handle(
                method, path, self.headers.get("Content-Type") or "", body)
            self._send(status, doc if status != 204 else None,
                       [("Content-Type", ctype)] if ctype else [])
            return
        if self.server.strict and not path.startswith("/_mock/"):
            refusal = _strict_refusal(method, path, body)
            if refusal is not None:     # not recorded: no step consumed
                self._send_json(*refusal)
                return
        if path.startswith("/_mock/"):
            self._control(method, path, body)
        elif path.endswith(("/completions", "/responses", "/embeddings")):
            if method != "POST":
                self._send_error_json(405, f"method {method} not allowed")
                return
            name = "default"
            if path.startswith("/s/"):
                name = unquote(path[3:].split("/", 1)[0]) or "default"
            self._chat(name, body)
        else:
            self._send_error_json(404, f"no route for {method} {path}")

    # -- control API ------------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> None:
        state = self.server.state
        allowed: Tuple[str, ...]
        if path.startswith("/_mock/scenarios/") and len(path) > 17:
            allowed = ("PUT",)
            if method == "PUT":
                name = unquote(path[len("/_mock/scenarios/"):])
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the script must be a JSON object")
                    state.script(name, doc.get("steps"), doc.get("after"),
                                 doc.get("limits"), doc.get("outage"),
                                 doc.get("route"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad script: {exc}")
                    return
                self._send(204, None)
                return
        elif path.startswith("/_mock/requests/") and len(path) > 16:
            allowed = ("GET", "DELETE")
            name = unquote(path[len("/_mock/requests/"):])
            if method == "GET":
                self._send_json(200, state.records(name))
                return
            if method == "DELETE":
                state.clear(name)
                self._send(204, None)
                return
        elif path.startswith("/_mock/limits/") and len(path) > 14:
            allowed = ("GET",)
            if method == "GET":
                name = unquote(path[len("/_mock/limits/"):])
                stats = state.limit_stats(name)
                if stats is None:
                    self._send_error_json(
                        404, f"scenario {name!r} has no limits")
                else:
                    self._send_json(200, stats)
                return
        elif path.startswith("/_mock/outage/") and len(path) > 14:
            allowed = ("PUT", "DELETE", "GET")
            name = unquote(path[len("/_mock/outage/"):])
            if method == "PUT":
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the outage must be a JSON object")
                    unknown = sorted(set(doc) - {"mode", "for_ms"})
                    if unknown:
                        raise ScriptError(f"outage: unknown field(s) "
                                          f"{unknown} (known: for_ms, mode)")
                    state.start_outage(name, doc.get("mode", "503"),
                                       doc.get("for_ms"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad outage: {exc}")
                    return
                self._send(204, None)
                return
            if method == "DELETE":
                state.end_outage(name)
                self._send(204, None)
                return
            if method == "GET":
                self._send_json(200, state.outage_stats(name))
                return
        elif path == "/_mock/connections":
            allowed = ("GET",)
            if method == "GET":
                with state.lock:
                    accepted = state.accepted
                self._send_json(200, {"accepted": accepted})
                return
        elif path == "/_mock/health":
            allowed = ("GET",)
            if method == "GET":
                self._send_json(200, {"ok": True})
                return
        else:
            self._send_error_json(404, f"no route for {method} {path}")
            return
        self._send_error_json(405, f"method {method} not allowed "
                                   f"(allowed: {', '.join(allowed)})")

    # -- chat endpoint ----------------------------------------------------

    def _chat(self, name: str, body: bytes) -> None:
        headers: Dict[str, str] = {}
        for key, value in self.headers.items():
            key = key.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers \
                else value
        record: Record = {
            "index": 0, "time": time.time(), "method": self.command,
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

        self._wait(step.get("delay_ms", 0) / 1000.0)
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
