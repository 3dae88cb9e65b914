#!/usr/bin/env python3
"""Retry-timer accuracy: one call meets K answers of 429 with
`Retry-After: 0.2` (then a success), so the client waits 200 ms K times.
The actual wait k is the time between the server seeing attempt k and
attempt k+1 (the mock records when each request has been read), so it also
holds the 429's trip back, the client's handling and the next request's
trip out: what a user waits. Reported: (actual − scheduled) in ms, median,
p95 and max, per client.

    python3 bench/suite/retry_timer.py [--retries 100] [--only id,id]   # prints JSON

The scheduled wait is what the client says it scheduled (llmretry's
llm_retry_scheduled events carry delay_ms) or the header's 200 ms (the openai
SDK sleeps exactly a Retry-After of up to 60 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mockserver import Mock, lua_env, python_env  # noqa: E402

RETRY_AFTER = "0.2"
SCHEDULED_MS = 200.0
KEY = "bench-key"
BODY = '{"model": "bench-model", "messages": [{"role": "user", "content": "Say hi"}]}'

# Each program gets the base URL and K in the environment and prints one JSON
# line: {"attempts": n, "scheduled_ms": [...]} (scheduled_ms empty when the
# client does not say).
PY_PROGRAMS: dict[str, tuple[str, str]] = {
    "llmretry_python": ("llmretry Python, call_llm", f"""
import json, os, llmretry
delays = []
def logger(ev):
    if ev["event"] == "llm_retry_scheduled":
        delays.append(ev["delay_ms"])
k = int(os.environ["BENCH_RETRIES"])
res = llmretry.call_llm(json.loads({BODY!r}), base_url=os.environ["BENCH_BASE_URL"],
                        api_key={KEY!r}, max_retries=k, timeout_ms=10000, logger=logger)
print(json.dumps({{"attempts": res.meta.attempts, "scheduled_ms": delays}}))
"""),
    "openai_sync": ("openai SDK, sync", f"""
import json, os, openai
k = int(os.environ["BENCH_RETRIES"])
client = openai.OpenAI(base_url=os.environ["BENCH_BASE_URL"], api_key={KEY!r},
                       max_retries=k, timeout=10)
raw = client.chat.completions.with_raw_response.create(**json.loads({BODY!r}))
raw.parse()
print(json.dumps({{"attempts": raw.retries_taken + 1, "scheduled_ms": []}}))
"""),
}

LUA_PROGRAMS: dict[str, tuple[str, str]] = {
    "llmretry_lua54": ("llmretry Lua 5.4, call_llm", """
local llm = require("llmretry")
local delays = {}
local res, err = llm.call_llm{
  body = { model = "bench-model", messages = { { role = "user", content = "Say hi" } } },
  base_url = os.getenv("BENCH_BASE_URL"), api_key = "%s",
  max_retries = tonumber(os.getenv("BENCH_RETRIES")), timeout_ms = 10000,
  logger = function(ev)
    if ev.event == "llm_retry_scheduled" then delays[#delays + 1] = ev.delay_ms end
  end }
if not res then io.stderr:write(tostring(err), "\\n"); os.exit(1) end
setmetatable(delays, llm.array_mt)
print(llm.encode({ attempts = res.meta.attempts, scheduled_ms = delays }))
""" % KEY),
}


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def one_client(mock: Mock, cid: str, label: str, argv: list[str], env: dict[str, str],
               retries: int) -> dict[str, Any]:
    name = "timer-" + cid
    mock.script(name, [{"status": 429, "retry_after": RETRY_AFTER}] * retries)
    env = dict(env, BENCH_BASE_URL=mock.base_url(name), BENCH_RETRIES=str(retries))
    row: dict[str, Any] = {"id": cid, "label": label, "retries": retries,
                           "command": " ".join(argv[:2])
                           + " <program in bench/suite/retry_timer.py>"}
    res = subprocess.run(argv, env=env, capture_output=True, text=True,
                         timeout=60 + retries * 2)
    recs = mock.requests(name)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        row["error"] = f"exit {res.returncode}: {res.stderr.strip()[-300:]}"
        return row
    out = json.loads(lines[-1])
    if len(recs) != retries + 1:
        row["error"] = f"the server saw {len(recs)} requests, expected {retries + 1}"
        return row
    times = [r["time"] for r in recs]
    actual = [(b - a) * 1000 for a, b in zip(times, times[1:])]
    scheduled = out.get("scheduled_ms") or [SCHEDULED_MS] * retries
    late = [a - s for a, s in zip(actual, scheduled)]
    row.update({
        "attempts": out.get("attempts"),
        "scheduled_source": "its events" if out.get("scheduled_ms") else "the header",
        "scheduled_ms_distinct": sorted(set(scheduled)),
        "late_ms_median": statistics.median(late), "late_ms_p95": percentile(late, 95),
        "late_ms_max": max(late), "late_ms_min": min(late),
        "actual_ms_median": statistics.median(actual), "late_ms": [round(x, 2) for x in late],
    })
    return row


def measure(retries: int = 100, only: Optional[set[str]] = None) -> dict[str, Any]:
    print(f"== retry-timer accuracy: {retries} retries after a 429 with Retry-After: "
          f"{RETRY_AFTER}", file=sys.stderr, flush=True)
    progs = [(cid, label, [sys.executable, "-c", code], python_env())
             for cid, (label, code) in PY_PROGRAMS.items()]
    lua = lua_env("5.4")
    for cid, (label, code) in LUA_PROGRAMS.items():
        if lua is not None:
            progs.append((cid, label, ["lua5.4", "-e", code], lua))
        else:   # shows as a row with the reason
            progs.append((cid, label, ["sh", "-c", "echo 'no Lua 5.4 build of llmretry "
                                       "(bench/clients/setup.sh)' >&2; exit 1"], {}))
    if only and any(p[0] in only for p in progs):
        progs = [p for p in progs if p[0] in only]
    rows = []
    with Mock() as mock:
        for cid, label, argv, env in progs:
            row = one_client(mock, cid, label, argv, env, retries)
            rows.append(row)
            if "error" in row:
                print(f"   {cid:<20} ERROR {row['error']}", file=sys.stderr, flush=True)
            else:
                print(f"   {cid:<20} late by median {row['late_ms_median']:.1f} ms, "
                      f"p95 {row['late_ms_p95']:.1f}, max {row['late_ms_max']:.1f}",
                      file=sys.stderr, flush=True)
    return {"retry_after": RETRY_AFTER, "scheduled_ms": SCHEDULED_MS, "retries": retries,
            "clients": rows}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retries", type=int, default=100)
    ap.add_argument("--only")
    a = ap.parse_args()
    print(json.dumps(measure(a.retries, set(a.only.split(",")) if a.only else None), indent=1))
