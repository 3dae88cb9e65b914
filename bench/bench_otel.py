"""The overhead of llmretry.otel: ``call_many`` of N calls with and without
instrumentation, against the benchmarks' local nginx (bench/run_otel.sh).

    python3 bench/bench_otel.py --base-url URL [--n 20000] [--limit 64] [--rounds 3]
        [--modes off,on,...] [--burn-us 150]

Each round runs, in this process and in alternating order, the same batch
these ways: ``off`` (not instrumented); ``on`` (``instrument()`` with an SDK
TracerProvider whose BatchSpanProcessor hands the spans to an exporter that
drops them, and an SDK MeterProvider whose reader is never collected);
``noop`` (``instrument()`` with the API's no-op providers: llmretry's own
work for a span that does not record, which builds no attributes); ``record``
(a tracer whose spans record and keep nothing: llmretry's own work for a
span that records, without the SDK's); ``traces`` and ``metrics`` (the SDK
for one signal, the no-op for the other); ``events`` (not instrumented, with
a logger and an ``on_result`` that do nothing: what receiving every event
and every item's value costs, the floor of anything built on them); and
``slow`` (not instrumented, an ``on_result`` burning about the CPU ``on``
adds to the calling thread: what a slow caller does to the rest).

Every batch's CPU is split by thread (/proc/self/task/*/schedstat): the
calling thread (submits items, reads results, makes the spans and metrics),
the engine's I/O thread, the SDK's span processor thread; the process's
total and the GC's part come too. Under ``on`` the calling thread is the
bottleneck, so a process-wide figure mixes llmretry's work with what a
slower caller does to the I/O thread; the calling thread's is the figure.

The SDK's floor, ``sdk``: during a short batch (not measured) every call
llmretry makes on the SDK for an item is taken down (the span's start with
its attributes and context, what is called on the span, the histogram
records with their context); after each round they are made N times on
``on``'s own providers (the same processor, views and exemplar filter), one
span at a time, with no llmretry and no HTTP; ``sdk_alive`` makes them with
as many spans alive at once as the batch had. ``on``'s calling thread less
``off``'s less ``sdk``'s is llmretry's own share. It prints one ``RESULT``
line per batch on stderr, then the report in markdown. Every batch must
succeed whole.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import llmretry  # noqa: E402
import llmretry.otel  # noqa: E402
from opentelemetry.metrics import NoOpMeterProvider  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, SpanExporter,  # noqa: E402
                                            SpanExportResult)
from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.trace import NoOpTracerProvider, SpanContext, TraceFlags  # noqa: E402


class _Drop(SpanExporter):
    """An exporter that exports nothing (the cost of the SDK, not of a wire)."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Recording(trace.Span):
    """A span that records and keeps nothing: what llmretry does for a span
    that records (attributes, attempt events, its traceparent) without the
    SDK's work."""

    # One context for all (ids are the SDK's work): a valid, sampled one.
    _CTX = SpanContext(random.getrandbits(128) | 1, random.getrandbits(64) | 1, False,
                       TraceFlags(TraceFlags.SAMPLED))

    def get_span_context(self) -> SpanContext:
        return self._CTX

    def is_recording(self) -> bool:
        return True

    def set_attributes(self, attributes: Any) -> None:
        pass

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
        pass

    def update_name(self, name: str) -> None:
        pass

    def set_status(self, status: Any, description: Any = None) -> None:
        pass

    def record_exception(self, *args: Any, **kwargs: Any) -> None:
        pass

    def end(self, end_time: Any = None) -> None:
        pass


class _RecordingTracer(trace.Tracer):
    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return _Recording()

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class _RecordingProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _RecordingTracer()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# The threads a batch runs on, by role: the calling thread (which submits
# the items, reads their results and, instrumented, makes their spans and
# metrics), the engine's I/O thread (C: libcurl; any thread Python did not
# start), the SDK's BatchSpanProcessor thread, and any other.
ROLES = ("caller", "io", "spans", "other")


def _role(tid: int, python_threads: Dict[int, str]) -> str:
    if tid == threading.main_thread().native_id:
        return "caller"
    name = python_threads.get(tid)
    if name is None:
        return "io"
    return "spans" if name.startswith("OtelBatchSpan") else "other"


def _thread_cpu() -> Dict[str, int]:
    """Each role's CPU time so far, in ns, and its runs (times it was put on
    a CPU: its wake-ups, and its preemptions on a busy machine), from
    /proc/self/task/*/schedstat (the scheduler's own count of a thread's
    time on a CPU: finer than stat's ticks). A thread that ended since the
    last reading is lost: the roles' threads live as long as the client
    and the providers."""
    python_threads = {t.native_id: t.name for t in threading.enumerate()}
    out = dict.fromkeys(ROLES, 0)
    out.update(dict.fromkeys((r + "_runs" for r in ROLES), 0))
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns, _wait, runs = (int(x) for x in f.read().split()[:3])
        except (OSError, ValueError):   # it just ended
            continue
        role = _role(int(tid), python_threads)
        out[role] += ns
        out[role + "_runs"] += runs
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out[role + "_sleeps"] = out.get(role + "_sleeps", 0) + int(line.split()[1])
        except (OSError, ValueError):
            pass
    return out


class _GcTime:
    """The CPU time Python's cyclic garbage collector takes, summed over its
    runs (gc.callbacks; a run's time is its thread's)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0

    def __call__(self, phase: str, _info: Dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.total += time.thread_time() - self._start


def _burner(us: float) -> Any:
    """An on_result that takes ``us`` µs of its thread's CPU."""
    ns = int(us * 1000)
    clock = time.thread_time_ns

    def burn(_i: int, _value: Any) -> None:
        end = clock() + ns
        while clock() < end:
            pass
    return burn


def run(client: llmretry.Client, bodies: List[Dict[str, Any]], limit: int,
        **options: Any) -> Dict[str, float]:
    gc_time = _GcTime()
    gc.callbacks.append(gc_time)
    try:
        threads0, c0, t0 = _thread_cpu(), _cpu(), time.perf_counter()
        out = client.call_many(bodies, limit=limit, **options)
        secs, cpu, threads = time.perf_counter() - t0, _cpu() - c0, _thread_cpu()
    finally:
        gc.callbacks.remove(gc_time)
    if out.summary.ok != len(bodies):
        raise SystemExit(f"{out.summary.failed} of {len(bodies)} items failed")
    n = len(bodies)
    res = {"secs": secs, "cpu_us": cpu / n * 1e6, "gc_us": gc_time.total / n * 1e6}
    for role in ROLES:
        res[role] = (threads[role] - threads0[role]) / n / 1e3
        res[role + "_runs"] = (threads[role + "_runs"] - threads0[role + "_runs"]) / n
        res[role + "_sleeps"] = (threads.get(role + "_sleeps", 0)
                                 - threads0.get(role + "_sleeps", 0)) / n
    return res


_WHAT = {
    "off": "not instrumented",
    "events": "not instrumented; a logger and an on_result that do nothing",
    "slow": "not instrumented; an on_result that burns CPU (a slow caller, no telemetry)",
    "noop": "instrument() with the API's no-op providers (spans that do not record)",
    "record": "instrument() with spans that record and keep nothing, no-op meter "
              "(llmretry's own work for a recording span)",
    "traces": "the SDK's TracerProvider (BatchSpanProcessor, exporter dropping), no-op meter",
    "metrics": "the SDK's MeterProvider (reader never collected), no-op tracer",
    "on": "the SDK for both",
}


class _Tap:
    """What llmretry asks of the SDK for each item, taken down during a short
    batch (not a measured one: the taking costs): each span's calls (its
    start, then every method called on it) and the histogram records made
    after its end, with their arguments and current context; and how many
    spans are alive at once. ``script()`` is one item's, to replay."""

    def __init__(self, tel: Any) -> None:
        self.tel = tel
        self.saved = (tel.tracer, tel.duration, tel.tokens, tel.ttfc)
        self.spans: List[List[Any]] = []
        self.alive = self.most_alive = 0
        self.last: Optional[List[Any]] = None
        tap = self

        class Span:
            def __init__(self, span: Any, ops: List[Any]) -> None:
                self._span, self._ops = span, ops

            def __getattr__(self, name: str) -> Any:
                real = getattr(self._span, name)

                def call(*args: Any, **kwargs: Any) -> Any:
                    self._ops.append((name, _copied(args), _copied(kwargs)))
                    if name == "end":
                        tap.alive -= 1
                        tap.last = self._ops
                    return real(*args, **kwargs)
                return call

        class Tracer:
            def start_span(self, *args: Any, **kwargs: Any) -> Any:
                ops: List[Any] = [("start_span", _copied(args), _copied(kwargs))]
                tap.spans.append(ops)
                tap.alive += 1
                tap.most_alive = max(tap.most_alive, tap.alive)
                return Span(tap.saved[0].start_span(*args, **kwargs), ops)

        class Histogram:
            def __init__(self, real: Any) -> None:
                self.real = real

            def record(self, *args: Any, **kwargs: Any) -> None:
                if tap.last is not None:
                    tap.last.append(("record", self.real, _copied(args), _copied(kwargs),
                                     otel_context.get_current()))
                self.real.record(*args, **kwargs)

        tel.tracer = Tracer()
        tel.duration, tel.tokens, tel.ttfc = (Histogram(h) for h in self.saved[1:])

    def close(self) -> None:
        self.tel.tracer, self.tel.duration, self.tel.tokens, self.tel.ttfc = self.saved

    def script(self) -> List[Any]:
        """The calls of the last item that ended (the batch's items are alike)."""
        for ops in reversed(self.spans):
            if ops[-1][0] == "record":
                return ops
        raise SystemExit("no item's calls were taken down")


def _copied(x: Any) -> Any:
    """Arguments as they were at the call (llmretry hands over dicts it may reuse)."""
    if isinstance(x, dict):
        return {k: _copied(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_copied(v) for v in x)
    return x


def replay(tel: Any, script: List[Any], n: int, alive: int) -> Dict[str, float]:
    """The SDK alone making ``n`` times what llmretry asked of it for one
    item (``script``, _Tap's), on ``tel``'s own tracer and histograms (the
    providers, processor and exemplar filter of ``on``), with ``alive``
    spans started and not yet ended at once, as in the batch (1: each ended
    before the next starts), on this thread (where llmretry makes them); the
    times are now's. CPU per call by thread, in µs."""
    from collections import deque
    (_, start_args, start_kwargs), ops = script[0], script[1:]
    start_kwargs = dict(start_kwargs)
    tracer = tel.tracer
    ring: deque = deque()

    def finish(span: Any) -> None:
        for op in ops:
            if op[0] == "record":
                _, histogram, args, kwargs, ctx = op
                if ctx is otel_context.get_current():
                    histogram.record(*args, **kwargs)
                else:       # the context it was recorded in (exemplars read it)
                    token = otel_context.attach(ctx)
                    histogram.record(*args, **kwargs)
                    otel_context.detach(token)
                continue
            name, args, kwargs = op
            if "end_time" in kwargs or "timestamp" in kwargs:
                kwargs = dict(kwargs)
                kwargs["end_time" if "end_time" in kwargs else "timestamp"] = time.time_ns()
            getattr(span, name)(*args, **kwargs)

    gc_time = _GcTime()
    gc.callbacks.append(gc_time)
    threads0, c0 = _thread_cpu(), _cpu()
    for _ in range(n):
        start_kwargs["start_time"] = time.time_ns()
        ring.append(tracer.start_span(*start_args, **start_kwargs))
        if len(ring) >= alive:
            finish(ring.popleft())
    while ring:
        finish(ring.popleft())
    cpu, threads = _cpu() - c0, _thread_cpu()
    gc.callbacks.remove(gc_time)
    res = {"cpu_us": cpu / n * 1e6, "gc_us": gc_time.total / n * 1e6}
    for role in ROLES:
        res[role] = (threads[role] - threads0[role]) / n / 1e3
        res[role + "_runs"] = (threads[role + "_runs"] - threads0[role + "_runs"]) / n
        res[role + "_sleeps"] = (threads.get(role + "_sleeps", 0)
                                 - threads0.get(role + "_sleeps", 0)) / n
    return res


_FLOORS = {
    "sdk": "the SDK alone: what `on` asked of it for one item (taken down: the span's "
           "start, attributes, attempt event and end, the histogram records, with their "
           "arguments and context), made N times on `on`'s providers, one span at a time; "
           "no llmretry, no HTTP",
    "sdk_alive": "the same with as many spans alive at once as `on` had",
}


def report(args: argparse.Namespace, modes: List[str],
           results: Dict[str, List[Dict[str, float]]], script: List[Any], alive: int) -> None:
    """The markdown of one run."""
    import platform
    import subprocess
    from importlib.metadata import version
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip() or "?"
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())

    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in results[mode])

    print(f"llmretry OpenTelemetry overhead benchmark — "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores "
          f"shared with other jobs (load average {load} at the end), CPython "
          f"{platform.python_version()}, opentelemetry-sdk {version('opentelemetry-sdk')}, "
          f"commit {commit}.\n")
    print(f"`call_many` of {args.n:,} calls ({args.limit} in flight) against the local nginx's "
          f"0 ms endpoint, each mode once per round in alternating order, {args.rounds} "
          f"rounds (medians). CPU per call, in µs, by thread (the scheduler's count, "
          f"/proc/self/task/*/schedstat): the calling thread (it submits the items, reads "
          f"their results and, instrumented, makes their spans and metrics), the engine's "
          f"I/O thread (libcurl), the SDK's span processor thread; the process's (user + sys, "
          f"every thread); the part of it Python's GC took. The I/O thread's sleeps per call "
          f"are its voluntary context switches: how often it ran out of work. The "
          f"`sdk` rows run after each round.\n")
    print("| mode | calling thread | I/O thread | span processor | process | over off "
          "(process) | Python's GC | I/O thread's sleeps | calls/s | rounds (calling "
          "thread) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    off = med("off", "cpu_us")
    for m in modes + list(_FLOORS):
        rounds = " ".join(f"{x['caller']:.0f}" for x in results[m])
        rate = f"{args.n / med(m, 'secs'):,.0f}" if m in _WHAT else ""
        over = f"{med(m, 'cpu_us') - off:+.1f}" if m in _WHAT else ""
        what = _WHAT.get(m) or _FLOORS[m].replace("as `on` had", f"as `on` had ({alive})")
        print(f"| `{m}`: {what} | {med(m, 'caller'):.1f} | {med(m, 'io'):.1f} | "
              f"{med(m, 'spans'):.1f} | {med(m, 'cpu_us'):.1f} | {over} | {med(m, 'gc_us'):.1f} | "
              f"{med(m, 'io_sleeps'):.2f} | {rate} | {rounds} |")

    def verdict(x: float) -> str:
        return "met" if x <= 15 else "not met"

    caller_own = med("on", "caller") - med("off", "caller") - med("sdk", "caller")
    alive_cost = med("sdk_alive", "caller") - med("sdk", "caller")
    io_more = med("on", "io") - med("off", "io")
    spans_more = med("on", "spans") - med("sdk", "spans")
    process_own = med("on", "cpu_us") - off - med("sdk", "cpu_us")
    record = med("record", "caller") - med("off", "caller") if "record" in results else None
    noop = med("noop", "cpu_us") - off if "noop" in results else None
    print(f"\n- llmretry's own share with the SDK on the calling thread, `on`'s less `off`'s "
          f"less the SDK alone's (`sdk`: exactly the calls `on` made, one span at a time): "
          f"**{caller_own:.0f} µs** per call (≤ 15 µs: **{verdict(caller_own)}**). Of it, "
          f"{alive_cost:.0f} µs is what keeping {alive} spans alive at once costs the SDK "
          f"(`sdk_alive` less `sdk`: its GC walking them)"
          + (f"; llmretry's own Python for a recording span without the SDK (`record`'s "
             f"calling thread less `off`'s) is {record:.0f} µs" if record is not None else "")
          + ".")
    print(f"- The engine's I/O thread: {io_more:+.0f} µs per call under `on` against `off`, "
          f"its sleeps per call {med('off', 'io_sleeps'):.2f} → {med('on', 'io_sleeps'):.2f} "
          f"(with the calling thread the bottleneck the I/O thread idles between the items "
          f"it gets, and wakes for fewer responses at a time)"
          + (f"; an uninstrumented batch whose on_result burns {args.burn_us:.0f} µs of the "
             f"calling thread (`slow`): {med('slow', 'io') - med('off', 'io'):+.0f} µs, "
             f"sleeps {med('slow', 'io_sleeps'):.2f}" if "slow" in results else "")
          + f". The span processor's thread: {spans_more:+.0f} µs against the SDK alone's.")
    print(f"- The whole process, `on` less `off` less the SDK alone: {process_own:.0f} µs "
          f"(≤ 15 µs: **{verdict(process_own)}**): the calling thread's share above, the I/O "
          f"thread's and the span processor's.")
    if noop is not None:
        print(f"- With the API's no-op providers, `noop` less `off` (process): **{noop:.0f} µs** "
              f"(≤ 15 µs: **{verdict(noop)}**). Its spans do not record, so no attributes are "
              f"built: the floor of llmretry's share.")
    over = med("on", "cpu_us") - off
    print(f"- The issue's figure, `on` less `off` (the SDK included, process): {over:.0f} µs "
          f"(≤ 15 µs: **{verdict(over)}**): the SDK alone costs {med('sdk', 'cpu_us'):.0f} µs "
          f"a call making the same span and records, so no instrumentation with the Python "
          f"SDK can meet it"
          + (f". By signal (calling thread, over `noop`): "
             f"{med('traces', 'caller') - med('noop', 'caller'):.0f} µs for a span with its "
             f"attributes and attempt event, "
             f"{med('metrics', 'caller') - med('noop', 'caller'):.0f} µs for the metrics' "
             f"three histogram records" if "traces" in results and "metrics" in results
             else "")
          + ".")
    calls = ", ".join(op[0] for op in script)
    print(f"- What `on` asked of the SDK per item (the `sdk` rows make it): {calls}; the "
          f"records ran in the caller's context (no span current), as in the SDK-alone loop, "
          f"so the default exemplar filter (trace-based) had nothing to sample in either.")


def _line(mode: str, n: int, res: Dict[str, float]) -> str:
    """A batch's (or replay's) RESULT line."""
    return (f"RESULT mode={mode} n={n} secs={res.get('secs', 0):.3f} "
            f"cpu_us={res['cpu_us']:.1f} gc_us={res['gc_us']:.1f} "
            + " ".join(f"{r}_us={res[r]:.1f}" for r in ROLES)
            + " " + " ".join(f"{r}_sleeps={res[r + '_sleeps']:.3f}" for r in ROLES[:3]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--burn-us", type=float, default=150,
                    help="`slow`'s on_result CPU per item (about what `on` adds to the "
                         "calling thread)")
    ap.add_argument("--modes", default=",".join(_WHAT),
                    help="the modes to run, comma- or space-separated (off, on and the "
                         "SDK's floors sdk and sdk_alive always run)")
    args = ap.parse_args()
    bodies = [{"model": "gpt-bench", "max_tokens": 16,
               "messages": [{"role": "user", "content": f"Item {i}"}]} for i in range(args.n)]
    tp = TracerProvider()
    processor = BatchSpanProcessor(_Drop(), max_queue_size=args.n * 2)
    tp.add_span_processor(processor)
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    providers = {"on": (tp, mp), "noop": (NoOpTracerProvider(), NoOpMeterProvider()),
                 "record": (_RecordingProvider(), NoOpMeterProvider()),
                 "traces": (tp, NoOpMeterProvider()), "metrics": (NoOpTracerProvider(), mp)}
    # Commas or spaces (MODES="off record noop" in run_otel.sh); a name that
    # is no mode fails rather than running off and on alone. The SDK's
    # floors (sdk, sdk_alive) run every round whether named or not.
    wanted = set(args.modes.replace(" ", ",").split(",")) - {""} - set(_FLOORS)
    if wanted - set(_WHAT):
        raise SystemExit(f"unknown modes: {', '.join(sorted(wanted - set(_WHAT)))} "
                         f"(modes: {', '.join(_WHAT)}; {', '.join(_FLOORS)} always run)")
    wanted |= {"off", "on"}
    modes = [m for m in _WHAT if m in wanted]
    results: Dict[str, List[Dict[str, float]]] = {m: [] for m in modes + list(_FLOORS)}
    script: Any = None
    alive = 1
    with llmretry.Client(base_url=args.base_url, max_in_flight=max(256, args.limit)) as client:
        run(client, bodies[:2000], args.limit)     # warm-up: connections, caches
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                if mode == "off":
                    res = run(client, bodies, args.limit)
                elif mode == "slow":
                    res = run(client, bodies, args.limit, on_result=_burner(args.burn_us))
                elif mode == "events":
                    res = run(client, bodies, args.limit, logger=lambda ev: None,
                              on_result=lambda i, value: None)
                else:
                    tracer_provider, meter_provider = providers[mode]
                    llmretry.otel.instrument(tracer_provider=tracer_provider,
                                             meter_provider=meter_provider)
                    res = run(client, bodies, args.limit)
                    processor.force_flush()
                    llmretry.otel.uninstrument()
                results[mode].append(res)
                print(_line(mode, args.n, res), file=sys.stderr, flush=True)
            # The SDK alone once a round (one sample is as noisy as the
            # rest), on `on`'s providers: what the batch asked of it for one
            # item (taken down once), made N times.
            llmretry.otel.instrument(tracer_provider=tp, meter_provider=mp)
            tel = llmretry.otel._everywhere
            if script is None:
                tap = _Tap(tel)
                run(client, bodies[:3000], args.limit)
                tap.close()
                processor.force_flush()
                script, alive = tap.script(), tap.most_alive
                print(f"SCRIPT (spans alive at once: {alive})", file=sys.stderr)
                for op in script:
                    print(f"  {op}", file=sys.stderr)
            for floor, at_once in (("sdk", 1), ("sdk_alive", alive)):
                res = replay(tel, script, args.n, at_once)
                processor.force_flush()
                results[floor].append(res)
                print(_line(floor, args.n, res), file=sys.stderr, flush=True)
            llmretry.otel.uninstrument()
    report(args, modes, results, script, alive)
    tp.shutdown()
    mp.shutdown()


if __name__ == "__main__":
    main()
