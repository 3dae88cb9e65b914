"""Small local servers for tests/python/test_transport.py (stdlib only).

``RecordingServer`` is a threaded HTTP/1.1 server that records every TCP
connection it accepts and every request it reads (method, path, headers,
body), and answers each request with a valid chat.completion. Given an
``ssl.SSLContext`` it serves HTTPS instead: the TLS handshake runs in the
connection's own thread, and a handshake the client aborts (as a verifying
client does with a self-signed certificate) is recorded in
``handshake_failures``.

``make_self_signed`` makes a throw-away certificate for 127.0.0.1 with the
``openssl`` command line tool.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

COMPLETION = {
    "id": "chatcmpl-tls",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "tls-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "over tls"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}


def make_self_signed(directory: Path) -> Tuple[Path, Path]:
    """A self-signed certificate and key for CN/IP 127.0.0.1 in directory.

    Raises FileNotFoundError when the openssl tool is missing.
    """
    if shutil.which("openssl") is None:
        raise FileNotFoundError("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    return cert, key


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        self.server.owner._record_request({
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
        })
        out = json.dumps(COMPLETION).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any  # noqa: N815


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: "RecordingServer"

    def get_request(self) -> Tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        self.owner._record_connection(addr)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        ctx = self.owner.ssl_context
        if ctx is not None:
            request.settimeout(10)
            try:
                request = ctx.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.owner._record_handshake_failure(exc)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up mid-request is not a test failure


class RecordingServer:
    """A local server recording what reaches it; a context manager."""

    def __init__(self, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.ssl_context = ssl_context
        self._lock = threading.Lock()
        self._connections: List[Any] = []
        self._requests: List[Dict[str, Any]] = []
        self._handshake_failures: List[str] = []
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def _record_connection(self, addr: Any) -> None:
        with self._lock:
            self._connections.append(addr)

    def _record_request(self, rec: Dict[str, Any]) -> None:
        with self._lock:
            self._requests.append(rec)

    def _record_handshake_failure(self, exc: BaseException) -> None:
        with self._lock:
            self._handshake_failures.append(repr(exc))

    @property
    def connections(self) -> List[Any]:
        with self._lock:
            return list(self._connections)

    @property
    def requests(self) -> List[Dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    @property
    def handshake_failures(self) -> List[str]:
        with self._lock:
            return list(self._handshake_failures)

    def start(self) -> "RecordingServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> "RecordingServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx
