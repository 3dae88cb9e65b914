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
from typing import Callable, Dict, List, Optional, Tuple, Union

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
        try:
            # Wakes the accepting thread (a close alone does not, on Linux:
            # each exit waited out its join's 5 s).
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
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


def _silent(args: List[bytes]) -> None:
    return None


# The hostile servers the store is tested against, from Python
# (test_shared_hostile_store.py) and from Lua (shared_redis_spec.lua):
# name: (how the server answers, what the store's event must say).
CASES: Dict[str, Tuple[Answer, str]] = {
    "silent": (_silent, "loading the script: no answer within 50 ms"),
    "not RESP at all": (lambda a: b"HTTP/1.1 400 Bad Request\r\n\r\n",
                        "loading the script: not a Redis reply (Protocol error"),
    "no scripting": (lambda a: b"-ERR unknown command 'SCRIPT'\r\n",
                     "refused the script (Redis 6 or later is needed) (ERR)"),
    "a read-only replica": (
        loads_script(lambda a: b"-READONLY You can't write against a read only replica.\r\n"),
        "the script failed (READONLY)"),
    "an array of the wrong length": (
        loads_script(lambda a: array_of([b":1\r\n", b":2\r\n"])),
        "the script failed (an unexpected reply)"),
    "not an array": (loads_script(lambda a: b":7\r\n"), "the script failed (an unexpected reply)"),
    "nested past hiredis's depth": (loads_script(lambda a: b"*1\r\n" * 12 + b":1\r\n"),
                                    "running the script: not a Redis reply (No support for nested"),
    # A reply that keeps coming, a byte at a time, each in time for the
    # socket's timeout: only a deadline for the whole reply ends it.
    "a reply to the login dripped": (
        lambda a: Drip(b"$1000000\r\n", b"0"), "loading the script: no answer within 50 ms"),
    "a reply to a round dripped": (
        loads_script(lambda a: Drip(b"*40\r\n:1\r\n$1000000\r\n", b"0")),
        "running the script: no answer within 50 ms"),
}


def main(case: str) -> None:
    """Serve one of CASES until killed: its port, then the words its event
    must hold, a line each on stdout (for shared_redis_spec.lua)."""
    answer, says = CASES[case]
    with FakeRedis(answer) as fake:
        print(fake.port)
        print(says, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    import sys
    main(sys.argv[1])
