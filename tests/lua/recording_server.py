"""A recording HTTP(S) server for tests/lua/transport_spec.lua (stdlib only).

Wraps ``tests/python/tls_server.py``'s ``RecordingServer`` for a Lua test,
which cannot share its memory: the server runs as a subprocess, prints its
port (and, with ``--tls``, the path of its self-signed certificate) one per
line on stdout, and rewrites ``--records FILE`` (atomically) as JSON each
time it records something::

    {"connections": N, "handshake_failures": N,
     "requests": [{"method", "path", "headers", "body"}]}

``--status`` and ``--body-file`` replace the chat.completion it answers with
(the body sent byte for byte, so it may hold invalid UTF-8). It serves until
SIGTERM, then removes the certificate's directory.

If the ``openssl`` tool is missing, ``--tls`` prints ``NO-OPENSSL`` and
exits 3 (the Lua test then skips, like the Python one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import tls_server  # noqa: E402  (tests/python, found through the path above)


class FileRecordingServer(tls_server.RecordingServer):
    """A RecordingServer that mirrors what it records into a JSON file."""

    def __init__(self, records: Path, ssl_context: Any = None) -> None:
        super().__init__(ssl_context)
        self.records_path = records
        self._dump_lock = threading.Lock()
        self._dump()

    def _dump(self) -> None:
        # The snapshot is taken under the lock: two handler threads recording
        # at once could otherwise write in the other order, the later file
        # holding the older snapshot (a request recorded, then gone from the
        # file: transport_spec's "the server saw 1 requests" of 2).
        with self._dump_lock:
            reqs = [{"method": r["method"], "path": r["path"], "headers": r["headers"],
                     "body": r["body"].decode("utf-8", "replace")} for r in self.requests]
            doc: Dict[str, Any] = {"connections": len(self.connections),
                                   "handshake_failures": len(self.handshake_failures),
                                   "requests": reqs}
            tmp = self.records_path.with_name(self.records_path.name + ".tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.records_path)

    def _record_connection(self, addr: Any) -> None:
        super()._record_connection(addr)
        self._dump()

    def _record_request(self, rec: Dict[str, Any]) -> None:
        super()._record_request(rec)
        self._dump()

    def _record_handshake_failure(self, exc: BaseException) -> None:
        super()._record_handshake_failure(exc)
        self._dump()


def reply_handler(status: int, body: bytes) -> type:
    """tls_server's handler, answering every request with status and body."""

    class Handler(tls_server._Handler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length > 0 else b""
            self.server.owner._record_request({
                "method": self.command, "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()}, "body": data})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _any  # noqa: N815

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True, type=Path)
    parser.add_argument("--tls", action="store_true", help="serve HTTPS, self-signed")
    parser.add_argument("--status", type=int, default=None)
    parser.add_argument("--body-file", type=Path, default=None)
    args = parser.parse_args()

    # SIGTERM (the test's stop(), or timeout's) raises SystemExit wherever
    # the main thread is, so the `finally` below always removes the
    # certificate's directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    certdir: Optional[str] = None
    srv: Optional[FileRecordingServer] = None
    try:
        ctx = None
        if args.tls:
            certdir = tempfile.mkdtemp(prefix="llmretry-tls-")
            try:
                cert, key = tls_server.make_self_signed(Path(certdir))
            except FileNotFoundError:
                print("NO-OPENSSL", flush=True)
                return 3
            ctx = tls_server.tls_context(cert, key)
        server = FileRecordingServer(args.records, ctx)
        if args.status is not None or args.body_file is not None:
            body = args.body_file.read_bytes() if args.body_file else json.dumps(
                tls_server.COMPLETION).encode()
            server._httpd.RequestHandlerClass = reply_handler(args.status or 200, body)
        server.start()
        srv = server  # only a started server can be stopped (shutdown waits for it)
        print(srv.port, flush=True)
        if certdir:
            print(str(Path(certdir) / "cert.pem"), flush=True)
        threading.Event().wait()
    finally:
        if srv is not None:
            srv.stop()
        if certdir:
            shutil.rmtree(certdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
