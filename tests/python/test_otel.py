"""llmretry.otel: a span per logical call, GenAI metrics, built on the events.

With OpenTelemetry's real SDK (its in-memory span exporter and metric
reader) against the mock server, and for the CLI's --otel a small OTLP/HTTP
receiver decoding the protobuf messages (opentelemetry-proto).
tools/ensure-deps.sh installs the packages: a missing one fails the module.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import llmretry
import llmretry.otel
from conftest import (FAST, SECRET_KEY, Events, Scenario, check_no_secrets, child_env,
                      secret_body)


class Telemetry:
    """An SDK tracer and meter provider with in-memory exporters."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def spans(self, name_prefix: str = "") -> List[Any]:
        return [s for s in self.exporter.get_finished_spans()
                if s.name.startswith(name_prefix)]

    def llm_spans(self) -> List[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]

    def metrics(self) -> Dict[str, List[Any]]:
        """Metric name -> its data points."""
        out: Dict[str, List[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out

    def total(self, name: str) -> float:
        """A counter's sum, or a histogram's count, over its points."""
        points = self.metrics().get(name, [])
        return sum(getattr(p, "count", None) or getattr(p, "value", 0) for p in points)


@pytest.fixture
def tel() -> Iterator[Telemetry]:
    t = Telemetry()
    llmretry.otel.instrument(tracer_provider=t.tracer_provider,
                             meter_provider=t.meter_provider)
    try:
        yield t
    finally:
        llmretry.otel.uninstrument()
        t.tracer_provider.shutdown()
        t.meter_provider.shutdown()


def attempt_events(span: Any) -> List[Dict[str, Any]]:
    return [dict(e.attributes) for e in span.events if e.name == "llmretry.attempt"]


# ---------------------------------------------------------------------------


def test_importing_llmretry_does_not_import_opentelemetry() -> None:
    code = ("import sys, llmretry, llmretry.httpx\n"
            "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry')"
            " or m == 'llmretry.otel')\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True, timeout=60)


def test_a_call_retried_twice_is_one_span(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 503, "retry_after_ms": 10},
                 {"status": 429, "ratelimit_reset_requests": "20ms"}, {}])
    body = secret_body("retried", max_tokens=50, temperature=0.25)
    with tel.tracer.start_as_current_span("caller") as caller:
        data, meta = llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, **FAST)
    [span] = tel.llm_spans()
    assert span.name == "chat gpt-test"
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert span.status.status_code == StatusCode.UNSET
    a = span.attributes
    port = int(scen.url.split(":")[2].split("/")[0])
    assert {k: a.get(k) for k in (
        "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
        "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.response.id",
        "gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
        "server.address", "server.port", "llmretry.request_id", "llmretry.attempts")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test", "gen_ai.request.max_tokens": 50,
        "gen_ai.request.temperature": 0.25, "gen_ai.response.id": data["id"],
        "gen_ai.response.model": data["model"],
        "gen_ai.usage.input_tokens": meta.usage_total["prompt_tokens"],
        "gen_ai.usage.output_tokens": meta.usage_total["completion_tokens"],
        "server.address": "127.0.0.1", "server.port": port,
        "llmretry.request_id": meta.request_id, "llmretry.attempts": 3}
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert "error.type" not in a
    # One event per attempt: its status, duration, the wait it scheduled and why.
    events = attempt_events(span)
    assert [e["llmretry.attempt"] for e in events] == [0, 1, 2]
    assert [e["http.response.status_code"] for e in events] == [503, 429, 200]
    assert [e.get("llmretry.delay_source") for e in events] == [
        "retry_after", "ratelimit_reset", None]
    assert [e.get("llmretry.delay_ms") for e in events] == [10, 20, None]
    assert all(e["llmretry.duration_ms"] >= 0 for e in events)
    # The span covers every attempt and wait.
    assert span.end_time - span.start_time >= 30_000_000
    times = [e.timestamp for e in span.events]
    assert span.start_time <= times[0] <= times[1] <= times[2] <= span.end_time
    # Metrics: the call's duration and tokens, and the engine's counters.
    m = tel.metrics()
    [duration] = m["gen_ai.client.operation.duration"]
    assert duration.count == 1 and duration.sum >= 0.03
    assert duration.attributes["gen_ai.request.model"] == "gpt-test"
    assert duration.attributes["server.port"] == port
    assert list(duration.explicit_bounds)[:3] == [0.01, 0.02, 0.04]
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in m["gen_ai.client.token.usage"]}
    assert tokens == {"input": meta.usage_total["prompt_tokens"],
                      "output": meta.usage_total["completion_tokens"]}
    assert tel.total("llmretry.attempts") == 3
    assert tel.total("llmretry.retries") == 2
    assert tel.total("llmretry.rate_limited") == 1
    assert "gen_ai.client.operation.time_to_first_chunk" not in m


def test_a_stream_records_its_time_to_first_chunk(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 500}, {"stream": {"chunks": 4, "delay_ms": 5}}])
    with llmretry.stream_llm(secret_body("stream"), base_url=scen.url, api_key=SECRET_KEY,
                             **FAST) as s:
        text = "".join(s.text_deltas())
        data, meta = s.result()
    assert text
    [span] = tel.llm_spans()
    a = span.attributes
    assert a["gen_ai.request.stream"] is True
    assert a["llmretry.attempts"] == 2
    assert a["gen_ai.response.id"] == data["id"]
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(meta.ttft_ms / 1000)
    assert a["llmretry.chunks"] == meta.chunks
    assert a["gen_ai.usage.output_tokens"] == meta.usage["completion_tokens"]
    [ttfc] = tel.metrics()["gen_ai.client.operation.time_to_first_chunk"]
    assert ttfc.count == 1 and ttfc.sum == pytest.approx(meta.ttft_ms / 1000)
    assert ttfc.attributes["gen_ai.operation.name"] == "chat"


def test_a_stream_left_early_ends_its_span(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 50, "delay_ms": 20}}])
    with llmretry.stream_llm(secret_body("early"), base_url=scen.url, **FAST) as s:
        next(iter(s))
    [span] = tel.llm_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "cancelled"
    assert span.attributes["llmretry.stream_reason"] == "cancelled"
    assert span.attributes["llmretry.reason"] == "cancelled"


def test_a_give_up_is_an_error_span(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 503}, {"status": 400, "error_code": "bad_thing"}])
    with pytest.raises(llmretry.HTTPStatusError) as info:
        llmretry.call_llm(secret_body("gave-up"), base_url=scen.url, **FAST)
    [span] = tel.llm_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "http_status"
    assert span.attributes["llmretry.reason"] == "not_retryable"
    assert span.attributes["llmretry.request_id"] == info.value.request_id
    events = attempt_events(span)
    assert [e["http.response.status_code"] for e in events] == [503, 400]
    assert events[1]["llmretry.error_code"] == "bad_thing"
    assert events[1]["llmretry.reason"] == "not_retryable"
    [duration] = tel.metrics()["gen_ai.client.operation.duration"]
    assert duration.attributes["error.type"] == "http_status"


def test_circuit_open_refusals_are_counted(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 500}] * 3)
    with llmretry.Client(breaker_failures=1, breaker_cooldown_ms=60000, max_retries=0) as c:
        for _ in range(3):
            with pytest.raises(llmretry.LLMError):
                c.call_llm(secret_body("breaker"), base_url=scen.url)
    assert [s.attributes["error.type"] for s in tel.llm_spans()] == [
        "http_status", "circuit_open", "circuit_open"]
    assert tel.total("llmretry.circuit_open") == 2
    assert tel.total("llmretry.attempts") == 1


def test_a_batch_of_100_spans_under_the_callers_span(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 503}], after={})
    bodies = [secret_body(f"batch-{i}", max_tokens=i + 1) for i in range(100)]
    seen: List[int] = []
    with tel.tracer.start_as_current_span("caller") as caller:
        out = llmretry.call_many(bodies, limit=16, base_url=scen.url, api_key=SECRET_KEY,
                                 on_result=lambda i, v: seen.append(i), **FAST)
    assert out.summary.ok == 100 and sorted(seen) == list(range(100))
    spans = tel.llm_spans()
    assert len(spans) == 100
    parent = caller.get_span_context().span_id
    assert all(s.parent.span_id == parent for s in spans)
    by_id = {s.attributes["llmretry.request_id"]: s for s in spans}
    for i, res in enumerate(out):
        s = by_id[res.meta.request_id]
        assert s.attributes["gen_ai.request.max_tokens"] == i + 1    # its own body's
        assert s.attributes["gen_ai.response.id"] == res.data["id"]
        assert caller.start_time <= s.start_time <= s.end_time <= caller.end_time
    assert sum(s.attributes["llmretry.attempts"] for s in spans) == 101
    assert tel.total("llmretry.attempts") == 101
    assert tel.total("gen_ai.client.operation.duration") == 100
    # Read lazily (any iterable): a span per item all the same, its model from
    # the events (no body is kept).
    tel.exporter.clear()
    out = llmretry.call_many((secret_body(f"lazy-{i}", model="lazy-model") for i in range(10)),
                             base_url=scen.url, **FAST)
    assert out.summary.ok == 10
    assert [s.name for s in tel.llm_spans()] == ["chat lazy-model"] * 10


def test_pool_workers_calls_keep_the_callers_span(tel: Telemetry, scen: Scenario) -> None:
    threads: List[int] = []

    def worker(i: int, _index: int) -> Any:
        threads.append(threading.get_ident())
        return llmretry.call_llm(secret_body(f"pool-{i}"), base_url=scen.url, **FAST).data

    with tel.tracer.start_as_current_span("caller") as caller:
        llmretry.map_with_concurrency(range(20), 4, worker)
    spans = tel.llm_spans()
    assert len(spans) == 20
    assert {s.parent.span_id for s in spans} == {caller.get_span_context().span_id}
    assert threading.get_ident() not in threads


def test_asyncio_tasks_keep_their_parents(tel: Telemetry, scen: Scenario) -> None:
    scen.script([{"status": 503}], after={"delay_ms": 10})

    async def one(i: int) -> Tuple[int, int]:
        with tel.tracer.start_as_current_span(f"task-{i}") as span:
            if i % 2:
                async with llmretry.astream_llm(secret_body(f"a{i}"), base_url=scen.url,
                                                **FAST) as s:
                    res = await s.result()
            else:
                res = await llmretry.acall_llm(secret_body(f"a{i}"), base_url=scen.url, **FAST)
            return span.get_span_context().span_id, res.meta.request_id

    async def main() -> List[Tuple[int, int]]:
        return await asyncio.gather(*(one(i) for i in range(10)))

    pairs = asyncio.run(main())
    by_id = {s.attributes["llmretry.request_id"]: s for s in tel.llm_spans()}
    assert len(by_id) == 10
    for parent, rid in pairs:
        assert by_id[rid].parent.span_id == parent
    assert sum(1 for s in by_id.values() if s.attributes.get("gen_ai.request.stream")) == 5

    async def batch() -> Any:
        with tel.tracer.start_as_current_span("abatch") as span:
            await llmretry.acall_many([secret_body(f"b{i}") for i in range(5)],
                                      base_url=scen.url, **FAST)
            return span.get_span_context().span_id

    parent = asyncio.run(batch())
    assert sum(1 for s in tel.llm_spans() if s.parent.span_id == parent) == 5


def test_a_call_answered_at_once_costs_no_event(tel: Telemetry, scen: Scenario,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Telemetry asks the engine only for failures, retries and give-ups:
    the attempt that answered is read from the result (the events are most
    of the per-call cost)."""
    seen: List[str] = []
    on_event = llmretry._otel_record._Call.on_event

    def spy(self: Any, ev: Dict[str, Any]) -> None:
        seen.append(ev["event"])
        on_event(self, ev)

    monkeypatch.setattr(llmretry._otel_record._Call, "on_event", spy)
    llmretry.call_llm(secret_body("at-once"), base_url=scen.url, logger=None, **FAST)
    llmretry.call_many([secret_body(f"m{i}") for i in range(5)], base_url=scen.url, **FAST)
    assert seen == []
    spans = tel.llm_spans()
    assert len(spans) == 6
    for span in spans:
        [event] = attempt_events(span)
        assert event["llmretry.attempt"] == 0
        assert event["http.response.status_code"] == 200
        assert event["llmretry.duration_ms"] >= 0
    assert tel.total("llmretry.attempts") == 6
    scen.script([{"status": 503}, {}])
    llmretry.call_llm(secret_body("retried"), base_url=scen.url, logger=None, **FAST)
    assert seen == ["llm_request_failed", "llm_retry_scheduled"]
    assert [e["http.response.status_code"] for e in attempt_events(tel.llm_spans()[-1])] == [
        503, 200]


def test_the_counters_keep_counting_when_instrumented_again(scen: Scenario) -> None:
    t = Telemetry()
    for _ in range(2):
        llmretry.otel.instrument(tracer_provider=t.tracer_provider,
                                 meter_provider=t.meter_provider)
        try:
            llmretry.call_llm(secret_body("again"), base_url=scen.url, **FAST)
        finally:
            llmretry.otel.uninstrument()
    assert t.total("llmretry.attempts") == 2
    assert len(t.llm_spans()) == 2


def _traceparent(span: Any) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _check_traceparents(tel: Telemetry, scen: Scenario, requests: int) -> None:
    """Each request the mock saw carries its call's span as traceparent."""
    by_id = {s.attributes["llmretry.request_id"]: s for s in tel.llm_spans()}
    seen = scen.requests()
    assert len(seen) == requests
    for req in seen:
        span = by_id[req["headers"]["x-client-request-id"]]
        assert req["headers"].get("traceparent") == _traceparent(span)


def test_each_attempt_carries_its_calls_span_as_traceparent(tel: Telemetry,
                                                             scen: Scenario) -> None:
    scen.script([{"status": 503}, {}, {"status": 500}, {"stream": {"chunks": 3}}])
    with tel.tracer.start_as_current_span("caller") as caller:
        llmretry.call_llm(secret_body("tp"), base_url=scen.url, headers={"X-Mine": "kept"},
                          **FAST)
        with llmretry.stream_llm(secret_body("tp-stream"), base_url=scen.url, **FAST) as s:
            s.result()
    spans = tel.llm_spans()
    assert len(spans) == 2
    assert {s.context.trace_id for s in spans} == {caller.get_span_context().trace_id}
    _check_traceparents(tel, scen, 4)
    assert scen.requests()[0]["headers"]["x-mine"] == "kept"
    assert scen.requests()[0]["headers"]["traceparent"] == scen.requests()[1]["headers"][
        "traceparent"]

    async def main() -> None:
        await llmretry.acall_llm(secret_body("a"), base_url=scen.url, **FAST)
        async with llmretry.astream_llm(secret_body("as"), base_url=scen.url, **FAST) as s:
            await s.result()

    scen.script([{"status": 503}, {}], after={"stream": {"chunks": 2}})
    tel.exporter.clear()
    asyncio.run(main())     # the async calls' requests: those of the new spans
    by_id = {s.attributes["llmretry.request_id"]: s for s in tel.llm_spans()}
    async_reqs = [r for r in scen.requests() if r["headers"]["x-client-request-id"] in by_id]
    assert len(async_reqs) == 3
    for req in async_reqs:
        assert req["headers"]["traceparent"] == _traceparent(
            by_id[req["headers"]["x-client-request-id"]])


def test_each_batch_items_attempts_carry_the_items_span_as_traceparent(
        tel: Telemetry, scen: Scenario, tmp_path: Any) -> None:
    """call_many, acall_many, a lazy batch and map_with_concurrency: every
    request names its own item's span, retried attempts too, and the
    batch's own headers are kept (its traceparent replaced)."""
    scen.script([{"status": 503}, {"status": 500}], after={})
    bodies = [secret_body(f"tp-batch-{i}", max_tokens=i + 1) for i in range(12)]
    with tel.tracer.start_as_current_span("caller") as caller:
        out = llmretry.call_many(bodies, limit=4, base_url=scen.url,
                                 headers={"X-Mine": "kept", "traceparent": "00-bad"}, **FAST)
    assert out.summary.ok == 12
    spans = tel.llm_spans()
    assert len(spans) == 12
    assert {s.parent.span_id for s in spans} == {caller.get_span_context().span_id}
    _check_traceparents(tel, scen, 14)      # 12 items, 2 of them retried once
    assert all(r["headers"]["x-mine"] == "kept" for r in scen.requests())
    retried = [s for s in spans if s.attributes["llmretry.attempts"] == 2]
    assert len(retried) == 2
    for span in retried:        # its events and its span's context in one record
        assert [e["http.response.status_code"] for e in attempt_events(span)][1] == 200
    assert len({r["headers"]["traceparent"] for r in scen.requests()}) == 12

    # A resumed batch runs only the items that failed: each still has its own.
    tel.exporter.clear()
    other = scen.sub("resume").script([{}, {"status": 400}], after={})
    path = tmp_path / "failures.jsonl"
    out = llmretry.call_many(bodies[:4], limit=1, base_url=other.url, failures_path=path,
                             **FAST)
    assert out.summary.failed == 1 and isinstance(out[1], llmretry.LLMError)
    tel.exporter.clear()
    out = llmretry.call_many(bodies[:4], limit=1, base_url=other.url, failures_path=path,
                             resume=True, **FAST)
    assert out.summary.ok == 1 and isinstance(out[1], llmretry.Result)
    [span] = tel.llm_spans()
    assert span.attributes["gen_ai.request.max_tokens"] == 2      # item 1's body
    seen = other.requests()[-1]["headers"]
    assert seen["x-client-request-id"] == out[1].meta.request_id
    assert seen["traceparent"] == _traceparent(span)

    tel.exporter.clear()
    other = scen.sub("amany").script([{"status": 503}], after={})

    async def amany() -> Any:
        return await llmretry.acall_many([secret_body(f"tp-a{i}") for i in range(5)],
                                         base_url=other.url, **FAST)

    assert asyncio.run(amany()).summary.ok == 5
    _check_traceparents(tel, other, 6)

    tel.exporter.clear()
    other = scen.sub("lazy").script([{"status": 503}], after={})
    out = llmretry.call_many((secret_body(f"tp-lazy-{i}", model="lazy-model")
                              for i in range(6)), base_url=other.url, **FAST)
    assert out.summary.ok == 6
    assert [s.name for s in tel.llm_spans()] == ["chat lazy-model"] * 6
    _check_traceparents(tel, other, 7)

    tel.exporter.clear()
    other = scen.sub("map").script([{"status": 503}], after={})
    llmretry.map_with_concurrency(
        range(6), 3, lambda i, _index: llmretry.call_llm(secret_body(f"tp-map-{i}"),
                                                         base_url=other.url, **FAST))
    _check_traceparents(tel, other, 7)


def test_a_batch_stopped_early_ends_its_items_spans_as_cancelled(tel: Telemetry,
                                                                  scen: Scenario) -> None:
    scen.script([{}], after={"delay_ms": 5000})

    def stop(index: int, value: Any) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        llmretry.call_many([secret_body(f"stop-{i}") for i in range(4)], limit=1,
                           base_url=scen.url, on_result=stop, **FAST)
    spans = tel.llm_spans()
    assert len(spans) == 4      # every item submitted has its span, ended
    done = [s for s in spans if "error.type" not in s.attributes]
    assert len(done) == 1 and done[0].status.status_code != StatusCode.ERROR
    for span in spans:
        if span is not done[0]:
            assert span.attributes["error.type"] == "cancelled"
            assert span.status.status_code == StatusCode.ERROR


def test_the_callers_logger_gets_what_it_got_before(tel: Telemetry, scen: Scenario,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    scen.script([{"status": 503}, {}])
    events = Events()
    llmretry.call_llm(secret_body("logger"), base_url=scen.url, logger=events, **FAST)
    assert events.names == ["llm_request_started", "llm_request_failed",
                              "llm_retry_scheduled", "llm_request_started",
                              "llm_request_succeeded"]
    # No logger: no events for the caller, a span all the same.
    llmretry.call_llm(secret_body("none"), base_url=scen.url, logger=None, **FAST)
    assert len(tel.llm_spans()) == 2
    # A logger that raises (reported as unraisable) loses neither the result
    # nor the span.
    seen: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    llmretry.call_llm(secret_body("raises"), base_url=scen.url,
                      logger=Events(raise_on="llm_request_started", exc=ValueError("no")),
                      **FAST)
    assert len(tel.llm_spans()) == 3 and len(seen) == 1


def _everything(tel: Telemetry) -> str:
    """Every span's and metric's names and values, as text."""
    parts: List[Any] = []
    for s in tel.exporter.get_finished_spans():
        parts += [s.name, dict(s.attributes), s.status.description]
        parts += [(e.name, dict(e.attributes)) for e in s.events]
    for name, points in tel.metrics().items():
        parts += [name] + [dict(p.attributes) for p in points]
    return json.dumps(parts, default=repr)


def _calls_with_secrets(scen: Scenario, tag: str) -> List[str]:
    """Calls of every kind with a key and secret prompts; the secrets."""
    scen.script([{"status": 500, "body": '{"error": {"message": "SECRET-ANSWER-oops"}}'}],
                after={"content": f"SECRET-ANSWER-{tag}"})
    bodies = [secret_body(f"{tag}-{i}") for i in range(3)]
    llmretry.call_llm(bodies[0], base_url=scen.url, api_key=SECRET_KEY, **FAST)
    with llmretry.stream_llm(bodies[1], base_url=scen.url, api_key=SECRET_KEY, **FAST) as s:
        s.result()
    llmretry.call_many(bodies, base_url=scen.url, api_key=SECRET_KEY, **FAST)
    return [SECRET_KEY] + [m["content"] for b in bodies for m in b["messages"]]


def test_no_prompt_answer_or_key_unless_capture_content(tel: Telemetry,
                                                         scen: Scenario) -> None:
    secrets = _calls_with_secrets(scen, "off")
    text = _everything(tel)
    assert len(tel.llm_spans()) == 5
    check_no_secrets(secrets + ["SECRET-ANSWER"], text)


def test_capture_content_records_messages_never_the_key(scen: Scenario) -> None:
    t = Telemetry()
    llmretry.otel.instrument(tracer_provider=t.tracer_provider,
                             meter_provider=t.meter_provider, capture_content=True)
    try:
        secrets = _calls_with_secrets(scen, "on")
    finally:
        llmretry.otel.uninstrument()
    text = _everything(t)
    check_no_secrets([SECRET_KEY], text)
    for s in secrets[1:]:
        assert s in text
    spans = t.llm_spans()
    inputs = json.loads(spans[0].attributes["gen_ai.input.messages"])
    assert inputs[1] == {"role": "user", "parts": [{"type": "text",
                                                    "content": "SECRET-PROMPT-on-0"}]}
    outputs = json.loads(spans[0].attributes["gen_ai.output.messages"])
    assert outputs[0]["parts"] == [{"type": "text", "content": "SECRET-ANSWER-on"}]
    assert outputs[0]["finish_reason"] == "stop"
    # A failed attempt's response body, only now.
    assert "SECRET-ANSWER-oops" in json.dumps([dict(e.attributes) for e in spans[0].events])


def test_one_client_and_uninstrument(scen: Scenario) -> None:
    t = Telemetry()
    with llmretry.Client(**FAST) as mine, llmretry.Client(**FAST) as other:
        llmretry.otel.instrument(mine, tracer_provider=t.tracer_provider,
                                 meter_provider=t.meter_provider)
        try:
            mine.call_llm(secret_body("mine"), base_url=scen.url)
            other.call_llm(secret_body("other"), base_url=scen.url)
            llmretry.call_llm(secret_body("default"), base_url=scen.url)
            assert len(t.llm_spans()) == 1
        finally:
            llmretry.otel.uninstrument()
        mine.call_llm(secret_body("after"), base_url=scen.url)
    assert len(t.llm_spans()) == 1
    assert "__wrapped__" not in vars(llmretry.Client)["_run"].__dict__


def test_a_fallback_span_names_the_target_that_answered(tel: Telemetry, scen: Scenario) -> None:
    backup = scen.sub("backup")
    scen.script([{"status": 503}] * 4)
    data, meta = llmretry.call_llm(
        secret_body("fallback"), base_url=scen.url, max_retries=0,
        fallbacks=[{"model": "backup-model", "base_url": backup.url}])
    [span] = tel.llm_spans()
    assert meta.target == 1
    assert span.attributes["llmretry.target"] == 1
    assert span.attributes["gen_ai.response.model"] == "backup-model"
    assert [e.get("llmretry.target", 0) for e in attempt_events(span)] == [0, 1]


def test_the_httpx_transport(tel: Telemetry, scen: Scenario) -> None:
    import httpx
    import openai
    import llmretry.httpx as lhttpx

    scen.script([{"status": 429, "retry_after_ms": 10}, {}])
    sdk = openai.OpenAI(base_url=scen.url, api_key=SECRET_KEY, max_retries=0,
                        http_client=httpx.Client(transport=lhttpx.Transport(**FAST)))
    with tel.tracer.start_as_current_span("caller") as caller:
        reply = sdk.chat.completions.create(model="gpt-test", max_tokens=7,
                                            messages=[{"role": "user", "content": "hi"}])
    sdk.close()
    [span] = tel.llm_spans()
    assert span.parent.span_id == caller.get_span_context().span_id
    a = span.attributes
    assert span.name == "chat gpt-test"
    assert a["gen_ai.request.max_tokens"] == 7
    assert a["llmretry.attempts"] == 2
    assert a["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens
    assert a["gen_ai.response.id"] == reply.id
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert len(attempt_events(span)) == 2
    assert tel.total("llmretry.rate_limited") == 1
    _check_traceparents(tel, scen, 2)


def test_the_httpx_transport_streams_and_failures(tel: Telemetry, scen: Scenario) -> None:
    import httpx
    import openai
    import llmretry.httpx as lhttpx

    scen.script([{"status": 500}, {"stream": {"chunks": 3}}, {"status": 400}])
    sdk = openai.OpenAI(base_url=scen.url, api_key=SECRET_KEY, max_retries=0,
                        http_client=httpx.Client(transport=lhttpx.Transport(**FAST)))
    chunks = list(sdk.chat.completions.create(
        model="gpt-test", stream=True, messages=[{"role": "user", "content": "hi"}]))
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="gpt-test", messages=[{"role": "user",
                                                                 "content": "no"}])
    sdk.close()
    streamed, failed = tel.llm_spans()
    a = streamed.attributes
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.id"] == chunks[0].id
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert a["llmretry.attempts"] == 2
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["error.type"] == "http_status"
    assert [e["http.response.status_code"] for e in attempt_events(failed)] == [400]
    _check_traceparents(tel, scen, 3)


# ---------------------------------------------------------------------------
# The CLI's --otel: OTLP/HTTP to a local receiver


class _Receiver(http.server.ThreadingHTTPServer):
    """A collector's OTLP/HTTP endpoint: /v1/traces and /v1/metrics, protobuf."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.lock = threading.Lock()
        self.spans: List[Any] = []
        self.metrics: List[Any] = []
        self.raw = b""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ReceiverHandler(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:   # noqa: N802 (http.server's name)
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            data = gzip.decompress(data)
        elif encoding == "deflate":
            data = zlib.decompress(data)
        srv = self.server
        with srv.lock:
            srv.raw += data
            if self.path == "/v1/traces":
                req = ExportTraceServiceRequest()
                req.ParseFromString(data)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        srv.spans.extend(ss.spans)
            elif self.path == "/v1/metrics":
                req = ExportMetricsServiceRequest()
                req.ParseFromString(data)
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        srv.metrics.extend(sm.metrics)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    srv = _Receiver()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _attrs(span: Any) -> Dict[str, Any]:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_cli_otel_exports_over_otlp_http(receiver: _Receiver, scen: Scenario,
                                         tmp_path: Any) -> None:
    scen.script([{"status": 503, "retry_after_ms": 10}], after={})
    env = child_env()
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OPENAI_API_KEY=SECRET_KEY,
               OTEL_SERVICE_NAME="cli-test")
    call = subprocess.run(
        [sys.executable, "-m", "llmretry", "call", "SECRET-PROMPT-cli", "--model", "gpt-cli",
         "--base-url", scen.url, "--base-delay-ms", "10", "--otel"],
        env=env, capture_output=True, text=True, timeout=60)
    assert call.returncode == 0, call.stderr
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps(secret_body(f"cli-{i}", model="gpt-batch")) + "\n"
                             for i in range(3)))
    batch = subprocess.run(
        [sys.executable, "-m", "llmretry", "batch", str(lines), "-o", str(tmp_path / "out"),
         "--base-url", scen.url, "--otel", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=60)
    assert batch.returncode == 0, batch.stderr
    # Both commands flushed before exiting: everything is in.
    names = sorted(s.name for s in receiver.spans)
    assert names == ["chat gpt-batch"] * 3 + ["chat gpt-cli"]
    [one] = [s for s in receiver.spans if s.name == "chat gpt-cli"]
    a = _attrs(one)
    assert a["llmretry.attempts"] == 2 and a["gen_ai.request.model"] == "gpt-cli"
    assert [e.name for e in one.events] == ["llmretry.attempt"] * 2
    assert one.kind == 3    # SPAN_KIND_CLIENT
    names = {m.name for m in receiver.metrics}
    assert {"gen_ai.client.operation.duration", "gen_ai.client.token.usage",
            "llmretry.attempts", "llmretry.retries"} <= names
    check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], receiver.raw.decode("latin-1"))


def _cli_otel_call(scen: Scenario, endpoint: str, timeout_s: int) -> Tuple[Any, float]:
    """`llmretry call ... --otel` exporting to `endpoint`: the process, its
    seconds."""
    env = child_env()
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TIMEOUT=str(timeout_s),
               OPENAI_API_KEY=SECRET_KEY)
    start = time.monotonic()
    call = subprocess.run(
        [sys.executable, "-m", "llmretry", "call", "SECRET-PROMPT-cli", "--model", "gpt-cli",
         "--base-url", scen.url, "--otel"],
        env=env, capture_output=True, text=True, timeout=120)
    return call, time.monotonic() - start


def test_cli_otel_with_the_collector_down(scen: Scenario) -> None:
    # Nothing listens there: the answer is printed and the status is 0; the
    # export's failure is one line of ours, not the exporters' retries.
    scen.script([], after={})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    call, _ = _cli_otel_call(scen, endpoint, 2)
    assert call.returncode == 0, call.stderr
    assert call.stdout.strip(), call.stdout
    assert call.stderr.splitlines() == [
        f"llmretry: --otel: spans and metrics not exported to {endpoint} "
        "([Errno 111] Connection refused); the command's results are not affected"], call.stderr
    check_no_secrets([SECRET_KEY, "SECRET-PROMPT"], call.stderr)


def test_cli_otel_names_the_endpoint_of_the_signal_that_failed(receiver: _Receiver,
                                                                scen: Scenario) -> None:
    # Spans sent to a place of their own (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    # where nothing listens, metrics to the common endpoint's collector: the
    # line names the spans' endpoint, and the metrics arrived.
    scen.script([], after={})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        traces = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
    env = child_env()
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="2",
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=traces, OPENAI_API_KEY=SECRET_KEY)
    call = subprocess.run(
        [sys.executable, "-m", "llmretry", "call", "SECRET-PROMPT-cli", "--model", "gpt-cli",
         "--base-url", scen.url, "--otel"],
        env=env, capture_output=True, text=True, timeout=120)
    assert call.returncode == 0, call.stderr
    assert call.stderr.splitlines() == [
        f"llmretry: --otel: spans not exported to {traces} "
        "([Errno 111] Connection refused); the command's results are not affected"], call.stderr
    assert receiver.spans == [] and "llmretry.attempts" in {m.name for m in receiver.metrics}


def test_cli_otel_with_a_collector_that_never_answers(scen: Scenario) -> None:
    # A collector that takes the connection and says nothing: each signal
    # waits OTEL_EXPORTER_OTLP_TIMEOUT for it, side by side, so the command
    # ends after about that once (one after the other, it took twice that
    # at least: 2 x 6 s here).
    scen.script([], after={})
    timeout_s = 6
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
        call, took = _cli_otel_call(scen, endpoint, timeout_s)
    assert call.returncode == 0, call.stderr
    assert call.stderr.splitlines() == [
        f"llmretry: --otel: spans and metrics not exported to {endpoint} "
        f"(no answer within {timeout_s} s, OTEL_EXPORTER_OTLP_TIMEOUT); "
        "the command's results are not affected"], call.stderr
    assert took < 2 * timeout_s - 1, f"the command took {took:.1f} s"


def test_cli_otel_leaves_the_exporters_logging_as_it_found_it(scen: Scenario) -> None:
    # main() in a process that goes on (a notebook, a test): after the
    # command, the exporters' messages reach the process's logging again.
    import logging

    from llmretry.cli import main
    scen.script([], after={})
    logger = logging.getLogger("opentelemetry.exporter.otlp.proto.http")
    before = (list(logger.handlers), logger.propagate)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        mp.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        assert main(["call", "hi", "--model", "m", "--base-url", scen.url, "--otel"]) == 0
    assert (list(logger.handlers), logger.propagate) == before


def test_cli_otel_a_ctrl_c_ends_the_wait_for_the_collector(scen: Scenario) -> None:
    # The answer is printed, the flush waits for a collector that never
    # answers (60 s allowed), and a Ctrl-C ends that wait: status 130, one
    # line of ours, no traceback.
    scen.script([], after={})
    env = child_env()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{s.getsockname()[1]}",
                   OTEL_EXPORTER_OTLP_TIMEOUT="60", OPENAI_API_KEY=SECRET_KEY)
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmretry", "call", "hi", "--model", "gpt-cli",
             "--base-url", scen.url, "--otel"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            answer = proc.stdout.readline()         # the call is done: the flush waits
            s.settimeout(30)
            s.accept()[0].close()                   # ... on this collector
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert answer.strip(), err
    assert proc.returncode == 130, err
    assert err.splitlines() == ["llmretry: --otel: interrupted: what was left was not exported"]


def test_cli_otel_without_the_sdk_says_what_to_install(scen: Scenario) -> None:
    # The SDK missing: its import fails (None in sys.modules).
    code = ("import sys\n"
            "sys.modules['opentelemetry.sdk'] = None\n"
            "from llmretry.cli import main\n"
            f"sys.exit(main(['call', 'hi', '--model', 'm', '--base-url', {scen.url!r},"
            " '--otel']))\n")
    env = child_env()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "pip install 'llmretry[otlp]'" in out.stderr
    assert scen.requests() == []


def test_the_docs_print_the_mapping() -> None:
    """docs/observability.md's table is llmretry.otel.EVENT_FIELDS."""
    from conftest import ROOT
    text = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    section = text.split("## The mapping", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0] != "`event field`":
            first = [c.split("`")[1] if "`" in c else None for c in cells]
            rows[first[0]] = (first[1], first[2])
    expected = {field: (span if field != "usage" else "gen_ai.usage.input_tokens", attempt)
                for field, (span, attempt, _scale) in llmretry.otel.EVENT_FIELDS.items()}
    assert rows == expected


def test_telemetry_that_fails_never_fails_a_call(scen: Scenario) -> None:
    class Broken:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a broken exporter set-up")

    class BrokenProvider:
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            return Broken()

    llmretry.otel.instrument(tracer_provider=BrokenProvider())
    try:
        data, _meta = llmretry.call_llm(secret_body("broken"), base_url=scen.url, **FAST)
        out = llmretry.call_many([secret_body("b1"), secret_body("b2")], base_url=scen.url,
                                 **FAST)
    finally:
        llmretry.otel.uninstrument()
    assert data["choices"] and out.summary.ok == 2
