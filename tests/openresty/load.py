#!/usr/bin/env python3
"""Many concurrent GETs from one process (asyncio), for the OpenResty host test.

Runs in a process of its own so that its 500 connections do not share a GIL
with the /ping measurement of host_check.py. Prints one JSON object:
{"results": [[status, seconds], ...], "wall": seconds}; status 0 is a
failed request (its error in "errors").

    python3 tests/openresty/load.py 127.0.0.1 PORT /llm?s=slow 500
"""

import asyncio
import json
import sys
import time
from typing import List, Tuple


async def get(host: str, port: int, path: str, timeout: float) -> Tuple[int, float]:
    t0 = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)   # to EOF: Connection: close
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
    return status, time.monotonic() - t0


async def main(host: str, port: int, path: str, n: int) -> None:
    errors: List[str] = []

    async def one() -> Tuple[int, float]:
        try:
            return await get(host, port, path, 30.0)
        except Exception as e:  # noqa: BLE001 - counted as status 0
            errors.append(repr(e))
            return 0, 0.0

    t0 = time.monotonic()
    results = await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps({"results": results, "wall": time.monotonic() - t0, "errors": errors[:5]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
