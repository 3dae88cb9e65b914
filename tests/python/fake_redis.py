"""A server that speaks just enough RESP to be dialled as Redis, then answers
each command as a test says: wrong shapes, error replies, bytes that are not
RESP at all, silence, or a reply dripped a byte at a time for as long as the
connection lasts. For the store's hostile-server tests
(test_shared_hostile_store.py); a real redis-server is redis_server.py.

    with FakeRedis(lambda args: b":1\\r\\n") as fake:
        llmretry.Client(shared=fake.url, ...)

The answer function gets a command's arguments (bytes, the name first) and
returns the bytes to send, None to send nothing, or a Drip to send its bytes
one at a time, DRIP_S apart, then its tail forever."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Union

DRIP_S = 0.01        # well under the store's 50 ms: each read gets a byte in time


@dataclass
class Drip:
    """Bytes sent one at a time, then `tail` repeated until the client goes."""
    head: bytes
    tail: bytes = b"x"


Answer = Callable[[List[bytes]], Union[bytes, Drip, None]]


def bulk(s: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(s), s)


def array_of(items: List[bytes]) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(items)


SHA = b"0" * 40


def loads_script(then: Answer) -> Answer:
    """A server that takes the script (SCRIPT LOAD answers a sha), and answers
    every other command with `then`."""
    def answer(args: List[bytes]) -> Union[bytes, Drip, None]:
        if args and args[0].upper() == b"SCRIPT":
            return bulk(SHA)
        return then(args)
    return answer


def relay(port: int, rewrite: Callable[[bytes], bytes] = lambda b: b) -> Answer:
    """Every command passed to the redis-server at `port`, its reply passed
    back as `rewrite` makes it (as sent: the fake taken for Redis)."""
    conn = socket.create_connection(("127.0.0.1", port))
    reader = conn.makefile("rb")
    lock = threading.Lock()

    def answer(args: List[bytes]) -> bytes:
        with lock:
            conn.sendall(array_of([bulk(a) for a in args]))
            return rewrite(_read_reply(reader))
    return answer


class FakeRedis:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.commands: List[List[bytes]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.conns: List[socket.socket] = []
        self.threads: List[threading.Thread] = []
        self.errors: List[BaseException] = []

    def __enter__(self) -> "FakeRedis":
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
        for t in self.threads:
            t.join(5)
        # The server's own failure fails the test: it never passes by accident.
        assert not self.errors, self.errors

    def names(self) -> List[bytes]:
        with self.lock:
            return [c[0].upper() for c in self.commands]

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while not self.stopping.is_set():
                args = _read_command(reader)
                if args is None:
                    return
                with self.lock:
                    self.commands.append(args)
                out = self.answer(args)
                if isinstance(out, Drip):
                    self._drip(conn, out)
                    return
                if out:
                    conn.sendall(out)
        except OSError:
            return              # the client hung up, or the test ended
        except BaseException as e:      # a bug of this server: the test sees it
            self.errors.append(e)

    def _drip(self, conn: socket.socket, d: Drip) -> None:
        i = 0
        while not self.stopping.is_set():
            piece = d.head[i:i + 1] if i < len(d.head) else d.tail
            conn.sendall(piece)
            i += 1
            time.sleep(DRIP_S)


def _read_command(reader: object) -> Optional[List[bytes]]:
    """One command as hiredis sends it (an array of bulk strings); None at
    the end of the connection."""
    line = reader.readline()  # type: ignore[attr-defined]
    if not line:
        return None
    if not line.startswith(b"*"):
        raise ValueError(f"not a RESP command: {line[:40]!r}")
    args = []
    for _ in range(int(line[1:])):
        head = reader.readline()  # type: ignore[attr-defined]
        if not head.startswith(b"$"):
            raise ValueError(f"not a bulk string: {head[:40]!r}")
        n = int(head[1:])
        args.append(reader.read(n + 2)[:n])  # type: ignore[attr-defined]
    return args


def _read_reply(reader: object) -> bytes:
    """One reply's bytes, as read (RESP 2: + - : $ *)."""
    line = reader.readline()  # type: ignore[attr-defined]
    kind, n = line[:1], line[1:-2]
    if kind == b"$" and int(n) >= 0:
        return line + reader.read(int(n) + 2)  # type: ignore[attr-defined]
    if kind == b"*" and int(n) >= 0:
        return line + b"".join(_read_reply(reader) for _ in range(int(n)))
    if kind in b"+-:$*" and kind:
        return line
    raise ValueError(f"not a RESP reply: {line[:40]!r}")
