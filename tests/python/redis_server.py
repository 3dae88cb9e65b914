"""A throwaway redis-server for the tests of shared budgets (docs/shared.md).

Debian's ``redis-server`` (installed by tools/ensure-deps.sh) on a free
loopback port, in a temporary directory, saving nothing. A missing
redis-server raises: the tests that need one fail, they do not skip.

In Python::

    with RedisServer() as redis:          # RedisServer(password="pw")
        client = llmretry.Client(shared=redis.url)
        redis.kill()                      # SIGKILL, as a crash
        redis.restart()                   # back on the same port

From another language (the Lua specs, the benchmark)::

    python3 tests/python/redis_server.py [--password PW]

prints the port on its first line and serves until it is sent SIGTERM or
SIGINT (or its parent exits), then stops the server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, List, Optional


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; ``url`` is ``redis://[:password@]127.0.0.1:PORT/0``."""

    def __init__(self, password: Optional[str] = None) -> None:
        self.password = password
        self.port = 0
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.dir = ""

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                if self.password:
                    s.sendall(f"AUTH {self.password}\r\n".encode())
                    if not s.recv(64).startswith(b"+OK"):
                        return False
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _spawn(self) -> bool:
        argv: List[str] = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                           "--save", "", "--appendonly", "no", "--dir", self.dir,
                           "--logfile", os.path.join(self.dir, "redis.log"),
                           "--daemonize", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._answers():
                return True
            if self.proc.poll() is not None:    # exited: its port was taken meanwhile
                return False
            time.sleep(0.01)
        self.kill()
        return False

    def start(self) -> "RedisServer":
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (tools/ensure-deps.sh installs "
                               "Debian's redis-server)")
        self.dir = tempfile.mkdtemp(prefix="llmretry-redis-")
        for _ in range(5):
            self.port = _free_port()
            if self._spawn():
                return self
        self.stop()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        """Stop it at once (SIGKILL): a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        """Kill it if it runs, and start it again on the same port."""
        self.kill()
        if not self._spawn():
            raise RuntimeError(f"redis-server did not start again on port {self.port}")

    def stop(self) -> None:
        self.kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> None:
    password = None
    if len(sys.argv) == 3 and sys.argv[1] == "--password":
        password = sys.argv[2]
    server = RedisServer(password).start()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    parent = os.getppid()
    print(server.port, flush=True)
    try:
        while not stop and os.getppid() == parent:
            time.sleep(0.2)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
