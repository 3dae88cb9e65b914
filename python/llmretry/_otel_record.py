"""llmretry.otel's record of one call: its events and outcome made a span
and metrics (_Call), and the logger that feeds it (_Tee).
"""

from __future__ import annotations

import json
from operator import attrgetter
from time import time_ns
from typing import Any, Callable, Dict, List, Optional, Tuple

from opentelemetry.trace import SpanKind, Status, StatusCode

from . import _llmretry
from ._logging import event_mask_of
from ._otel_context import _Propagation
from ._otel_instruments import _metric_sets, _start_of, _Telemetry
from ._otel_mapping import (_ATTEMPT_EVENT, _body_attributes, _CONTENT_FIELDS, _ENDS,
                            EVENT_FIELDS, _parsed, _response_attributes,
                            _span_name, _Targets)
from ._results import _LazyMeta, Meta, Result, _meta_of
from .errors import LLMError, error_from_outcome

_CLIENT = SpanKind.CLIENT


# ---------------------------------------------------------------------------
# A call's logger

def _bits(*names: str) -> int:
    return sum(1 << _llmretry.EVENT_NAMES.index(name) for name in names)


# The events telemetry asks the engine for (failures, retries, give-ups);
# a caller's logger adds those it keeps.
_NEEDED = _bits("llm_request_failed", "llm_request_error", "llm_retry_scheduled",
                "llm_request_gave_up")
_ALL = (1 << len(_llmretry.EVENT_NAMES)) - 1


class _Tee:
    """The logger a call (or a batch) gets: the telemetry's sink, then the
    caller's own logger (which keeps its own levels, and fails as it did:
    the engine reports it and goes on). The telemetry's errors go nowhere.
    Its ``event_mask`` asks for the events either of them wants."""

    __slots__ = ("sink", "user", "user_mask")

    def __init__(self, sink: Callable[[Dict[str, Any]], None], user: Any) -> None:
        self.sink = sink
        self.user = user
        self.user_mask = event_mask_of(user) if user is not None else None

    def __call__(self, ev: Dict[str, Any]) -> None:
        try:
            self.sink(ev)
        except Exception:   # telemetry must never break a call
            pass
        if self.user is not None:
            self.user(ev)

    def event_mask(self) -> int:
        if self.user is None:
            return _NEEDED
        if self.user_mask is None:      # a plain callable gets every event
            return _ALL
        return _NEEDED | self.user_mask()


def _model_of(body: Any) -> Tuple[Any, Optional[str]]:
    """A request body as a dict when it can be read as one (a text body is
    the caller's JSON), and the model it names."""
    if type(body) is not dict:
        body = _parsed(body)
    model = body.get("model") if isinstance(body, dict) else None
    return body, model if isinstance(model, str) else None


# The Meta fields telemetry reads, in this order (_meta_values'; the last
# is usage_total, or usage when that is empty).
_READ = ("attempt", "attempts", "duration_ms", "total_ms", "status", "request_id", "model",
         "response_model", "system_fingerprint", "resends", "stream", "ttft_ms", "chunks",
         "target", "usage_total")
_READ_AT = tuple(Meta.__slots__.index(name) for name in _READ)
_USAGE_AT = (Meta.__slots__.index("usage"),)
_read_meta = attrgetter(*_READ)
# Where _meta_values puts what is read by place.
_TOTAL_MS, _REQUEST_ID, _MODEL, _RESPONSE_MODEL, _STREAM, _TTFT_MS, _TARGET, _USAGE = (
    3, 5, 6, 7, 10, 11, 13, 14)


def _meta_values(result: Result) -> Tuple[Any, ...]:
    """A result's Meta fields that telemetry reads (``_READ``'s), read
    without building or keeping a Meta: a Meta the extension has not built
    yet (a LazyMeta: one allocation the cyclic GC neither counts nor
    visits) gives them at once (LazyMeta.pick), so that a batch's results
    stay as small as without telemetry (20,000 Metas kept would add 60,000
    objects the GC counts) and no Meta is built to be dropped. A caller
    that reads ``result.meta`` builds its own, as it would have."""
    m = result._meta
    if type(m) is _LazyMeta:
        values = m.pick(_READ_AT)
        if not values[_USAGE]:
            values = values[:_USAGE] + m.pick(_USAGE_AT)
        return values
    values = _read_meta(m)
    if not values[_USAGE]:
        values = values[:_USAGE] + (m.usage,)
    return values


def _success_attributes(attrs: Dict[str, Any], values: Tuple[Any, ...], data: Any,
                        capture: bool, in_tokens: Any, out_tokens: Any) -> Dict[str, Any]:
    """Add to ``attrs`` the span attributes of a success (its Meta's
    ``values``, _meta_values', its response ``data`` and its tokens, which
    the metrics record too: read once, by the caller); return the attributes
    of the attempt that answered (telemetry asked for no event of it)."""
    (attempt, attempts, duration_ms, _total_ms, status, request_id, _model, response_model,
     fingerprint, resends, stream, ttft_ms, chunks, target, _usage) = values
    attrs["llmretry.request_id"] = request_id
    attrs["llmretry.attempts"] = attempts
    if target:
        attrs["llmretry.target"] = target
    if resends:
        attrs["llmretry.resends"] = resends
    if response_model:
        attrs["gen_ai.response.model"] = response_model
    if fingerprint:
        attrs["openai.response.system_fingerprint"] = fingerprint
    if stream:
        attrs["gen_ai.request.stream"] = True
        if ttft_ms is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = ttft_ms * 0.001
        if chunks is not None:
            attrs["llmretry.chunks"] = chunks
    if in_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = in_tokens
    if out_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = out_tokens
    _response_attributes(attrs, data, capture)
    if status is not None and duration_ms is not None:     # (always, from the engine)
        answered = {"llmretry.attempt": attempt, "http.response.status_code": status,
                    "llmretry.duration_ms": duration_ms}
    else:
        answered = {"llmretry.attempt": attempt}
        if status is not None:
            answered["http.response.status_code"] = status
        if duration_ms is not None:
            answered["llmretry.duration_ms"] = duration_ms
    if target:
        answered["llmretry.target"] = target
    return answered


def _end_span(span: Any, attrs: Dict[str, Any], targets: _Targets, endpoint: Any, model: Any,
              started: Any, failed: Optional[str], answered: Optional[Dict[str, Any]],
              attempts: Optional[Dict[Any, List[Any]]], end_ns: int) -> None:
    """Set a call's span's attributes (those it did not start with) at
    once, its name if the call turned out another (``model`` and
    ``endpoint`` against the ``started`` model and the first target), its
    attempt events (``attempts``', then ``answered``'s, the attempt a result
    says answered) and its status (not its end)."""
    # The model and endpoint it started with are set already.
    if model == started:
        attrs.pop("gen_ai.request.model", None)
    elif isinstance(model, str):
        attrs["gen_ai.request.model"] = model
    if not targets.single:          # the endpoint that answered (start had none)
        attrs.update(endpoint.attrs)
    if endpoint is not targets.first or model != started:
        name = _span_name(endpoint, model)
        if name != _span_name(targets.first, started):
            span.update_name(name)
    if not endpoint.genai:          # an HTTP span: no GenAI attribute (a file's id, ...)
        attrs = {k: v for k, v in attrs.items() if not k.startswith(("gen_ai.", "openai."))}
    span.set_attributes(attrs)
    if attempts:
        if answered is not None:
            known = attempts.get(answered["llmretry.attempt"])
            if known is not None:       # a caller's logger asked for its events too
                known[0] = end_ns
                known[1].update(answered)
                answered = None
        for at, fields in attempts.values():
            span.add_event(_ATTEMPT_EVENT, fields, timestamp=at)
    if answered is not None:
        span.add_event(_ATTEMPT_EVENT, answered, timestamp=end_ns)
    if failed:
        span.set_status(Status(StatusCode.ERROR, failed))


def _record(tel: _Telemetry, counts: Optional[List[int]], endpoint: Any, model: Any,
            response_model: Any, failed: Optional[str], start_ns: int, end_ns: int, ttfc: Any,
            in_tokens: Any, out_tokens: Any, attempts: Any,
            sums: Optional[Dict[Any, List[Any]]] = None) -> None:
    """A call's metrics: the conventions' attributes (low cardinality: no
    ids). ``counts``: its retries, 429s and refusals from its events (None:
    it had none). ``sums``: a running batch's attempts, where a call with
    none of those adds its own (_Counts.start_batch)."""
    sets = tel.metric_sets.get((endpoint, model, response_model))
    if sets is None:
        sets = _metric_sets(tel, endpoint, model, response_model)
    key, base, hist, input_set, output_set = sets
    started = attempts if type(attempts) is int else 0
    if counts is not None:
        counts[0] = started
        if counts[0] or counts[1] or counts[2] or counts[3]:
            tel.counts.add(key, base, counts)
    elif sums is not None:
        row = sums.get(key)
        if row is None:
            row = sums[key] = [base, 0]
        row[1] += started
    elif started:
        tel.counts.add_attempts(key, base, started)
    if not endpoint.genai:          # the GenAI metrics are a generation's
        return
    tel.duration.record((end_ns - start_ns) / 1e9,
                        dict(hist, **{"error.type": failed}) if failed else hist)
    if ttfc is not None:
        tel.ttfc.record(ttfc, hist)
    if type(in_tokens) is int:
        tel.tokens.record(in_tokens, input_set)
    if type(out_tokens) is int:
        tel.tokens.record(out_tokens, output_set)


def _start_span(tel: _Telemetry, targets: _Targets, parent: Any, model: Optional[str],
                policy: Any, start_ns: Optional[int]) -> Any:
    """A call's span, started with what is known before it runs (the
    samplers see it); its end adds the rest."""
    name, attrs = _start_of(tel, targets.first, targets.single, model, policy)
    return tel.tracer.start_span(name, parent, _CLIENT, attrs, start_time=start_ns)


# ---------------------------------------------------------------------------
# One logical call

class _Call:
    """One logical call seen through its events and its outcome, made a span
    when it ends.

    Telemetry asks the engine only for the events of failures, retries and
    give-ups (_NEEDED): the attempt that succeeded is read from the result,
    so a call answered at once costs no event. Events arrive on the thread
    (or event loop) that waits for the call, so a call is never touched by
    two threads at once.

    A call's span starts when the call does (start(): call_llm, stream_llm,
    their asyncio forms, a transport's request; a batch starts its items'
    spans itself, as it submits them), so that its context goes to the
    server in the request's headers (``traceparent``). It starts with the
    attributes a sampler may look at (_start_of); the rest, the request's
    settings included, are set once at the end, and only if the span
    records (OpenTelemetry's advice: a span sampled out costs no
    attributes). A record that never started makes its span when it ends,
    with the times observed (the SDK takes explicit start and end times).
    """

    __slots__ = ("tel", "targets", "parent", "start_ns", "body", "model", "stream", "policy",
                 "attempts", "last", "ended", "end_on_final", "counts", "span")

    def __init__(self, tel: _Telemetry, targets: _Targets, parent: Any,
                 start_ns: Optional[int], body: Any = None, model: Optional[str] = None,
                 stream: bool = False, end_on_final: bool = False, policy: Any = None) -> None:
        self.tel = tel
        self.targets = targets
        self.parent = parent
        self.start_ns = start_ns
        # The request body, read at the end (its settings) if the span records.
        if model is None and body is not None:
            body, model = _model_of(body)
        self.body = body
        self.model = model      # the request's: it names the span
        self.stream = stream
        self.policy = policy
        self.attempts: Dict[Any, List[Any]] = {}   # attempt -> [end time, attributes]
        self.last: Dict[str, Any] = {}      # span attributes from the events so far
        self.ended = False
        self.end_on_final = end_on_final
        # Attempts started, retries, 429s, circuit-open refusals: added to
        # the counters once, at the end (made by the first event: a call
        # answered at once only has its attempt).
        self.counts: Optional[List[int]] = None
        self.span: Any = None

    def start(self, headers: Optional[List[str]]) -> Optional[List[str]]:
        """Start the span (the call starts now) and return the call's header
        lines with its context added, as the application's propagators
        write it (by default W3C ``traceparent``): every attempt carries
        it. None: the caller's headers as they are."""
        try:
            self.span = span = _start_span(self.tel, self.targets, self.parent, self.model,
                                           self.policy, self.start_ns)
            return _Propagation(self.parent, headers).lines(span)
        except Exception:       # telemetry must never break a call
            return None

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

    def _emit(self, result: Any, error: Optional[BaseException],
              end_ns: Optional[int]) -> None:
        end_ns = end_ns or time_ns()
        if isinstance(result, Result):
            self._succeeded(result, end_ns)
        else:
            self._failed(error, end_ns)

    def _succeeded(self, result: Result, end_ns: int) -> None:
        """The span and metrics of a call that succeeded: its meta says most
        (a batch's item with no events ends the same way without a record:
        _otel_batch's _Batch.item_done)."""
        values = _meta_values(result)
        last = self.last
        targets = self.targets
        target = values[_TARGET]
        endpoint = targets[target] if target else targets.first
        # The request's model names the call (a fallback's is the response's).
        model = started = self.model
        if model is None:
            model = last.get("gen_ai.request.model") or values[_MODEL] or None
        start_ns = self._start_ns(values[_TOTAL_MS], end_ns)
        span = self.span
        if span is None:        # never started: made now, with the times observed
            span = self.span = _start_span(self.tel, targets, self.parent, model, self.policy,
                                           start_ns)
            started = model
        usage = values[_USAGE]
        if usage:
            in_tokens = usage.get("prompt_tokens")
            out_tokens = usage.get("completion_tokens")
        else:                   # the events' usage, if any (the span's already)
            in_tokens = last.get("gen_ai.usage.input_tokens")
            out_tokens = last.get("gen_ai.usage.output_tokens")
        if span.is_recording():
            attrs = self._request_attributes()
            answered = _success_attributes(attrs, values, result.data, self.tel.capture,
                                           in_tokens, out_tokens)
            _end_span(span, attrs, targets, endpoint, model, started, None, answered,
                      self.attempts, end_ns)
        span.end(end_time=end_ns)
        ttft_ms = values[_TTFT_MS]
        ttfc = ttft_ms * 0.001 if values[_STREAM] and ttft_ms is not None else None
        _record(self.tel, self.counts, endpoint, model, values[_RESPONSE_MODEL], None, start_ns,
                end_ns, ttfc, in_tokens, out_tokens, values[1])

    def _failed(self, error: Optional[BaseException], end_ns: int) -> None:
        """The span and metrics of a call that failed (``error``), or that
        ended with no outcome (a stream left early, a batch stopped): what
        the error and the events say."""
        last = self.last
        usage = total_ms = said_model = None
        if isinstance(error, LLMError):
            usage = error.usage_total
            total_ms = error.total_ms
            attempts: Any = error.attempts
            target = error.target
            said_model = error.model
            failed: Optional[str] = error.kind
        else:
            target = last.get("llmretry.target", 0)
            attempts = last.get("llmretry.attempts")
            if attempts is None:
                attempts = len(self.attempts)
            failed = last.get("error.type")
            if failed is None and error is not None:
                failed = type(error).__qualname__
        targets = self.targets
        endpoint = targets[target] if target else targets.first
        model = started = self.model
        if model is None:
            model = last.get("gen_ai.request.model") or said_model or None
        start_ns = self._start_ns(total_ms, end_ns)
        span = self.span
        if span is None:
            span = self.span = _start_span(self.tel, targets, self.parent, model, self.policy,
                                           start_ns)
            started = model
        if span.is_recording():
            attrs = self._request_attributes()
            if isinstance(error, LLMError):
                attrs["llmretry.request_id"] = error.request_id
                attrs["llmretry.attempts"] = error.attempts
                if error.reason:
                    attrs["llmretry.reason"] = error.reason
                if error.resends:
                    attrs["llmretry.resends"] = error.resends
            attrs.setdefault("llmretry.attempts", attempts)
            if failed:
                attrs["error.type"] = failed
            if not target:
                attrs.pop("llmretry.target", None)
            if usage:
                _usage_attributes(attrs, usage)
            _end_span(span, attrs, targets, endpoint, model, started, failed, None,
                      self.attempts, end_ns)
        span.end(end_time=end_ns)
        if usage:
            in_tokens = usage.get("prompt_tokens")
            out_tokens = usage.get("completion_tokens")
        else:
            in_tokens = last.get("gen_ai.usage.input_tokens")
            out_tokens = last.get("gen_ai.usage.output_tokens")
        _record(self.tel, self.counts, endpoint, model, last.get("gen_ai.response.model"), failed,
                start_ns, end_ns, last.get("gen_ai.response.time_to_first_chunk"), in_tokens,
                out_tokens, attempts)

    def _start_ns(self, total_ms: Any, end_ns: int) -> int:
        """When the call started: when it was seen starting, else its end
        less its total time."""
        start_ns = self.start_ns
        if start_ns is None and total_ms is not None:
            start_ns = end_ns - int(total_ms * 1_000_000)
        if start_ns is None or start_ns > end_ns:
            start_ns = end_ns
        return start_ns

    def _request_attributes(self) -> Dict[str, Any]:
        """The span's attributes so far (the events', ended: none adds to
        them any more) with the request's settings, read now."""
        attrs = self.last
        if self.body is not None:
            _body_attributes(attrs, self.body, self.tel.capture)
        if self.stream:
            attrs["gen_ai.request.stream"] = True
        return attrs


def _usage_attributes(attrs: Dict[str, Any], usage: Dict[str, Any]) -> None:
    """A usage's tokens as the span's attributes."""
    tokens = usage.get("prompt_tokens")
    if tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = tokens
    tokens = usage.get("completion_tokens")
    if tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = tokens
