#!/usr/bin/env python3
"""Ctrl-C latency: a client is blocked in a call to an endpoint that never
answers (the mock server's `no_headers` stall); it gets SIGINT; how long until
the process has exited? Median of several fresh processes per client.

    python3 bench/suite/ctrlc.py [--samples 5] [--only id,id]   # prints JSON

The signal is sent once the mock has seen every request the client makes
(1, or 8 for the batch calls) plus 200 ms, so the client is in its wait.
The clock runs from kill(2) to the moment the process is gone (a pidfd
turns readable), so it includes interpreter teardown: what a user sees.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mockserver import Mock, lua_env, python_env  # noqa: E402

CAP_S = 10.0         # a client still there after this long is killed
SETTLE_S = 0.2       # after the last request reached the server
KEY = "bench-key"

PY_BODY = ('{"model": "bench-model", "messages": '
           '[{"role": "user", "content": "Say hi"}]}')

PY_CLIENTS: dict[str, tuple[str, int, str]] = {
    # id: (label, requests it makes, program; $BENCH_BASE_URL is the base URL)
    "llmretry_call_llm": ("llmretry Python, call_llm", 1, f"""
import json, os, llmretry
body = json.loads({PY_BODY!r})
llmretry.call_llm(body, base_url=os.environ["BENCH_BASE_URL"], api_key={KEY!r},
                  logger=None)
"""),
    "llmretry_call_many": ("llmretry Python, call_many (8 in flight)", 8, f"""
import json, os, llmretry
body = json.loads({PY_BODY!r})
llmretry.call_many([body] * 8, limit=8, base_url=os.environ["BENCH_BASE_URL"],
                   api_key={KEY!r}, logger=None)
"""),
    "openai_sync": ("openai SDK, sync", 1, f"""
import json, os, openai
body = json.loads({PY_BODY!r})
client = openai.OpenAI(base_url=os.environ["BENCH_BASE_URL"], api_key={KEY!r})
client.chat.completions.create(**body)
"""),
    "openai_async": ("openai SDK, AsyncOpenAI (asyncio.run)", 1, f"""
import asyncio, json, os, openai
body = json.loads({PY_BODY!r})
async def main():
    client = openai.AsyncOpenAI(base_url=os.environ["BENCH_BASE_URL"], api_key={KEY!r})
    await client.chat.completions.create(**body)
asyncio.run(main())
"""),
    "httpx_sync": ("httpx, sync post", 1, f"""
import json, os, httpx
body = json.loads({PY_BODY!r})
httpx.post(os.environ["BENCH_BASE_URL"] + "/chat/completions", json=body, timeout=600,
           headers={{"Authorization": "Bearer {KEY}"}})
"""),
}

LUA_BODY = ('{ model = "bench-model", messages = { { role = "user", '
            'content = "Say hi" } } }')
LUA_CLIENTS: dict[str, tuple[str, int, str]] = {
    "llmretry_lua54_call_llm": ("llmretry Lua 5.4, call_llm", 1, f"""
local llm = require("llmretry")
llm.call_llm{{ body = {LUA_BODY}, base_url = os.getenv("BENCH_BASE_URL"), api_key = "{KEY}" }}
"""),
    "llmretry_lua54_call_many": ("llmretry Lua 5.4, call_many (8 in flight)", 8, f"""
local llm = require("llmretry")
local bodies = {{}}
for i = 1, 8 do bodies[i] = {LUA_BODY} end
llm.call_many(bodies, {{ limit = 8, base_url = os.getenv("BENCH_BASE_URL"), api_key = "{KEY}" }})
"""),
}


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT from a background shell, and Python
    # then never installs its KeyboardInterrupt handler: undo that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_gone(pid: int, timeout: float) -> bool:
    fd = os.pidfd_open(pid)
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def ended_with(lines: list[str]) -> str:
    """How the process said it ended: Python's exception, Lua's error."""
    for line in reversed(lines):
        if "KeyboardInterrupt" in line:
            return "KeyboardInterrupt"
        if "interrupted!" in line:
            return "error: interrupted!"
    return lines[-1][-80:] if lines else "(nothing on stderr)"


def one_sample(mock: Mock, name: str, argv: list[str], env: dict[str, str],
               expect: int) -> dict[str, Any]:
    mock.script(name, [], after={"fault": "no_headers", "stall_ms": 120000})
    env = dict(env, BENCH_BASE_URL=mock.base_url(name))
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    try:
        end = time.monotonic() + 30
        while len(mock.requests(name)) < expect:
            if proc.poll() is not None or time.monotonic() > end:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                return {"error": f"never blocked ({len(mock.requests(name))} requests "
                                 f"seen, exit {proc.poll()}): {err.strip()[-300:]}"}
            time.sleep(0.02)
        time.sleep(SETTLE_S)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        gone = _wait_gone(proc.pid, CAP_S)
        took = time.monotonic() - t0
        if not gone:
            proc.kill()
        proc.wait(10)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        lines = err.strip().splitlines()
        return {"seconds": round(took, 4) if gone else None, "exited": gone,
                "exit_code": proc.returncode,
                "ended_with": ended_with(lines)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def programs(only: Optional[set[str]]) -> list[tuple[str, str, int, list[str], dict[str, str]]]:
    out = []
    for cid, (label, expect, code) in PY_CLIENTS.items():
        out.append((cid, label, expect, [sys.executable, "-c", code], python_env()))
    lua = lua_env("5.4")
    for cid, (label, expect, code) in LUA_CLIENTS.items():
        if lua is not None:
            out.append((cid, label, expect, ["lua5.4", "-e", code], lua))
        else:   # shows as a row that never blocked, with the reason
            out.append((cid, label, expect, ["sh", "-c", "echo 'no Lua 5.4 build of llmretry "
                                             "(bench/clients/setup.sh)' >&2; exit 1"], {}))
    return [p for p in out if not only or p[0] in only]


def measure(samples: int = 5, only: Optional[set[str]] = None) -> dict[str, Any]:
    """Median seconds from SIGINT to exit per client (None: not within CAP_S)."""
    rows = []
    print(f"== Ctrl-C latency: {samples} samples per client", file=sys.stderr, flush=True)
    with Mock() as mock:
        progs = programs(only)
        if only and not progs:   # --only names matrix clients: measure all
            progs = programs(None)
        for cid, label, expect, argv, env in progs:
            got = [one_sample(mock, f"ctrlc-{cid}-{i}", argv, env, expect)
                   for i in range(samples)]
            times = [g["seconds"] for g in got if g.get("seconds") is not None]
            row: dict[str, Any] = {
                "id": cid, "label": label, "in_flight": expect, "samples": got,
                "exited": sum(1 for g in got if g.get("exited")),
                "median_s": statistics.median(times) if len(times) == samples else None,
                "max_s": max(times) if times else None,
                "errors": [g["error"] for g in got if "error" in g],
                "command": " ".join(argv[:2]) + " <program in bench/suite/ctrlc.py>",
            }
            rows.append(row)
            shown = (f"{row['median_s'] * 1000:.0f} ms" if row["median_s"] is not None
                     else f"{row['exited']}/{samples} exited within {CAP_S:.0f} s")
            print(f"   {cid:<28} {shown}  {row['errors'][:1]}", file=sys.stderr, flush=True)
    return {"cap_s": CAP_S, "settle_s": SETTLE_S, "samples": samples, "clients": rows}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--only")
    a = ap.parse_args()
    print(json.dumps(measure(a.samples, set(a.only.split(",")) if a.only else None), indent=1))
