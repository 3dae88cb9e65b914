"""llmretry.otel's overhead next to a peer's: the official GenAI
instrumentation of the openai SDK (``opentelemetry-instrumentation-openai-v2``)
on the SDK's own sync client, in one process, on the same OpenTelemetry SDK
providers, against the benchmarks' local nginx (bench/run_otel_peer.sh).

    python bench/bench_otel_peer.py --base-url URL [--n 20000] [--peer-n 4000]
        [--limit 64] [--peer-workers 64,1] [--rounds 5] [--census 200]

It needs the openai SDK and the instrumentation (run_otel_peer.sh installs
them into a venv of their own); llmretry comes from python/ as in
bench_otel.py, whose measuring code this reuses (imported, not copied).

Each round runs these batches once, in alternating order, each after a
``gc.collect()``:

- ``llmretry off`` / ``llmretry on``: ``call_many`` of N items, ``limit`` in
  flight, without and with ``llmretry.otel.instrument()`` (bench_otel.py's
  ``off`` and ``on``);
- ``openai/W off`` / ``openai/W on`` for each pool size W: the same request
  made by ``OpenAI(...).chat.completions.create`` from a pool of W threads
  (one client and one pool each, living as long as the run), without and
  with ``OpenAIInstrumentor().instrument(tracer_provider=, meter_provider=)``;

all with the same providers: a TracerProvider whose BatchSpanProcessor hands
the spans to an exporter that drops them, a MeterProvider whose reader is
never collected (bench_otel.py's ``on``). Then the SDK alone making what each
instrumentation asked of it for one call (taken down call by call during a
short tapped batch that is not measured), N times on the same providers, one
span at a time (``sdk``) and with as many spans alive at once as its batch
had (``sdk alive``): each overhead less its floor is that instrumentation's
own share.

Before the rounds a census batch of each client runs on in-memory providers
(SimpleSpanProcessor + InMemorySpanExporter, InMemoryMetricReader, and an SDK
LoggerProvider with an in-memory exporter for the log records the peer can
emit) and counts what each makes per call: the comparison is like for like
only as far as those counts match, so the report prints them. Every call of
every batch must succeed. One ``RESULT`` line per batch on stderr, the
report in markdown on stdout.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_otel as bo  # noqa: E402  (puts python/ on sys.path, imports llmretry)
import count_otel  # noqa: E402
import llmretry  # noqa: E402
import llmretry.otel  # noqa: E402
from openai import OpenAI  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk._logs.export import (InMemoryLogRecordExporter,  # noqa: E402
                                            SimpleLogRecordProcessor)
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (BatchSpanProcessor,  # noqa: E402
                                            SimpleSpanProcessor)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter)

MODEL = "gpt-bench"
TOKENS = 13      # the canned answer's usage.total_tokens


def body(i: int) -> Dict[str, Any]:
    """Item i's request, the same for both clients (bench_otel.py's)."""
    return {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": f"Item {i}"}]}


def _per_call(threads0: Dict[str, int], threads: Dict[str, int], n: int) -> Dict[str, float]:
    """Each role's CPU per call in µs and its sleeps per call, from two
    bench_otel._thread_cpu readings."""
    res: Dict[str, float] = {}
    for role in bo.ROLES:
        res[role] = (threads[role] - threads0[role]) / n / 1e3
        res[role + "_runs"] = (threads[role + "_runs"] - threads0[role + "_runs"]) / n
        res[role + "_sleeps"] = (threads.get(role + "_sleeps", 0)
                                 - threads0.get(role + "_sleeps", 0)) / n
    return res


class Peer:
    """The openai SDK's sync client, called from a pool of ``workers``
    threads. The pool lives as long as the run, so its threads' CPU is on
    /proc/self/task when it is read (bench_otel._thread_cpu counts them as
    ``other``: Python threads that are neither the main one nor the span
    processor's)."""

    def __init__(self, base_url: str, workers: int) -> None:
        self.workers = workers
        self.client = OpenAI(base_url=base_url, api_key="sk-bench", max_retries=2)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="peer")

    def call(self, i: int) -> int:
        # looked up per call, as users write it: the instrumentation wraps
        # Completions.create on the class, which a method bound before it
        # would not see
        return self.client.chat.completions.create(**body(i)).usage.total_tokens

    def batch(self, items: range) -> None:
        got = list(self.pool.map(self.call, items))
        bad = sum(1 for x in got if x != TOKENS)
        if bad:
            raise SystemExit(f"openai: {bad} of {len(got)} calls had a wrong answer")

    def run(self, n: int) -> Dict[str, float]:
        """One measured batch of n calls: CPU per call by thread, and in all."""
        gc_time = bo._GcTime()
        gc.callbacks.append(gc_time)
        try:
            threads0, c0, t0 = bo._thread_cpu(), bo._cpu(), time.perf_counter()
            self.batch(range(n))
            secs, cpu, threads = time.perf_counter() - t0, bo._cpu() - c0, bo._thread_cpu()
        finally:
            gc.callbacks.remove(gc_time)
        res = {"secs": secs, "cpu_us": cpu / n * 1e6, "gc_us": gc_time.total / n * 1e6}
        res.update(_per_call(threads0, threads, n))
        return res

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


# ---- what each makes: a census on in-memory providers ----------------------

def census(do_batch: Callable[[], int], instrument: Callable[..., None],
           uninstrument: Callable[[], None]) -> Dict[str, Any]:
    """Instrument with in-memory providers, run one batch (``do_batch``
    returns its calls), and count per call what came out."""
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    logs = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(logs))
    instrument(tracer_provider=tp, meter_provider=mp, logger_provider=lp)
    try:
        n = do_batch()
    finally:
        uninstrument()
    finished = spans.get_finished_spans()
    records: Dict[str, int] = {}
    sums: Dict[str, float] = {}
    # one collection: it hands out the exemplars and resets them
    data = reader.get_metrics_data()
    points = [(m, p) for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics for p in m.data.data_points]
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                # a histogram's data points count its measurements; a
                # counter's (llmretry's attempts, added once a batch) only
                # sum them: its sum per call is printed instead
                if all(hasattr(p, "count") for p in m.data.data_points):
                    records[m.name] = records.get(m.name, 0) + sum(
                        p.count for p in m.data.data_points)
                else:
                    sums[m.name] = sums.get(m.name, 0) + sum(p.value for p in m.data.data_points)
    out = {
        "n": n,
        "spans": len(finished) / n,
        "names": sorted({s.name for s in finished}),
        "attributes": statistics.mean(len(s.attributes) for s in finished) if finished else 0,
        "attribute_keys": sorted({k for s in finished for k in s.attributes}),
        "events": statistics.mean(len(s.events) for s in finished) if finished else 0,
        "exemplars": sum(len(p.exemplars) for _m, p in points),
        "records": {k: v / n for k, v in sorted(records.items())},
        "sums": {k: v / n for k, v in sorted(sums.items())},
        "logs": len(logs.get_finished_logs()) / n,
    }
    tp.shutdown()
    mp.shutdown()
    lp.shutdown()
    return out


# ---- the peer's floor: what its instrumentation asks of the SDK -------------

class PeerTap:
    """Providers to hand ``OpenAIInstrumentor().instrument()`` for a short
    batch (not measured) that take down every call the instrumentation makes
    on the SDK's tracer, spans and histograms, with their arguments, and
    pass them on to the real ones (``on``'s providers). A histogram record's
    ``context=`` (the instrumentation passes its span's: exemplars read it) is
    noted, not kept, so the replay can hand over its own span's."""

    def __init__(self, tp: Any, mp: Any) -> None:
        self.scripts: List[List[Any]] = []
        self.tracer: Any = None     # the real tracer its spans were started on
        self.alive = self.most_alive = 0
        tap = self

        class Span:
            def __init__(self, real: Any, ops: List[Any]) -> None:
                self.real, self.ops = real, ops

            def __getattr__(self, name: str) -> Any:
                real = getattr(self.real, name)
                if not callable(real):
                    return real

                def call(*args: Any, **kwargs: Any) -> Any:
                    self.ops.append((name, bo._copied(args), bo._copied(kwargs)))
                    if name == "end":
                        tap.alive -= 1
                    return real(*args, **kwargs)
                return call

        class Tracer:
            def __init__(self, real: Any) -> None:
                self.real = real

            def start_span(self, *args: Any, **kwargs: Any) -> Any:
                ops: List[Any] = [("start_span", bo._copied(args), bo._copied(kwargs))]
                tap.scripts.append(ops)
                tap.alive += 1
                tap.most_alive = max(tap.most_alive, tap.alive)
                tap.tracer = self.real
                return Span(self.real.start_span(*args, **kwargs), ops)

            def __getattr__(self, name: str) -> Any:
                # start_as_current_span and the rest are not used on this
                # path (util-genai starts spans with start_span); one that
                # is would be missed by the floor: say so
                raise SystemExit(f"the peer's instrumentation called Tracer.{name}: "
                                 f"bench_otel_peer.PeerTap does not take it down")

        class TracerProvider_:
            def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
                return Tracer(tp.get_tracer(*args, **kwargs))

        class Histogram:
            def __init__(self, real: Any) -> None:
                self.real = real

            def record(self, amount: Any, attributes: Any = None, context: Any = None) -> None:
                # the tap's span in the context it passes (trace.get_current_span
                # would not return it: it is no trace.Span)
                span = next((v for v in (context or {}).values() if isinstance(v, Span)), None)
                if span is not None:
                    span.ops.append(("record", self.real, amount, bo._copied(attributes),
                                     context is not None))
                else:
                    raise SystemExit(f"a histogram record the tap cannot tie to a span: {span!r} {context!r}")
                self.real.record(amount, attributes=attributes,
                                 context=trace.set_span_in_context(span.real, context)
                                 if context is not None else None)

        class Meter:
            def __init__(self, real: Any) -> None:
                self.real = real

            def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
                return Histogram(self.real.create_histogram(*args, **kwargs))

            def __getattr__(self, name: str) -> Any:
                return getattr(self.real, name)     # instruments it does not use per call

        class MeterProvider_:
            def get_meter(self, *args: Any, **kwargs: Any) -> Any:
                return Meter(mp.get_meter(*args, **kwargs))

        self.tracer_provider = TracerProvider_()
        self.meter_provider = MeterProvider_()

    def script(self) -> List[Any]:
        """One whole call's (the batch's calls are alike)."""
        for ops in reversed(self.scripts):
            if ops[-1][0] == "end" and any(op[0] == "record" for op in ops):
                return ops
        raise SystemExit("no call of the peer's was taken down whole")


def replay_peer(tracer: Any, script: List[Any], n: int, alive: int) -> Dict[str, float]:
    """The SDK alone making ``n`` times what the peer's instrumentation asked
    of it for one call: ``tracer.start_span`` (``tracer``: the real one
    the tap handed it, from ``on``'s provider), the span's methods, the histogram records with the span's own
    context as the instrumentation passes it (exemplars are sampled from
    it), in the order it made them, with ``alive`` spans started and not
    ended at once (1: one at a time); on this thread. CPU per call by
    thread, in µs (bench_otel.replay's figures for llmretry's script)."""
    from collections import deque
    (_, start_args, start_kwargs), ops = script[0], script[1:]
    ring: deque = deque()

    def finish(span: Any) -> None:
        ctx = trace.set_span_in_context(span)
        for op in ops:
            if op[0] == "record":
                _, histogram, amount, attributes, with_context = op
                histogram.record(amount, attributes=attributes,
                                 context=ctx if with_context else None)
            else:
                name, args, kwargs = op
                getattr(span, name)(*args, **kwargs)

    gc_time = bo._GcTime()
    gc.callbacks.append(gc_time)
    threads0, c0 = bo._thread_cpu(), bo._cpu()
    for _ in range(n):
        ring.append(tracer.start_span(*start_args, **start_kwargs))
        if len(ring) >= alive:
            finish(ring.popleft())
    while ring:
        finish(ring.popleft())
    cpu, threads = bo._cpu() - c0, bo._thread_cpu()
    gc.callbacks.remove(gc_time)
    res = {"cpu_us": cpu / n * 1e6, "gc_us": gc_time.total / n * 1e6}
    res.update(_per_call(threads0, threads, n))
    return res


# ---- the same, counted: Python bytecodes per call, not time ----------------

_BENCH_FILES = ("bench_otel.py", "bench_otel_peer.py")


def counted(fn: Callable[[], Any], n: int, skip: Tuple[str, ...] = ()) -> Dict[str, float]:
    """The Python bytecodes and function calls this thread runs in ``fn()``,
    per call of its ``n`` (count_otel.py's sys.settrace counter: other
    threads, C and the kernel are not counted), leaving out the functions of
    the files named in ``skip`` (the replay loops' own). Load does not move
    them."""
    counter = count_otel._Counter()
    sys.settrace(counter)
    try:
        fn()
    finally:
        sys.settrace(None)
    ops = sum(v for key, v in counter.ops.items() if key[0] not in skip)
    calls = sum(v for key, v in counter.calls.items() if key[0] not in skip)
    return {"ops": ops / n, "calls": calls / n}


# ---- the report --------------------------------------------------------------

def _client(who: str) -> str:
    """``llmretry`` or ``openai/N`` in words."""
    if who == "llmretry":
        return "llmretry `call_many`"
    workers = int(who.split("/")[1])
    return f"openai SDK, {workers} thread{'s' if workers > 1 else ''}"


def _what(row: str, alive: Dict[str, int]) -> str:
    """A row's label: ``llmretry off``, ``openai/64 on``, ``openai sdk alive``..."""
    who, mode = row.split(" ", 1)
    if mode == "sdk":
        return (f"the SDK alone making {who}'s instrumentation's calls for one call, "
                f"one span at a time; no HTTP")
    if mode == "sdk alive":
        return f"the same with {alive[who]} spans alive at once, as its batch had"
    on = ("`llmretry.otel.instrument()`" if who == "llmretry"
          else "`OpenAIInstrumentor().instrument()`")
    return f"{_client(who)}, " + ("not instrumented" if mode == "off" else on)


def report(args: argparse.Namespace, peers: List[str],
           results: Dict[str, List[Dict[str, float]]], counts: Dict[str, Dict[str, Any]],
           scripts: Dict[str, List[Any]], alive: Dict[str, int],
           counts_ops: Dict[str, Dict[str, float]]) -> None:
    import platform
    import subprocess
    from importlib.metadata import version
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip() or "?"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    pkgs = ", ".join(f"{p} {version(p)}" for p in (
        "opentelemetry-sdk", "opentelemetry-instrumentation-openai-v2",
        "opentelemetry-util-genai", "openai", "httpx2", "wrapt"))

    def med(row: str, key: str) -> float:
        return statistics.median(x[key] for x in results[row])

    pools = ", ".join(p.split("/")[1] for p in peers)
    print(f"llmretry OpenTelemetry overhead next to the openai SDK's instrumentation — "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores "
          f"(load average {load} at the end), CPython {platform.python_version()}, {pkgs}, "
          f"commit {commit}.\n")
    print(f"One process, the same providers for both (a TracerProvider with a "
          f"BatchSpanProcessor and an exporter that drops, a MeterProvider whose reader is "
          f"never collected), the same request to the local nginx's 0 ms endpoint. "
          f"llmretry: `call_many` of {args.n:,} items, {args.limit} in flight; openai: "
          f"{args.peer_n:,} calls of `OpenAI().chat.completions.create` (sync) from a pool "
          f"of {pools} threads (`openai/N`). {args.rounds} rounds, each batch once a round "
          f"in alternating order, medians; the SDK-alone floors ({args.n:,} calls each) "
          f"after each round. CPU per call in µs by thread "
          f"(/proc/self/task/*/schedstat): the calling thread, the pool's threads (the "
          f"peer's calls and their telemetry run there), the engine's I/O thread, the span "
          f"processor's; the process (user + sys, every thread); Python's GC.\n")
    print("| row | calling thread | pool threads | I/O thread | span processor | process | "
          "Python's GC | calls/s | rounds (process) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in results:
        rounds = " ".join(f"{x['cpu_us']:.0f}" for x in results[row])
        n = args.n if row.startswith("llmretry") else args.peer_n
        rate = f"{n / med(row, 'secs'):,.0f}" if "secs" in results[row][0] else ""
        print(f"| `{row}`: {_what(row, alive)} | {med(row, 'caller'):.1f} | "
              f"{med(row, 'other'):.1f} | {med(row, 'io'):.1f} | {med(row, 'spans'):.1f} | "
              f"{med(row, 'cpu_us'):.1f} | {med(row, 'gc_us'):.1f} | {rate} | {rounds} |")

    print(f"\nWhat each makes per call (a census batch of {args.census} calls each on "
          f"in-memory providers before the rounds: SimpleSpanProcessor, InMemoryMetricReader, "
          f"an SDK LoggerProvider):\n")
    print("| client | spans | span name | attributes | span events | metric records "
          "(by instrument) | exemplars | log records |")
    print("|---|---:|---|---:|---:|---|---:|---:|")
    for who, c in counts.items():
        recs = "; ".join([f"`{k}` {v:g}" for k, v in c["records"].items()]
                         + [f"counter `{k}` +{v:g}" for k, v in c["sums"].items()])
        print(f"| {who} | {c['spans']:g} | {', '.join(c['names'])} | "
              f"{c['attributes']:g} | {c['events']:g} | {recs} | {c['exemplars']} | "
              f"{c['logs']:g} |")
    print()
    for who, c in counts.items():
        print(f"- {who}'s span attributes: {', '.join(f'`{k}`' for k in c['attribute_keys'])}.")
    for who in ("llmretry", "openai"):
        calls = ", ".join(op[0] for op in scripts[who])
        print(f"- What {who}'s instrumentation asked of the SDK per call (taken down in a "
              f"tapped batch; its floor makes exactly these): {calls}.")

    clients = ["llmretry"] + peers

    def paired(w: str, key: Callable[[Dict[str, float]], float]) -> List[float]:
        """Round i's on less round i's off (they ran seconds apart)."""
        return [key(on) - key(off) for on, off in zip(results[f"{w} on"], results[f"{w} off"])]

    proc_rounds = {w: paired(w, lambda x: x["cpu_us"]) for w in clients}
    proc = {w: statistics.median(v) for w, v in proc_rounds.items()}
    thr = {w: statistics.median(paired(w, lambda x: x["caller"] + x["other"])) for w in clients}

    def floor(w: str, alive_too: bool) -> float:
        who = w.split("/")[0]
        if alive_too and (who == "llmretry" or int(w.split("/")[1]) > 1):
            return med(f"{who} sdk alive", "cpu_us")
        return med(f"{who} sdk", "cpu_us")

    head = " | ".join(_client(p) for p in peers)
    print(f"\n| per call (µs) | llmretry | {head} | "
          + " | ".join(f"llmretry ÷ `{p}`" for p in peers) + " |")
    print("|---|---:|" + "---:|" * (2 * len(peers)))
    lines = [
        ("not instrumented (process)", {w: med(f"{w} off", "cpu_us") for w in clients}),
        ("**overhead**, on less off (process; the median of the rounds' differences)", proc),
        ("overhead on the Python threads that make the calls (calling thread + pool)", thr),
        ("the SDK alone: its instrumentation's calls, one span at a time",
         {w: floor(w, False) for w in clients}),
        ("the SDK alone with as many spans alive as its batch had",
         {w: floor(w, True) for w in clients}),
        ("overhead less the SDK alone (the instrumentation's own share)",
         {w: proc[w] - floor(w, False) for w in clients}),
        ("overhead less the SDK alone with its spans alive",
         {w: proc[w] - floor(w, True) for w in clients}),
    ]
    for label, v in lines:
        ratios = " | ".join(f"{v['llmretry'] / v[p]:.2f}×" if v[p] > 0 else "—" for p in peers)
        print(f"| {label} | {v['llmretry']:.1f} | "
              + " | ".join(f"{v[p]:.1f}" for p in peers) + f" | {ratios} |")
    print("\n- The overhead round by round (process, on less off, µs): "
          + "; ".join(f"{w} " + " ".join(f"{x:+.0f}" for x in proc_rounds[w]) for w in clients)
          + ".")
    if counts_ops:
        c = counts_ops
        print(f"\nCounted, not timed ({args.count} calls each, after the census; "
              f"`count_otel.py`'s sys.settrace counter on the thread that runs the calls "
              f"and their telemetry: llmretry's calling thread under `call_many`, the peer's "
              f"calls made one after another on it; the span processor's thread, C and the "
              f"kernel not counted; the SDK-alone floor counted the same way, one span at a "
              f"time, without the replay loop's own functions). Python bytecodes and function calls per call; load does not move "
              f"them:\n")
        print("| per call | llmretry bytecodes | openai bytecodes | llmretry ÷ openai | "
              "llmretry Python calls | openai Python calls |")
        print("|---|---:|---:|---:|---:|---:|")

        def both(label: str, f: Callable[[str, str], float]) -> None:
            lo, oo = f("llmretry", "ops"), f("openai", "ops")
            print(f"| {label} | {lo:,.0f} | {oo:,.0f} | "
                  f"{f'{lo / oo:.2f}×' if oo > 0 else '—'} | {f('llmretry', 'calls'):,.0f} | "
                  f"{f('openai', 'calls'):,.0f} |")
        both("not instrumented", lambda w, k: c[f"{w} off"][k])
        both("instrumented", lambda w, k: c[f"{w} on"][k])
        both("**overhead**, on less off", lambda w, k: c[f"{w} on"][k] - c[f"{w} off"][k])
        both("the SDK alone (its floor)", lambda w, k: c[f"{w} sdk"][k])
        both("overhead less the SDK alone (the instrumentation's own Python)",
             lambda w, k: c[f"{w} on"][k] - c[f"{w} off"][k] - c[f"{w} sdk"][k])
        print()
    print(f"- The overhead as a share of an uninstrumented call (process): llmretry "
          f"{100 * proc['llmretry'] / med('llmretry off', 'cpu_us'):.0f} %, "
          + ", ".join(f"`{p}` {100 * proc[p] / med(f'{p} off', 'cpu_us'):.0f} %" for p in peers)
          + ".")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--n", type=int, default=20000, help="llmretry's calls per batch")
    ap.add_argument("--peer-n", type=int, default=4000, help="the openai SDK's calls per batch")
    ap.add_argument("--limit", type=int, default=64, help="call_many's limit")
    ap.add_argument("--peer-workers", default="64,1",
                    help="the peer's pool sizes, comma- or space-separated (one batch each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=500,
                    help="calls per client counted in bytecodes (sys.settrace; 0: none)")
    ap.add_argument("--census", type=int, default=200,
                    help="calls per client in the census batch (in-memory providers)")
    args = ap.parse_args()
    workers = sorted({int(w) for w in args.peer_workers.replace(" ", ",").split(",") if w},
                     reverse=True)
    if not workers or workers[-1] < 1:
        raise SystemExit("--peer-workers: pool sizes of at least 1")
    bodies = [body(i) for i in range(args.n)]
    # bench_otel.py's `on` providers (its main() makes them the same way)
    tp = TracerProvider()
    processor = BatchSpanProcessor(bo._Drop(), max_queue_size=max(args.n, args.peer_n) * 2)
    tp.add_span_processor(processor)
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrumentor = OpenAIInstrumentor()
    peers = {f"openai/{w}": Peer(args.base_url, w) for w in workers}
    big = peers[f"openai/{workers[0]}"]
    with llmretry.Client(base_url=args.base_url, max_in_flight=max(256, args.limit)) as client:
        # warm-up: connections, caches, the pools' threads
        bo.run(client, bodies[:2000], args.limit)
        for peer in peers.values():
            peer.batch(range(max(200, 20 * peer.workers)))

        def llm_batch() -> int:
            out = client.call_many(bodies[:args.census], limit=args.limit)
            if out.summary.ok != args.census:
                raise SystemExit(f"census: {out.summary.failed} llmretry items failed")
            return args.census

        def peer_batch() -> int:
            big.batch(range(args.census))
            return args.census

        counts = {
            "llmretry": census(llm_batch,
                               lambda logger_provider, **kw: llmretry.otel.instrument(**kw),
                               llmretry.otel.uninstrument),
            "openai + instrumentation": census(peer_batch, instrumentor.instrument,
                                               instrumentor.uninstrument),
        }
        print(f"CENSUS {counts}", file=sys.stderr, flush=True)

        # What each instrumentation asks of the SDK for one call, taken down
        # on `on`'s providers during a short batch (not measured).
        llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
        tap = bo._Tap(llmretry.otel._everywhere)
        bo.run(client, bodies[:3000], args.limit)
        tap.close()
        llmretry.otel.uninstrument()
        ptap = PeerTap(tp, mp)
        instrumentor.instrument(tracer_provider=ptap.tracer_provider,
                                meter_provider=ptap.meter_provider)
        big.batch(range(max(1000, 20 * big.workers)))
        instrumentor.uninstrument()
        processor.force_flush()
        scripts = {"llmretry": tap.script(), "openai": ptap.script()}
        alive = {"llmretry": tap.most_alive, "openai": ptap.most_alive}
        for who, script in scripts.items():
            print(f"SCRIPT {who} (spans alive at once: {alive[who]})", file=sys.stderr)
            for op in script:
                print(f"  {op}", file=sys.stderr)

        # Counted, on this thread: llmretry's calling thread runs call_many
        # and every span and record; the peer's calls are made here one
        # after another, on a client of their own (one connection: the
        # 64-thread client's pool has 64, and httpx2 walks them in Python
        # for every request, by a count that moves as nginx closes them).
        # The SDK's processor thread is not counted for either.
        counts_ops: Dict[str, Dict[str, float]] = {}
        k = args.count
        if k:
            lone = Peer(args.base_url, 1)
            lone.batch(range(200))

            def peer_seq() -> None:
                for i in range(k):
                    if lone.call(i) != TOKENS:
                        raise SystemExit("openai: a wrong answer")

            def llm_batch_k() -> None:
                if client.call_many(bodies[:k], limit=args.limit).summary.ok != k:
                    raise SystemExit("llmretry: an item failed")
            # The floors leave out the replay loops' own functions; what
            # they call to read every thread's CPU before and after (the
            # stdlib's Python) is counted alone and taken off.
            probe = counted(lambda: (bo._thread_cpu(), bo._cpu(), bo._thread_cpu(), bo._cpu()),
                            k, _BENCH_FILES)
            llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
            counts_ops["llmretry sdk"] = counted(lambda: bo.replay(
                llmretry.otel._everywhere, scripts["llmretry"], k, 1), k, _BENCH_FILES)
            llmretry.otel.uninstrument()
            counts_ops["openai sdk"] = counted(
                lambda: replay_peer(ptap.tracer, scripts["openai"], k, 1), k, _BENCH_FILES)
            for floor in ("llmretry sdk", "openai sdk"):
                for key in ("ops", "calls"):
                    counts_ops[floor][key] -= probe[key]
            counts_ops["llmretry off"] = counted(llm_batch_k, k)
            counts_ops["openai off"] = counted(peer_seq, k)
            # each instrumented alone, as in the timed batches
            llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
            try:
                counts_ops["llmretry on"] = counted(llm_batch_k, k)
            finally:
                llmretry.otel.uninstrument()
            instrumentor.instrument(tracer_provider=tp, meter_provider=mp)
            try:
                counts_ops["openai on"] = counted(peer_seq, k)
            finally:
                instrumentor.uninstrument()
            processor.force_flush()
            lone.close()
            print(f"COUNTED {counts_ops}", file=sys.stderr, flush=True)

        def measure(row: str) -> Dict[str, float]:
            who, mode = row.split(" ", 1)
            if who == "llmretry":
                if mode == "off":
                    return bo.run(client, bodies, args.limit)
                llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
                try:
                    return bo.run(client, bodies, args.limit)
                finally:
                    processor.force_flush()
                    llmretry.otel.uninstrument()
            if mode == "off":
                return peers[who].run(args.peer_n)
            instrumentor.instrument(tracer_provider=tp, meter_provider=mp)
            try:
                return peers[who].run(args.peer_n)
            finally:
                processor.force_flush()
                instrumentor.uninstrument()

        batches = [f"{who} {mode}" for who in ["llmretry", *peers] for mode in ("off", "on")]
        floors = ["llmretry sdk", "llmretry sdk alive", "openai sdk", "openai sdk alive"]
        results: Dict[str, List[Dict[str, float]]] = {r: [] for r in batches + floors}
        for r in range(args.rounds):
            for row in batches if r % 2 == 0 else batches[::-1]:
                # every batch starts with the same garbage: none (with 64
                # threads a full collection of the last batch's leftovers
                # would land on whichever batch came next)
                gc.collect()
                res = measure(row)
                results[row].append(res)
                print(bo._line(row.replace(" ", "-"), args.n if row[0] == "l" else args.peer_n,
                               res), file=sys.stderr, flush=True)
            # the floors once a round, on `on`'s providers
            llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
            for row, at_once in (("llmretry sdk", 1), ("llmretry sdk alive", alive["llmretry"])):
                res = bo.replay(llmretry.otel._everywhere, scripts["llmretry"], args.n, at_once)
                processor.force_flush()
                results[row].append(res)
                print(bo._line(row.replace(" ", "-"), args.n, res), file=sys.stderr, flush=True)
            llmretry.otel.uninstrument()
            for row, at_once in (("openai sdk", 1), ("openai sdk alive", alive["openai"])):
                res = replay_peer(ptap.tracer, scripts["openai"], args.n, at_once)
                processor.force_flush()
                results[row].append(res)
                print(bo._line(row.replace(" ", "-"), args.n, res), file=sys.stderr, flush=True)
    for peer in peers.values():
        peer.close()
    report(args, list(peers), results, counts, scripts, alive, counts_ops)
    tp.shutdown()
    mp.shutdown()


if __name__ == "__main__":
    main()
