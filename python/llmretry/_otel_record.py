"""llmretry.otel's record of one call: its events and outcome made a span
and metrics (_Call), with the instruments of one instrument() call
(_Telemetry) and the counters llmretry sums itself (_Counts).
"""

from __future__ import annotations

import json
import threading
import weakref
from time import time_ns
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from opentelemetry import metrics as otel_metrics
from opentelemetry import propagate as otel_propagate
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import __version__
from ._results import Result, _meta_of
from ._otel_mapping import (_ATTEMPT_EVENT, _CONTENT_FIELDS, _ENDS, _SECONDS_BUCKETS,
                            _TOKEN_BUCKETS, EVENT_FIELDS, _Endpoint, _input_messages,
                            _metric_attributes, _parsed, _request_attributes,
                            _response_attributes, _span_name, _Targets)
from .errors import LLMError, error_from_outcome

_SCOPE = "llmretry"
_CLIENT = SpanKind.CLIENT
# The version of the conventions the names follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"


# ---------------------------------------------------------------------------
# The instruments

class _Telemetry:
    """A tracer, a meter and the instruments of one instrument() call."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, capture_content: bool) -> None:
        self.capture = bool(capture_content)
        self.tracer = otel_trace.get_tracer(_SCOPE, __version__, tracer_provider,
                                            schema_url=SCHEMA_URL)
        meter = otel_metrics.get_meter(_SCOPE, __version__, meter_provider,
                                       schema_url=SCHEMA_URL)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration (every attempt and wait of a call)",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk", unit="s",
            description="Time from the call's start to the first chunk of a stream",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS)
        self.counts = _counts_of(meter)
        # (endpoint, model, response model) -> the metrics' attribute sets.
        self.metric_sets: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}


class _Counts:
    """The four counters (attempts, retries, 429s, circuit-open refusals),
    summed here by attribute set and read by the SDK when it collects
    (observable counters): a call adds to a list under a lock instead of
    making an SDK measurement (whose cost, ~15 µs, is per measurement)."""

    _INSTRUMENTS = (
        ("llmretry.attempts", "{attempt}", "Attempts started"),
        ("llmretry.retries", "{retry}", "Retries scheduled"),
        ("llmretry.rate_limited", "{response}", "Attempts the server refused with 429"),
        ("llmretry.circuit_open", "{call}",
         "Calls refused because their endpoint's circuit breaker was open"),
    )

    def __init__(self, meter: Any) -> None:
        self.lock = threading.Lock()
        self.totals: Dict[Any, List[Any]] = {}   # key -> [attributes, 4 totals]
        for i, (name, unit, description) in enumerate(self._INSTRUMENTS):
            meter.create_observable_counter(name, callbacks=[self._observer(i)], unit=unit,
                                            description=description)

    def _observer(self, i: int) -> Callable[[Any], List[Observation]]:
        def observe(_options: Any) -> List[Observation]:
            with self.lock:
                return [Observation(row[i + 1], row[0]) for row in self.totals.values()
                        if row[i + 1]]
        return observe

    def add(self, key: Any, attrs: Dict[str, Any], counts: Sequence[int]) -> None:
        with self.lock:
            row = self.totals.get(key)
            if row is None:
                row = self.totals[key] = [attrs, 0, 0, 0, 0]
            row[1] += counts[0]
            row[2] += counts[1]
            row[3] += counts[2]
            row[4] += counts[3]


# One _Counts per meter: the SDK keeps an observable instrument's first
# registration (instrument() again on the same provider would register
# callbacks nobody calls), so a meter's counters are made once.
_meter_counts: "weakref.WeakKeyDictionary[Any, _Counts]" = weakref.WeakKeyDictionary()


def _counts_of(meter: Any) -> _Counts:
    try:
        counts = _meter_counts.get(meter)
    except TypeError:           # a meter that cannot be weakly referenced
        return _Counts(meter)
    if counts is None:
        counts = _meter_counts[meter] = _Counts(meter)
    return counts


def _metric_sets(tel: _Telemetry, endpoint: _Endpoint, model: Any,
                 response_model: Any) -> Tuple[Any, ...]:
    """The metrics' attribute sets of a call (made once per endpoint and
    model, not per call): the counters' key and attributes, the histograms',
    the token histogram's for input and output."""
    sets = tel.metric_sets.get((endpoint, model, response_model))
    if sets is None:
        base = _metric_attributes(endpoint, model)
        hist = dict(base)
        if response_model:
            hist["gen_ai.response.model"] = response_model
        # The counters' key: endpoints alike count alike.
        key = (endpoint.operation, endpoint.provider, endpoint.address, endpoint.port, model)
        sets = (key, base, hist, dict(hist, **{"gen_ai.token.type": "input"}),
                dict(hist, **{"gen_ai.token.type": "output"}))
        if len(tel.metric_sets) >= 1024:    # a bound: a program has few endpoints and models
            tel.metric_sets.clear()
        tel.metric_sets[endpoint, model, response_model] = sets
    return sets


# ---------------------------------------------------------------------------
# One logical call

class _Call:
    """One logical call seen through its events and its outcome, made a span
    when it ends.

    Telemetry asks the engine only for the events of failures, retries and
    give-ups (otel._NEEDED): the attempt that succeeded is read from the result,
    so a call answered at once costs no event. Events arrive on the thread
    (or event loop) that waits for the call, so a call is never touched by
    two threads at once.

    A call starts its span at once (start()): call_llm, stream_llm, their
    asyncio forms, a transport's request, and a batch's item when the batch
    submits it (Engine.call_many's item_headers), so that its context goes
    to the server in the request's headers (``traceparent``); the
    attributes and attempt events are added when it ends. A record that
    never started (a batch item submitted elsewhere) makes its span when it
    ends, with the times observed (the SDK takes explicit start and end times).
    """

    __slots__ = ("tel", "targets", "parent", "start_ns", "request", "inputs", "attempts",
                 "last", "ended", "end_on_final", "counts", "span", "span_name")

    def __init__(self, tel: _Telemetry, targets: _Targets, parent: Any,
                 start_ns: Optional[int], body: Any = None, end_on_final: bool = False,
                 policy: Any = None) -> None:
        self.tel = tel
        self.targets = targets
        self.parent = parent
        self.start_ns = start_ns
        self.request: Dict[str, Any] = {}
        self.inputs: Optional[str] = None
        self.attempts: Dict[Any, List[Any]] = {}   # attempt -> [end time, attributes]
        # Span attributes from the events so far.
        self.last: Dict[str, Any] = {"llmretry.policy": policy} if policy else {}
        self.ended = False
        self.end_on_final = end_on_final
        # Attempts started, retries, 429s, circuit-open refusals: added to
        # the counters once, at the end (made by the first event: a call
        # answered at once only has its attempt).
        self.counts: Optional[List[int]] = None
        self.span: Any = None
        self.span_name: Optional[str] = None
        if body is not None:
            self.set_body(body)

    def start(self, headers: Optional[List[str]]) -> Optional[List[str]]:
        """Start the span (the call starts now) and return the call's header
        lines with its context added, as the application's propagators write
        it (by default W3C ``traceparent``): every attempt carries it.
        The span starts with what is known now (the request's settings and,
        for a call with one target, the endpoint's): the samplers see them,
        and its end sets only what the call adds."""
        try:
            targets = self.targets
            endpoint = targets.first
            request = attrs = self.request
            if targets.single:
                attrs = {**endpoint.attrs, **request} if request else endpoint.attrs
            self.span_name = _span_name(endpoint, request.get("gen_ai.request.model"))
            self.span = span = self.tel.tracer.start_span(
                self.span_name, self.parent, _CLIENT, attrs, start_time=self.start_ns)
            carrier: Dict[str, str] = {}
            otel_propagate.get_global_textmap().inject(
                carrier, otel_trace.set_span_in_context(span, self.parent))
        except Exception:       # telemetry must never break a call
            return headers
        if not carrier:
            return headers
        lines = [f"{name}: {value}" for name, value in carrier.items()]
        if not headers:
            return lines
        names = {name.lower() for name in carrier}
        return [line for line in headers if line.split(":", 1)[0].lower() not in names] + lines

    def set_body(self, body: Any) -> None:
        if type(body) is not dict:
            body = _parsed(body)
        self.request = _request_attributes(body)
        if self.tel.capture:
            messages = _input_messages(body)
            if messages is not None:
                self.inputs = json.dumps(messages, ensure_ascii=False)

    def take_events(self, other: "_Call") -> None:
        """What ``other`` (a record of this call's events alone: a batch
        item's, kept by request id until the item ends) saw."""
        self.attempts = other.attempts
        self.counts = other.counts
        for key, value in other.last.items():
            self.last.setdefault(key, value)

    # -- events --------------------------------------------------------------

    def on_event(self, ev: Dict[str, Any]) -> None:
        if self.ended:
            return
        now = time_ns()
        name = ev.get("event")
        if self.start_ns is None:
            self.start_ns = now
        tel = self.tel
        counts = self.counts
        if counts is None:
            counts = self.counts = [0, 0, 0, 0]
        if name == "llm_retry_scheduled":
            counts[1] += 1
        elif name == "llm_request_failed" and ev.get("status") == 429:
            counts[2] += 1
        elif name == "llm_request_gave_up" and ev.get("error_kind") == "circuit_open":
            counts[3] += 1
        span_side = name in _ENDS
        attempt = None
        if name != "llm_request_gave_up" or ev.get("attempts"):
            # Attempts are numbered across targets; a retry's "target" is
            # the next attempt's (a fallback), not this one's.
            key = ev.get("attempt")
            attempt = self.attempts.get(key)
            if attempt is None:
                attempt = self.attempts[key] = [now, {}]
            elif name != "llm_retry_scheduled":
                attempt[0] = now
        capture = tel.capture
        for field, value in ev.items():
            spec = EVENT_FIELDS.get(field)
            if spec is None or value is None:
                continue
            span_attr, attempt_attr, scale = spec
            if field in _CONTENT_FIELDS and not capture:
                continue
            if field == "usage":
                if span_side and isinstance(value, dict):
                    for key, attr in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                                      ("completion_tokens", "gen_ai.usage.output_tokens")):
                        if value.get(key) is not None:
                            self.last[attr] = value[key]
                continue
            if scale is not None:
                value = value * scale
            if attempt_attr is not None and attempt is not None and not (
                    field == "target" and name == "llm_retry_scheduled"):
                attempt[1][attempt_attr] = value
            if span_attr is None:
                continue
            if span_side:
                self.last[span_attr] = value
            elif field in ("request_id", "model", "policy"):
                # The call's own (its first event's): a fallback's model is
                # the response's, not the request's.
                self.last.setdefault(span_attr, value)
        if name == "llm_request_gave_up" and self.end_on_final:
            self.end()      # a transport's stream closed early: no outcome comes

    # -- the end -------------------------------------------------------------

    def end(self, result: Any = None, error: Optional[BaseException] = None,
            end_ns: Optional[int] = None) -> None:
        """Make the span and record the metrics, once (telemetry that fails
        never fails the call)."""
        if self.ended:
            return
        self.ended = True
        try:
            self._emit(result, error, end_ns)
        except Exception:
            pass

    def finished(self, result: Any) -> Any:
        """End with a call's result, and return it."""
        self.end(result=result)
        return result

    def end_with_outcome(self, out: Any) -> None:
        """End with an engine outcome (a transport's call: the SDK reads the
        response itself)."""
        if self.ended:
            return
        try:
            if isinstance(out, Result):
                result, error = out, None
            elif out.get("ok"):
                body = out.get("body")
                data = json.loads(body) if body else None
                result, error = Result(data, _meta_of(out)), None
            else:
                result, error = None, error_from_outcome(out)
        except Exception:       # an answer Python cannot parse: what the events said
            result = error = None
        self.end(result=result, error=error)

    def _answered(self, meta: Any, end_ns: int) -> None:
        """The attempt that answered, from the result's meta."""
        fields = {"llmretry.attempt": meta.attempt}
        if meta.status is not None:
            fields["http.response.status_code"] = meta.status
        if meta.duration_ms is not None:
            fields["llmretry.duration_ms"] = meta.duration_ms
        if meta.target:
            fields["llmretry.target"] = meta.target
        attempt = self.attempts.get(meta.attempt)
        if attempt is None:
            self.attempts[meta.attempt] = [end_ns, fields]
        else:               # a caller's logger asked for its events too
            attempt[0] = end_ns
            attempt[1].update(fields)

    def _emit(self, result: Any, error: Optional[BaseException],
              end_ns: Optional[int]) -> None:
        tel = self.tel
        end_ns = end_ns or time_ns()
        # The span's attributes from the events and the outcome (ended: no
        # event adds to them any more); the request's come separately, as
        # a started span has them already. Values the metrics need are kept
        # in locals (this runs once per call: a batch's items too).
        attrs = self.last
        request = self.request
        usage = total_ms = ttfc = None
        attempts: Any
        if isinstance(result, Result):
            meta = result.meta
            usage = meta.usage_total or meta.usage
            total_ms = meta.total_ms
            attrs["llmretry.request_id"] = meta.request_id
            attrs["llmretry.attempts"] = attempts = meta.attempts
            target = meta.target
            if target:
                attrs["llmretry.target"] = target
            if meta.model and "gen_ai.request.model" not in attrs:
                attrs["gen_ai.request.model"] = meta.model
            if meta.resends:
                attrs["llmretry.resends"] = meta.resends
            response_model = meta.response_model
            if response_model:
                attrs["gen_ai.response.model"] = response_model
            if meta.system_fingerprint:
                attrs["openai.response.system_fingerprint"] = meta.system_fingerprint
            if meta.stream:
                attrs["gen_ai.request.stream"] = True
                if meta.ttft_ms is not None:
                    attrs["gen_ai.response.time_to_first_chunk"] = ttfc = meta.ttft_ms * 0.001
                if meta.chunks is not None:
                    attrs["llmretry.chunks"] = meta.chunks
            attrs.update(_response_attributes(result.data, tel.capture))
            self._answered(meta, end_ns)
            failed = None
        else:
            if isinstance(error, LLMError):
                usage = error.usage_total
                total_ms = error.total_ms
                attrs["error.type"] = error.kind
                attrs["llmretry.request_id"] = error.request_id
                attrs["llmretry.attempts"] = error.attempts
                if error.model and "gen_ai.request.model" not in attrs:
                    attrs["gen_ai.request.model"] = error.model
                if error.reason:
                    attrs["llmretry.reason"] = error.reason
                if error.resends:
                    attrs["llmretry.resends"] = error.resends
                target = error.target
            else:
                target = attrs.get("llmretry.target", 0)
                if error is not None and "error.type" not in attrs:
                    attrs["error.type"] = type(error).__qualname__
            if not target:
                attrs.pop("llmretry.target", None)
            attempts = attrs.get("llmretry.attempts")
            if attempts is None:
                attrs["llmretry.attempts"] = attempts = len(self.attempts)
            failed = attrs.get("error.type")
            response_model = attrs.get("gen_ai.response.model")
            ttfc = attrs.get("gen_ai.response.time_to_first_chunk")
        in_tokens = out_tokens = None
        if usage:
            in_tokens = usage.get("prompt_tokens")
            if in_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = in_tokens
            out_tokens = usage.get("completion_tokens")
            if out_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = out_tokens
        else:                           # the events' usage, if any
            in_tokens = attrs.get("gen_ai.usage.input_tokens")
            out_tokens = attrs.get("gen_ai.usage.output_tokens")
        # The request's model names the call (a fallback's is the response's).
        model = request.get("gen_ai.request.model")
        if model is None:
            model = attrs.get("gen_ai.request.model")
        elif "gen_ai.request.model" in attrs:
            del attrs["gen_ai.request.model"]
        targets = self.targets
        endpoint = targets[target] if target else targets.first
        if self.inputs is not None:
            attrs["gen_ai.input.messages"] = self.inputs
        start_ns = self.start_ns
        if start_ns is None and total_ms is not None:
            start_ns = end_ns - int(total_ms * 1_000_000)
        if start_ns is None or start_ns > end_ns:
            start_ns = end_ns
        span = self.span
        if (span is not None and self.span_name is not None and endpoint is targets.first
                and model == request.get("gen_ai.request.model")):
            name = self.span_name       # what it started with
        else:
            name = _span_name(endpoint, model)
        if span is None:
            attrs.update(request)
            attrs.update(endpoint.attrs)
            span = tel.tracer.start_span(name, self.parent, _CLIENT, attrs, start_time=start_ns)
        else:
            if not targets.single:      # the endpoint that answered (start had none)
                attrs.update(endpoint.attrs)
            if name != self.span_name:
                span.update_name(name)
            span.set_attributes(attrs)
        for at, fields in self.attempts.values():
            span.add_event(_ATTEMPT_EVENT, fields, timestamp=at)
        if failed:
            span.set_status(Status(StatusCode.ERROR, failed))
        span.end(end_time=end_ns)
        # Metrics: the conventions' attributes (low cardinality: no ids).
        sets = _metric_sets(tel, endpoint, model, response_model)
        counts = self.counts
        started = attempts if type(attempts) is int else 0
        if counts is None:
            if started:
                tel.counts.add(sets[0], sets[1], (started, 0, 0, 0))
        else:
            counts[0] = started
            if counts[0] or counts[1] or counts[2] or counts[3]:
                tel.counts.add(sets[0], sets[1], counts)
        hist = sets[2]
        tel.duration.record((end_ns - start_ns) / 1e9,
                            dict(hist, **{"error.type": failed}) if failed else hist)
        if ttfc is not None:
            tel.ttfc.record(ttfc, hist)
        if type(in_tokens) is int:
            tel.tokens.record(in_tokens, sets[3])
        if type(out_tokens) is int:
            tel.tokens.record(out_tokens, sets[4])
