"""The mock's connection plumbing: one keep-alive HTTP/1.1 connection, its
request bodies, response heads, waits that end when the server stops, and
resets (the control API and the replies build on it: ``_handler``,
``_chat``)."""

from __future__ import annotations

import email.utils
import errno
import io
import json
import os
import platform
import socket
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ._scripts import _MAX_BODY, Record
from ._replies import _merge_headers, _reason

if TYPE_CHECKING:
    from ._server import _HTTPServer


# Linux's SO_TIMESTAMPNS (and its control message, SCM_TIMESTAMPNS, of the
# same number): the kernel stamps each segment it receives with a struct
# timespec. Python's socket module does not name them; 35 is their number
# on x86 and arm (other systems: no stamps, the mock's own clock).
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")
_STAMP_SPACE = (socket.CMSG_SPACE(_TIMESPEC.size)
                if sys.platform == "linux" and hasattr(socket, "CMSG_SPACE")
                and platform.machine() in ("x86_64", "i686", "i386", "aarch64", "armv7l")
                else 0)


class _StampedReader(socket.SocketIO):
    """A socket's reads that keep the kernel's time of arrival of the bytes
    read last (``stamp``, Unix seconds, or None). A request's record takes
    its time from here: a thread of a loaded machine may read a request
    150 ms after it came, and four requests paced 50 ms apart would seem
    to come at once."""

    stamp: Optional[float] = None

    def readinto(self, b: Any) -> Optional[int]:
        self._checkClosed()
        self._checkReadable()
        try:
            n, ancdata, _flags, _addr = self._sock.recvmsg_into([b], _STAMP_SPACE)
        except socket.timeout:
            self._timeout_occurred = True    # as socket.SocketIO does
            raise
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS \
                    and len(data) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack(data[:_TIMESPEC.size])
                self.stamp = seconds + nanoseconds / 1e9
        return n


def _stamped_reader(sock: socket.socket) -> Optional[io.BufferedReader]:
    """A buffered reader of ``sock`` that keeps arrival times, or None where
    the kernel does not stamp (not Linux on x86 or arm)."""
    if not _STAMP_SPACE:        # recvmsg_into is there wherever stamps are
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return None
    return io.BufferedReader(_StampedReader(sock, "rb"), io.DEFAULT_BUFFER_SIZE)


class _Abort(Exception):
    """The connection is gone (or must go): write nothing more."""


class _BadRequest(Exception):
    """A request whose body cannot be framed; answer 400 and close."""


class _Connection(BaseHTTPRequestHandler):
    """One keep-alive connection's plumbing (no routes)."""

    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "llmretry-mock/0.1"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        stamped = _stamped_reader(self.connection)
        if stamped is not None:
            self.rfile.close()
            self.rfile = stamped
        self.arrival = 0.0
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

    def parse_request(self) -> bool:
        # The request line has just been read: when did it come? The
        # kernel's stamp of the bytes read last, if that read took them
        # (a line already buffered, pipelined behind the last request, has
        # no stamp of its own: it is timed now).
        raw, stamp = getattr(self.rfile, "raw", None), None
        if isinstance(raw, _StampedReader):
            stamp, raw.stamp = raw.stamp, None
        self.arrival = stamp if stamp is not None else time.time()
        return super().parse_request()

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
