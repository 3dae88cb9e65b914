"""llmretry.otel's Python work per batch item, counted (not timed): the
bytecodes the calling thread runs and the Python functions it calls during
``call_many`` of N items, per item, under each mode of bench/bench_otel.py
that costs no SDK (``off``, ``noop``: the API's no-op providers, ``record``:
spans that record and keep nothing), split by function. Counts do not
depend on the machine's load, so a change's effect shows at once where
bench/run_otel.sh's CPU figures need quiet rounds.

    python3 bench/count_otel.py [--n 2000] [--top 25] [--modes off,noop,record]

Against the project's mock server (in this process, its threads not
traced: sys.settrace is the calling thread's alone). Only Python is
counted: C functions (the extension, the interpreter's builtins) are not.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any, Dict, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import llmretry  # noqa: E402
import llmretry.otel  # noqa: E402
from llmretry.testing import MockServer  # noqa: E402
from opentelemetry.metrics import NoOpMeterProvider  # noqa: E402
from opentelemetry.trace import NoOpTracerProvider  # noqa: E402

from bench_otel import _RecordingProvider  # noqa: E402

Key = Tuple[str, str]


class _Counter:
    """sys.settrace's tracer: opcodes and calls by function."""

    def __init__(self) -> None:
        self.ops: Counter = Counter()
        self.calls: Counter = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        code = frame.f_code
        key = (os.path.basename(code.co_filename), code.co_qualname)
        self.calls[key] += 1
        frame.f_trace_opcodes = True
        ops = self.ops

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                ops[key] += 1
            return local
        return local


def count(client: llmretry.Client, bodies: Any, mode: str) -> _Counter:
    providers = {"noop": (NoOpTracerProvider(), NoOpMeterProvider()),
                 "record": (_RecordingProvider(), NoOpMeterProvider())}
    if mode != "off":
        tp, mp = providers[mode]
        llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
    try:
        client.call_many(bodies[:50])       # warm: caches, connections
        counter = _Counter()
        sys.settrace(counter)
        try:
            out = client.call_many(bodies)
        finally:
            sys.settrace(None)
    finally:
        if mode != "off":
            llmretry.otel.uninstrument()
    if out.summary.ok != len(bodies):
        raise SystemExit(f"{mode}: {out.summary.failed} items failed")
    return counter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--modes", default="off,noop,record")
    args = ap.parse_args()
    modes = args.modes.split(",")
    bodies = [{"model": "gpt-bench", "max_tokens": 16,
               "messages": [{"role": "user", "content": f"Item {i}"}]} for i in range(args.n)]
    n = args.n
    results: Dict[str, _Counter] = {}
    with MockServer() as server, llmretry.Client(base_url=server.base_url) as client:
        for mode in modes:
            results[mode] = count(client, bodies, mode)
    off = results.get("off")
    base_ops = sum(off.ops.values()) / n if off else 0.0
    base_calls = sum(off.calls.values()) / n if off else 0.0
    print(f"Per batch item, call_many of {n:,} (calling thread, Python only)\n")
    print("| mode | bytecodes | over off | Python calls | over off |")
    print("|---|---:|---:|---:|---:|")
    for mode, c in results.items():
        ops, calls = sum(c.ops.values()) / n, sum(c.calls.values()) / n
        print(f"| {mode} | {ops:.0f} | {ops - base_ops:+.0f} | {calls:.1f} | "
              f"{calls - base_calls:+.1f} |")
    for mode, c in results.items():
        if mode == "off":
            continue
        print(f"\n{mode}, by function (over off), bytecodes and calls per item:\n")
        keys = set(c.ops) | set(c.calls)
        rows = []
        for key in keys:
            ops = (c.ops[key] - (off.ops[key] if off else 0)) / n
            calls = (c.calls[key] - (off.calls[key] if off else 0)) / n
            if abs(ops) >= 0.05 or abs(calls) >= 0.05:
                rows.append((ops, calls, key))
        rows.sort(reverse=True)
        for ops, calls, (path, name) in rows[:args.top]:
            print(f"  {ops:8.1f} {calls:6.2f}  {path}:{name}")
        rest = rows[args.top:]
        if rest:
            print(f"  {sum(r[0] for r in rest):8.1f} {sum(r[1] for r in rest):6.2f}  "
                  f"({len(rest)} more)")


if __name__ == "__main__":
    main()
