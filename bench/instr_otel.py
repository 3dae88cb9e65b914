"""One ``call_many`` of N items in one mode of bench/bench_otel.py, to be
counted under cachegrind by bench/instr_otel.sh (instructions of every
thread, load-independent: what run_otel.sh's CPU figures cannot give on a
shared machine).

    python3 bench/instr_otel.py --base-url URL --mode MODE --n N

Modes: ``off``, ``record`` (spans that record and keep nothing, no-op
meter), ``on`` (the SDK: a BatchSpanProcessor dropping the spans, a
MeterProvider never collected); ``sdk``: what ``on`` asked of the SDK for
one item (bench_otel.py's _Tap, during a batch of 300) made N times, one
span at a time, as bench_otel.py's ``sdk`` floor; ``harness``: the same
replay on ``record``'s providers, which cost next to nothing: the replay
loop's own instructions, which ``sdk`` includes (with those fakes' own, a
few thousand: ``sdk`` less ``harness`` understates the SDK alone by them,
and so overstates llmretry's share). The difference of two N
(instr_otel.sh: 2,500 less 500) leaves out what does not grow with N.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import llmretry  # noqa: E402
import llmretry.otel  # noqa: E402
from opentelemetry.metrics import NoOpMeterProvider  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

import bench_otel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--mode", required=True, choices=("off", "record", "on", "sdk", "harness"))
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--limit", type=int, default=64)
    args = ap.parse_args()
    bodies = [{"model": "gpt-bench", "max_tokens": 16,
               "messages": [{"role": "user", "content": f"Item {i}"}]}
              for i in range(max(args.n, 300))]
    processor = None
    if args.mode in ("on", "sdk"):
        tp = TracerProvider()
        processor = BatchSpanProcessor(bench_otel._Drop(), max_queue_size=2 * len(bodies))
        tp.add_span_processor(processor)
        llmretry.otel.instrument(tracer_provider=tp, meter_provider=MeterProvider(
            metric_readers=[InMemoryMetricReader()]))
    elif args.mode in ("record", "harness"):
        llmretry.otel.instrument(tracer_provider=bench_otel._RecordingProvider(),
                                 meter_provider=NoOpMeterProvider())
    with llmretry.Client(base_url=args.base_url, max_in_flight=max(256, args.limit)) as client:
        if args.mode in ("sdk", "harness"):
            tel = llmretry.otel._everywhere
            tap = bench_otel._Tap(tel)
            client.call_many(bodies[:300], limit=args.limit)
            tap.close()
            bench_otel.replay(tel, tap.script(), args.n, 1)
        else:
            out = client.call_many(bodies[:args.n], limit=args.limit)
            if out.summary.ok != args.n:
                raise SystemExit(f"{out.summary.failed} of {args.n} items failed")
    if processor is not None:
        processor.force_flush()


if __name__ == "__main__":
    main()
