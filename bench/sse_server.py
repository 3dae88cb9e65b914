#!/usr/bin/env python3
"""The local SSE server of the streaming benchmark (bench/run_stream.sh).

    python3 bench/sse_server.py --port 18090 [--ready FILE]

A separate process (its CPU is not the client's), asyncio, stdlib only, on
127.0.0.1. HTTP/1.1 with keep-alive; every POST to ``/v1/chat/completions``
answers ``text/event-stream`` with ``Transfer-Encoding: chunked``, one HTTP
chunk per SSE event, as the OpenAI API streams. The request's ``model``
chooses the stream (so one client, one base URL and one connection can
warm up on a short stream and then measure a long one):

- ``fast-N``: N content chunks, then the finish chunk, the usage chunk and
  ``data: [DONE]``, all prebuilt and written at once (the socket and the
  client set the pace: the server is not the bottleneck).
- ``paced-N-MS``: N chunks, one every MS milliseconds on the server's
  schedule; each chunk's ``delta.content`` is the decimal
  ``time.monotonic_ns()`` taken right before its write (CLOCK_MONOTONIC,
  comparable across processes on Linux), so a client can compute the delay.
- ``hold-N``: the first chunk at once, then nothing until ``POST /release``
  (any body); then N more chunks and the end. For the memory of many open
  streams.
- ``big-BYTES-SIZE``: chunks whose content is SIZE bytes, until BYTES of
  content are sent, each 64 KiB written awaiting the socket (the client's
  reading sets the pace: a slow consumer).

``GET /status`` answers ``{"open": connections open now, "accepted": since
start, "held": streams waiting in /hold}``. ``--ready FILE`` writes the port
to FILE once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Dict, List, Tuple

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
CHUNK_PREFIX = ('{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
                '"model":"gpt-4.1-mini","system_fingerprint":"fp_bench","choices":[{"index":0,'
                '"delta":{')
CHUNK_SUFFIX = '},"logprobs":null,"finish_reason":null}]}'


def http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(data: str) -> bytes:
    return http_chunk(b"data: " + data.encode() + b"\n\n")


def content_event(text: str, first: bool = False) -> bytes:
    role = '"role":"assistant",' if first else ""
    return event(CHUNK_PREFIX + role + '"content":' + json.dumps(text) + CHUNK_SUFFIX)


def end_events(tokens: int) -> bytes:
    finish = ('{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
              '"model":"gpt-4.1-mini","system_fingerprint":"fp_bench","choices":[{"index":0,'
              '"delta":{},"logprobs":null,"finish_reason":"stop"}]}')
    usage = ('{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
             '"model":"gpt-4.1-mini","system_fingerprint":"fp_bench","choices":[],'
             '"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}'
             % (tokens, tokens + 12))
    return event(finish) + event(usage) + event("[DONE]") + b"0\r\n\r\n"


def plain(status: str, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class Server:
    def __init__(self) -> None:
        self.open = 0
        self.accepted = 0
        self.held = 0
        self.release = asyncio.Event()
        self.fast: Dict[int, bytes] = {}

    def fast_body(self, n: int) -> bytes:
        if n not in self.fast:
            parts: List[bytes] = [content_event("tok", True)]
            parts += [content_event(" tok")] * (n - 1)
            self.fast[n] = HEAD + b"".join(parts) + end_events(n)
        return self.fast[n]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                method, path = self.request_line(head)
                length = self.content_length(head)
                body = await reader.readexactly(length) if length else b""
                await self.respond(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.open -= 1
            writer.close()

    @staticmethod
    def request_line(head: bytes) -> Tuple[str, str]:
        first = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        return (first[0], first[1]) if len(first) >= 2 else ("", "")

    @staticmethod
    def content_length(head: bytes) -> int:
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                return int(value.strip() or b"0")
        return 0

    async def respond(self, method: str, path: str, body: bytes,
                      w: asyncio.StreamWriter) -> None:
        if path == "/status":
            out = json.dumps({"open": self.open, "accepted": self.accepted,
                              "held": self.held}).encode()
            w.write(plain("200 OK", out))
            await w.drain()
            return
        if path == "/release" and method == "POST":
            old, self.release = self.release, asyncio.Event()
            old.set()
            w.write(plain("200 OK", b"{}"))
            await w.drain()
            return
        try:
            model = str(json.loads(body or b"{}").get("model", ""))
            mode, *args = model.split("-")
            nums = [int(x) for x in args]
        except (ValueError, AttributeError):
            mode, nums = "", []
        if method != "POST" or path != "/v1/chat/completions":
            mode = ""
        if mode == "fast" and len(nums) == 1:
            w.write(self.fast_body(nums[0]))
            await w.drain()
        elif mode == "paced" and len(nums) == 2:
            await self.paced(w, nums[0], nums[1] / 1000.0)
        elif mode == "hold" and len(nums) == 1:
            await self.hold(w, nums[0])
        elif mode == "big" and len(nums) == 2:
            await self.big(w, nums[0], nums[1])
        else:
            w.write(plain("404 Not Found", b'{"error":{"message":"no such path or model"}}'))
            await w.drain()

    async def paced(self, w: asyncio.StreamWriter, n: int, every: float) -> None:
        w.write(HEAD)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(n):
            delay = start + i * every - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # The timestamp right before the write: transport.write sends at
            # once when nothing is queued (TCP_NODELAY set).
            w.write(content_event(str(time.monotonic_ns()), i == 0))
        w.write(end_events(n))
        await w.drain()

    async def hold(self, w: asyncio.StreamWriter, n: int) -> None:
        w.write(HEAD + content_event("tok", True))
        await w.drain()
        self.held += 1
        try:
            await self.release.wait()
        finally:
            self.held -= 1
        w.write(b"".join([content_event(" tok")] * n) + end_events(n + 1))
        await w.drain()

    async def big(self, w: asyncio.StreamWriter, total: int, size: int) -> None:
        w.write(HEAD)
        piece = content_event("x" * size)
        per_batch = max(1, 65536 // len(piece))
        batch = piece * per_batch
        first = content_event("x" * size, True)
        w.write(first)
        sent, n = size, 1
        while sent + per_batch * size <= total:
            w.write(batch)
            sent += per_batch * size
            n += per_batch
            await w.drain()
        while sent < total:
            w.write(piece)
            sent += size
            n += 1
        w.write(end_events(n))
        await w.drain()


async def main_async(port: int, ready: str) -> None:
    srv = Server()
    server = await asyncio.start_server(srv.handle, "127.0.0.1", port, backlog=4096,
                                        limit=1 << 20)
    if ready:
        with open(ready, "w") as f:
            f.write(f"{port}\n")
    async with server:
        await server.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=18090)
    ap.add_argument("--ready", default="")
    a = ap.parse_args()
    try:
        asyncio.run(main_async(a.port, a.ready))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
