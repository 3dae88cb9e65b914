"""The mock's HTTP server, :class:`MockServer` (its Python API) and the
command line (``python -m llmretry.testing``)."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import socketserver
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type
from urllib.parse import quote

from . import _batches
from ._scripts import Record, ScriptError, Step
from ._state import _State
from ._handler import _Abort, _Handler


class _HTTPServer(ThreadingHTTPServer):
    """Threaded server that numbers, tracks and can drop its connections."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    strict = False      # MockServer(strict=True): see _strict_refusal

    def __init__(self, address: Tuple[str, int], state: _State,
                 stop_event: threading.Event) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        self.stop_event = stop_event
        self._conn_lock = threading.Lock()
        self._conn_ids: Dict[socket.socket, int] = {}
        self._open: Set[Any] = set()
        self._handler_threads: Set[threading.Thread] = set()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a (possibly slow) getfqdn(); skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def get_request(self) -> Tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            with self.state.lock:
                self.state.accepted += 1
                conn_id = self.state.accepted
            self._conn_ids[request] = conn_id
            self._open.add(request)
        super().process_request(request, client_address)

    def connection_id(self, request: Any) -> int:
        with self._conn_lock:
            return self._conn_ids.get(request, 0)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._conn_ids.pop(request, None)
            self._open.discard(request)
        super().shutdown_request(request)

    def process_request_thread(self, request: Any,
                               client_address: Any) -> None:
        thread = threading.current_thread()
        with self._conn_lock:
            self._handler_threads.add(thread)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._handler_threads.discard(thread)

    def shutdown_open_connections(self) -> None:
        with self._conn_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def join_handlers(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for connection threads."""
        deadline = time.monotonic() + timeout
        with self._conn_lock:
            threads = list(self._handler_threads)
        for thread in threads:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            thread.join(left)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if self.stop_event.is_set() or isinstance(exc, (OSError, _Abort)):
            return  # a client that went away, or a stop: not an error
        super().handle_error(request, client_address)


class MockServer:
    """A scriptable, fault-injecting OpenAI-compatible chat server.

    Runs in a background thread; see the module docstring for the protocol.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 strict: bool = False) -> None:
        self.host = host
        self._requested_port = port
        self.strict = strict
        self._state = _State()
        self._stop_event = threading.Event()
        self._server: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    # -- lifecycle --------------------------------------------------------

    def start(self) -> "MockServer":
        """Bind and start serving in a daemon thread; return self."""
        if self._stopped:
            raise RuntimeError("a stopped MockServer cannot be restarted")
        if self._server is not None:
            return self
        self._server = _HTTPServer((self.host, self._requested_port),
                                   self._state, self._stop_event)
        self._server.strict = bool(self.strict)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"llmretry-mock:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end stalls and close open connections (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        server = self._server
        if server is None:
            return
        server.shutdown()
        server.shutdown_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=0.2)
        server.join_handlers(timeout=0.5)

    def __repr__(self) -> str:
        if self._stopped:
            state = "stopped"
        elif self._server is None:
            state = "not started"
        else:
            state = f"base_url={self.base_url!r}"
        strict = ", strict=True" if self.strict else ""
        return f"MockServer({state}{strict})"

    def __enter__(self) -> "MockServer":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    # -- addresses --------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (the server must have been started)."""
        if self._server is None:
            raise RuntimeError("MockServer is not started")
        return int(self._server.server_address[1])

    @property
    def _origin(self) -> str:
        host = self.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """Base URL of scenario "default": http://127.0.0.1:PORT/v1."""
        return f"{self._origin}/v1"

    def scenario_url(self, name: str) -> str:
        """Base URL of scenario ``name``: http://127.0.0.1:PORT/s/<name>/v1."""
        return f"{self._origin}/s/{quote(name, safe='')}/v1"

    # -- scripting and records ------------------------------------------

    def script(self, name: str, steps: Sequence[Step],
               after: Optional[Step] = None,
               limits: Optional[Mapping[str, Any]] = None,
               outage: Optional[Mapping[str, Any]] = None,
               route: Optional[Mapping[str, str]] = None,
               clock: Optional[str] = None) -> None:
        """Replace scenario ``name``'s script, reset its cursor and records
        (and, with ``limits``, enforce rate limits; with ``outage``, be down
        in that window; with ``route``, hand some models' requests to other
        scenarios; with ``clock="manual"``, time them on a clock that moves
        by ``advance_clock`` alone: see the module doc).

        Raises ``ValueError`` (``ScriptError``) for a malformed script.
        """
        self._state.script(name, list(steps), after,
                           dict(limits) if isinstance(limits, Mapping)
                           else limits,
                           dict(outage) if isinstance(outage, Mapping)
                           else outage,
                           dict(route) if isinstance(route, Mapping)
                           else route, clock)

    def outage(self, name: str, mode: str = "503",
               for_ms: Optional[float] = None) -> None:
        """Take scenario ``name`` down now (``"503"``, ``"reset"``,
        ``"close"`` or ``"hang"``) until ``end_outage``, or for ``for_ms``
        ms. Raises ``ScriptError`` for a bad mode or ``for_ms``."""
        self._state.start_outage(name, mode, for_ms)

    def end_outage(self, name: str) -> None:
        """End scenario ``name``'s outage started by ``outage`` (no-op if
        none; a scripted window is not affected)."""
        self._state.end_outage(name)

    def outage_stats(self, name: str) -> Dict[str, Any]:
        """``{"down": bool, "mode": str or None, "during": n,
        "outside": n}``: the scenario's outage now, and its requests since
        it was scripted that met an outage or did not."""
        return self._state.outage_stats(name)

    def advance_clock(self, name: str, ms: float) -> None:
        """Move scenario ``name``'s clock on by ``ms`` ms: its rate-limit
        and outage windows and its waiting step delays see that much more
        time pass (``POST /_mock/clock``). Raises ``ScriptError`` for a bad
        ``ms``."""
        self._state.advance_clock(name, ms)

    def clock_stats(self, name: str) -> Dict[str, Any]:
        """``{"clock": "real" or "manual", "advanced_ms": x}`` of scenario
        ``name`` (``GET /_mock/clock``)."""
        return self._state.clock_stats(name)

    def limit_stats(self, name: str) -> Dict[str, int]:
        """``{"admitted": n, "refused": n, "tokens": n}`` of a scenario
        scripted with limits; ``KeyError`` for one without."""
        stats = self._state.limit_stats(name)
        if stats is None:
            raise KeyError(f"scenario {name!r} has no limits")
        return stats

    def load_scenarios(self, scenarios: Mapping[str, Any]) -> None:
        """Script scenarios: ``{name: {"steps": [...], "after": step,
        "limits": {...}, "outage": {...}, "route": {...}, "clock": ...}}``."""
        if not isinstance(scenarios, Mapping):
            raise ScriptError("scenarios must be an object of name -> script")
        for name, doc in scenarios.items():
            if not isinstance(doc, Mapping):
                raise ScriptError(f"scenario {name!r}: must be an object")
            self._state.script(str(name), doc.get("steps"), doc.get("after"),
                               doc.get("limits"), doc.get("outage"),
                               doc.get("route"), doc.get("clock"))

    def requests(self, name: str) -> List[Record]:
        """A copy of scenario ``name``'s records, in arrival order."""
        return self._state.records(name)

    def clear(self, name: str) -> None:
        """Clear scenario ``name``'s records (its cursor is kept)."""
        self._state.clear(name)

    def batch_api(self) -> "_batches.Store":
        """The Files and Batch APIs' store (``.files``, ``.batches``,
        ``.advance(batch_id, to=..., completed=K)``, ``.auto``): see
        "Batch API" in tests/mock_protocol.md."""
        return self._state.batch_store

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted since start."""
        with self._state.lock:
            return self._state.accepted


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the mock server until SIGTERM/SIGINT; print the port first."""
    parser = argparse.ArgumentParser(
        prog="python -m llmretry.testing",
        description="Fault-injecting OpenAI-compatible mock chat server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--scenarios", metavar="FILE.json",
                        help='scripts to load: {name: {"steps": [...], '
                             '"after": step, "limits": {...}}}')
    parser.add_argument("--strict", action="store_true",
                        help="refuse what OpenAI refuses: 404 for a path that is "
                             "not an OpenAI route, 400 for a chat body without "
                             "model or messages")
    args = parser.parse_args(argv)

    server = MockServer(args.host, args.port, strict=args.strict)
    if args.scenarios:
        try:
            with open(args.scenarios, encoding="utf-8") as fh:
                server.load_scenarios(json.load(fh))
        except (OSError, ValueError) as exc:
            print(f"llmretry.testing: {args.scenarios}: {exc}",
                  file=sys.stderr)
            return 2

    # The handler only appends to a list: taking a lock in a signal handler
    # (Event.set) can deadlock with the main thread re-acquiring that same
    # lock inside Event.wait.
    signals: List[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        sys.stdout.write(f"{server.port}\n")
        sys.stdout.flush()
    except OSError:
        pass
    try:
        while not signals:
            time.sleep(0.1)         # interrupted by the signal (PEP 475)
    finally:
        server.stop()
    return 0
