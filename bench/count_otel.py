"""llmretry.otel's Python work per batch item, counted (not timed): the
bytecodes the calling thread runs and the Python functions it calls during
``call_many`` of N items, per item, under each mode of bench/bench_otel.py
that costs no SDK (``off``, ``noop``: the API's no-op providers, ``record``:
spans that record and keep nothing), split by function. Counts do not
depend on the machine's load, so a change's effect shows at once where
bench/run_otel.sh's CPU figures need quiet rounds.

    python3 bench/count_otel.py [--n 2000] [--top 25] [--modes off,noop,record] [--parent]

Against the project's mock server (in this process, its threads not
traced: sys.settrace is the calling thread's alone). Only Python is
counted: C functions (the extension, the interpreter's builtins) are not.
``--parent``: the batches run under a (sampled) parent span, as a batch in
an application's request would; without it their items' spans are roots.

``--replay R`` times instead the per-item functions alone, on one thread:
the batch's ``item_headers`` then ``item_done`` of each of its N real
results (taken down during a batch), R times, best round's ns per item,
for each instrumented mode. Run under cachegrind it counts what they cost
with their C (load-independent too): the instructions of ``--replay 11``
less those of ``--replay 1``, over 10 N::

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$(python3 -c 'import sys; print(sys.executable)')" bench/count_otel.py \
        --n 500 --modes record --replay 11
"""

from __future__ import annotations

import argparse
import os
import sys
import time
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

from bench_otel import _Recording, _RecordingProvider  # noqa: E402
from opentelemetry import trace  # noqa: E402

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


def replay(client: llmretry.Client, bodies: Any, mode: str, rounds: int) -> float:
    """The per-item functions of a batch of ``bodies`` made again ``rounds``
    times on its own results, on this thread: the best round's ns per item."""
    from llmretry import _otel_batch
    tp = _RecordingProvider() if mode == "record" else NoOpTracerProvider()
    llmretry.otel.instrument(tracer_provider=tp, meter_provider=NoOpMeterProvider())
    taken: list = []
    batches: list = []
    real = _otel_batch._Batch.item_done

    def item_done(self: Any, k: int, value: Any) -> None:
        batches.append(self)
        taken.append((k, value))
        real(self, k, value)
    _otel_batch._Batch.item_done = item_done     # type: ignore[method-assign]
    try:
        out = client.call_many(bodies)
    finally:
        _otel_batch._Batch.item_done = real     # type: ignore[method-assign]
    try:
        if out.summary.ok != len(bodies) or len(set(map(id, batches))) != 1:
            raise SystemExit(f"{mode}: {out.summary.failed} items failed")
        batch = batches[0]
        batch.attempt_sums = {}     # as while it runs (finish() has set them aside)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for k, value in taken:
                batch.item_headers(k)
                batch.item_done(k, value)
            best = min(best, time.perf_counter() - t0)
    finally:
        llmretry.otel.uninstrument()
    return best / len(taken) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--modes", default="off,noop,record")
    ap.add_argument("--replay", type=int, default=0, metavar="R",
                    help="time the per-item functions alone, R rounds (see above)")
    ap.add_argument("--parent", action="store_true",
                    help="run the batches under a parent span (the same trace as their items')")
    args = ap.parse_args()
    if args.parent:
        # The bench's recording spans all have one context: the parent's
        # trace is theirs, as an SDK span's children's is.
        trace.use_span(trace.NonRecordingSpan(_Recording._CTX)).__enter__()
    modes = args.modes.split(",")
    bodies = [{"model": "gpt-bench", "max_tokens": 16,
               "messages": [{"role": "user", "content": f"Item {i}"}]} for i in range(args.n)]
    n = args.n
    if args.replay:
        with MockServer() as server, llmretry.Client(base_url=server.base_url) as client:
            client.call_many(bodies[:50])       # warm: caches, connections
            print(f"Per batch item, item_headers + item_done on one thread, best of "
                  f"{args.replay} rounds of {n:,}\n")
            for mode in modes:
                if mode != "off":
                    print(f"| {mode} | {replay(client, bodies, mode, args.replay):.0f} ns |")
        return
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
