"""llmretry.otel's cost per call, and that its shortcuts change nothing a
user sees: a span that does not record (sampled out) costs no attributes,
a batch's results keep their Meta unbuilt, and the trace-context header
lines written without the propagator are the propagator's, byte for byte
(another propagator is called as it is).

With OpenTelemetry's real SDK (tools/ensure-deps.sh installs it: a missing
package fails the module) against the mock server.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Iterator, List, Optional

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import (INVALID_SPAN, NonRecordingSpan, SpanContext, TraceFlags,
                                 TraceState)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import llmretry
import llmretry.otel
from conftest import FAST, Scenario, secret_body
from llmretry import _llmretry, _otel_record
from llmretry._otel_context import _Propagation


class _Providers:
    def __init__(self, **tracer_options: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(**tracer_options)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def durations(self) -> int:
        data = self.reader.get_metrics_data()
        return sum(p.count for rm in data.resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics if m.name == "gen_ai.client.operation.duration"
                   for p in m.data.data_points)


@pytest.fixture
def sampled_out() -> Iterator[_Providers]:
    p = _Providers(sampler=ALWAYS_OFF)
    llmretry.otel.instrument(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)
    try:
        yield p
    finally:
        llmretry.otel.uninstrument()


def _traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_a_span_that_does_not_record_costs_no_attributes(
        sampled_out: _Providers, scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry's advice: attributes are worked out only for a span that
    records. A call sampled out still sends its context (its flags without
    the sampled bit) and still counts in the metrics."""
    worked: List[Any] = []
    real = _otel_record._response_attributes

    def spy(*args: Any) -> Any:
        worked.append(args)
        return real(*args)

    monkeypatch.setattr(_otel_record, "_response_attributes", spy)
    scen.script([{"status": 503}], after={})
    llmretry.call_llm(secret_body("out", max_tokens=3), base_url=scen.url, **FAST)
    out = llmretry.call_many([secret_body(f"out-{i}") for i in range(4)], base_url=scen.url,
                             **FAST)
    assert out.summary.ok == 4
    assert worked == []
    assert sampled_out.exporter.get_finished_spans() == ()
    assert sampled_out.durations() == 5
    tps = [r["headers"]["traceparent"] for r in scen.requests()]
    assert len(tps) == 6 and len(set(tps)) == 5         # the retried call's twice
    assert all(tp.startswith("00-") and not int(tp[-2:], 16) & 1 for tp in tps)   # not sampled


def test_a_batchs_results_keep_their_meta_unbuilt(scen: Scenario) -> None:
    """A success's Meta is built when first read (issue 36: a batch's results
    hold one allocation each until then); telemetry reads it without
    keeping it, so the results are as small as without telemetry."""
    p = _Providers()
    llmretry.otel.instrument(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)
    try:
        out = llmretry.call_many([secret_body(f"lazy-{i}") for i in range(6)],
                                 base_url=scen.url, **FAST)
    finally:
        llmretry.otel.uninstrument()
    assert out.summary.ok == 6
    assert all(type(r._meta) is _llmretry.LazyMeta for r in out)
    spans = {s.attributes["llmretry.request_id"]: s for s in p.exporter.get_finished_spans()}
    for r in out:       # what the spans say is the Meta's, read afterwards all the same
        span = spans[r.meta.request_id]
        assert span.attributes["llmretry.attempts"] == r.meta.attempts == 1
        assert span.attributes["gen_ai.usage.input_tokens"] == r.meta.usage["prompt_tokens"]


def _expected(span: Any, parent: Any, headers: Optional[List[str]]) -> Optional[List[str]]:
    """What the global propagator writes for ``span`` (the reference)."""
    carrier: Dict[str, str] = {}
    propagate.inject(carrier, trace.set_span_in_context(span, parent))
    if not carrier:
        return None
    lines = [f"{k}: {v}" for k, v in carrier.items()]
    names = {k.lower() for k in carrier}
    return [h for h in headers or () if h.split(":", 1)[0].strip().lower() not in names] + lines


def test_the_header_lines_are_the_default_propagators() -> None:
    """Spans sampled or not, with a trace state, invalid, under a parent with
    baggage or none, beside the caller's own lines of the same names: the
    lines written without the propagator are those it writes."""
    before = propagate.get_global_textmap()
    # The API's default (what OTEL_PROPAGATORS unset gives), whatever this run's.
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(),
                                                      W3CBaggagePropagator()]))
    try:
        _check_lines()
    finally:
        propagate.set_global_textmap(before)


def _check_lines() -> None:
    rng = random.Random(34)
    contexts = [SpanContext(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, False,
                            TraceFlags(flags), state)
                for flags in (0, 1, 3, 255)
                for state in (None, TraceState([("vendor", "x1")]))]
    contexts += [SpanContext(1, 1, False), SpanContext((1 << 128) - 1, (1 << 64) - 1, True)]
    spans = [NonRecordingSpan(c) for c in contexts] + [INVALID_SPAN]
    spans.append(TracerProvider().get_tracer("t").start_span("real"))
    parents = [context.Context(), baggage.set_baggage("user", "ann b",
                                                      baggage.set_baggage("k", "v"))]
    headers_cases: List[Optional[List[str]]] = [
        None, [], ["X-Mine: kept"],
        ["traceparent: 00-bad", "Baggage: old=1", "tracestate: old=1", "X-Mine: kept"]]
    checked = 0
    for parent in parents:
        for headers in headers_cases:
            prop = _Propagation(parent, headers)
            assert prop.fast
            for span in spans:
                assert prop.lines(span) == _expected(span, parent, headers), (
                    span.get_span_context(), parent, headers)
                checked += 1
    assert checked == 2 * 4 * len(spans)


def test_the_header_lines_of_spans_sharing_a_trace_are_the_propagators() -> None:
    """A batch's items under one parent share its trace id, and the line's
    start is kept for the last trace id seen: spans of one trace, with other
    span ids and flags, then of another trace and back, and a real parent's
    children: each line is the propagator's."""
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(),
                                                      W3CBaggagePropagator()]))
    try:
        rng = random.Random(341)
        one, other = rng.getrandbits(128) | 1, rng.getrandbits(128) | 1
        tracer = TracerProvider().get_tracer("t")
        parent_span = tracer.start_span("parent")
        parent = trace.set_span_in_context(parent_span)
        spans = [NonRecordingSpan(SpanContext(trace_id, rng.getrandbits(64) | 1, False,
                                              TraceFlags(flags)))
                 for trace_id in (one, one, other, one, other, other, 1, one)
                 for flags in (1, 0, 255)]
        spans += [tracer.start_span(f"item-{i}", parent) for i in range(5)]
        spans.insert(7, spans[-1])          # a trace seen before, after others
        for headers in (None, ["X-Mine: kept", "traceparent: 00-bad"]):
            for ctx in (context.Context(), parent):
                prop = _Propagation(ctx, headers, shared=True)
                assert prop.fast
                for span in spans:
                    assert prop.lines(span) == _expected(span, ctx, headers), (
                        span.get_span_context(), headers)
    finally:
        propagate.set_global_textmap(before)


class _Custom(TextMapPropagator):
    """An application's own propagator (a subclass of nothing the API ships)."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        ctx = trace.get_current_span(context).get_span_context()
        carrier["x-my-trace"] = f"{ctx.trace_id:x}/{ctx.span_id:x}"

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context

    @property
    def fields(self) -> set:    # type: ignore[type-arg]
        return {"x-my-trace"}


def test_another_propagator_writes_its_own_headers(scen: Scenario) -> None:
    p = _Providers()
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(_Custom())
    llmretry.otel.instrument(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)
    try:
        assert not _Propagation(context.Context(), None).fast
        llmretry.call_llm(secret_body("custom"), base_url=scen.url, **FAST)
        llmretry.call_many([secret_body(f"custom-{i}") for i in range(3)], base_url=scen.url,
                           **FAST)
    finally:
        llmretry.otel.uninstrument()
        propagate.set_global_textmap(before)
    spans = {s.attributes["llmretry.request_id"]: s for s in p.exporter.get_finished_spans()}
    seen = scen.requests()
    assert len(seen) == 4
    for req in seen:
        ctx = spans[req["headers"]["x-client-request-id"]].context
        assert req["headers"]["x-my-trace"] == f"{ctx.trace_id:x}/{ctx.span_id:x}"
        assert "traceparent" not in req["headers"]


def test_a_batch_sends_its_parents_baggage_and_each_items_traceparent(scen: Scenario) -> None:
    p = _Providers()
    llmretry.otel.instrument(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        llmretry.call_many([secret_body(f"bag-{i}") for i in range(3)], base_url=scen.url,
                           headers={"baggage": "old=1", "X-Mine": "kept"}, **FAST)
    finally:
        context.detach(token)
        llmretry.otel.uninstrument()
    spans = {s.attributes["llmretry.request_id"]: s for s in p.exporter.get_finished_spans()}
    seen = scen.requests()
    assert len(seen) == 3
    for req in seen:
        h = req["headers"]
        assert h["baggage"] == "tenant=acme" and h["x-mine"] == "kept"
        assert h["traceparent"] == _traceparent(spans[h["x-client-request-id"]].context)


def test_the_meta_fields_telemetry_reads_are_the_metas(scen: Scenario) -> None:
    """LazyMeta.pick gives the fields as the Meta built later holds them
    (telemetry reads them without building one); a built Meta gives the
    same through _meta_values."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    scen.script([{"status": 503}, {"usage": usage, "system_fingerprint": "fp_pick"}],
                after={"usage": None})
    out = llmretry.call_many([secret_body(f"pick-{i}") for i in range(3)], limit=1,
                             base_url=scen.url, **FAST)
    assert out.summary.ok == 3
    names = _otel_record._READ
    seen_usage = 0
    for res in out:
        lazy = res._meta
        assert type(lazy) is _llmretry.LazyMeta
        values = _otel_record._meta_values(res)
        assert type(res._meta) is _llmretry.LazyMeta        # still not built
        assert lazy.pick(()) == ()
        at = tuple(llmretry.Meta.__slots__.index(n) for n in ("request_id", "usage"))
        picked = lazy.pick(at)
        meta = res.meta
        assert picked == (meta.request_id, meta.usage)
        expected = tuple(getattr(meta, n) for n in names[:-1]) + (
            meta.usage_total or meta.usage,)
        assert values == expected
        assert _otel_record._meta_values(res) == expected      # from the built Meta
        seen_usage += meta.usage_total is not None
        with pytest.raises(IndexError):
            lazy.pick((len(llmretry.Meta.__slots__),))
        with pytest.raises(IndexError):
            lazy.pick((-1,))
        with pytest.raises(TypeError):
            lazy.pick([0])      # type: ignore[arg-type]
    assert seen_usage == 1      # the retried call's; the others had none


def test_the_attempts_counter_counts_a_running_batchs_items(scen: Scenario) -> None:
    """A batch sums its items' attempts itself while it runs: the counter
    read during the batch (at each item's on_result) counts every item
    ended so far, and after it each attempt once (a second batch adds its
    own)."""
    p = _Providers()
    llmretry.otel.instrument(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)

    def attempts() -> int:
        data = p.reader.get_metrics_data()
        return sum(pt.value for rm in data.resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics if m.name == "llmretry.attempts"
                   for pt in m.data.data_points)

    read: List[int] = []
    done: List[int] = []
    try:
        scen.script([{"status": 503}], after={})
        out = llmretry.call_many(
            [secret_body(f"count-{i}") for i in range(6)], limit=1, base_url=scen.url,
            on_result=lambda i, v: (done.append(v.meta.attempts), read.append(attempts())),
            **FAST)
        assert out.summary.ok == 6
        assert sorted(done) == [1, 1, 1, 1, 1, 2]
        assert read == [sum(done[:i + 1]) for i in range(6)]
        assert attempts() == 7
        llmretry.call_many([secret_body(f"count2-{i}") for i in range(3)], base_url=scen.url,
                           **FAST)
        assert attempts() == 10
    finally:
        llmretry.otel.uninstrument()
