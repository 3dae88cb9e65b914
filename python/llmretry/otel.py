"""OpenTelemetry for llmretry: one span per logical call, GenAI metrics.

::

    import llmretry.otel
    llmretry.otel.instrument()              # every Client, the default one too
    llmretry.otel.instrument(client)        # or one Client (and its transports)
    ...
    llmretry.otel.uninstrument()

Each call (``call_llm``, ``stream_llm``, each item of ``call_many``, their
asyncio forms, and the POSTs of ``llmretry.httpx``'s transports) becomes one
CLIENT span named ``chat {model}`` (``embeddings {model}``, ...) under the
caller's current span, covering every attempt and wait, with one span event
``llmretry.attempt`` per attempt. The span, its attempt events and the
metrics are made from the engine's events (the same that loggers get: one
path for logs and telemetry), read through the table ``EVENT_FIELDS`` below;
the request and the result add what events do not hold (the request's
settings, the response id, the finish reasons). The mapping is documented in
docs/opentelemetry.md.

No prompt, answer or response text is recorded unless ``capture_content``
is True; the API key and the ``Authorization`` header never are (nothing
here reads them). Needs ``opentelemetry-api`` (``pip install
'llmretry[otel]'``); importing ``llmretry`` does not import this module.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from time import time_ns
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import __version__, _aio
from . import _client as _client_module
from ._aio import AsyncStream
from ._client import Client, Result
from ._http_transport import TransportCore
from ._stream import Stream
from .errors import LLMError

__all__ = ["instrument", "uninstrument", "EVENT_FIELDS"]

_SCOPE = "llmretry"
# The version of the conventions the names below follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"

# ---------------------------------------------------------------------------
# The mapping: engine event fields -> telemetry. One table, read by the
# span, its attempt events and the metrics alike (docs/opentelemetry.md
# prints it; a Lua host would follow the same one).
#
#   field: (span attribute, attempt-event attribute, scale)
#
# A span attribute is set from the call's last event carrying the field (its
# success or give-up); an attempt-event attribute from the events of that
# attempt (started, failed/error/succeeded, the retry it scheduled). A scale
# of 0.001 turns milliseconds into seconds, as the conventions measure time.

EVENT_FIELDS: Dict[str, Tuple[Optional[str], Optional[str], Optional[float]]] = {
    "request_id": ("llmretry.request_id", None, None),
    "model": ("gen_ai.request.model", None, None),
    "policy": ("llmretry.policy", None, None),
    "target": ("llmretry.target", "llmretry.target", None),
    "attempt": (None, "llmretry.attempt", None),
    "timeout_ms": (None, "llmretry.timeout_ms", None),
    "deadline_left_ms": (None, "llmretry.deadline_left_ms", None),
    "status": (None, "http.response.status_code", None),
    "duration_ms": (None, "llmretry.duration_ms", None),
    "retry_after": (None, "llmretry.retry_after", None),
    "error_code": (None, "llmretry.error_code", None),
    "error_kind": ("error.type", "error.type", None),
    "validation_path": (None, "llmretry.validation_path", None),
    "delay_ms": (None, "llmretry.delay_ms", None),
    "delay_source": (None, "llmretry.delay_source", None),
    "repair": (None, "llmretry.repair", None),
    "response_model": ("gen_ai.response.model", None, None),
    "system_fingerprint": ("openai.response.system_fingerprint", None, None),
    "reason": ("llmretry.reason", "llmretry.reason", None),
    "attempts": ("llmretry.attempts", None, None),
    "stream": ("gen_ai.request.stream", None, None),
    "ttft_ms": ("gen_ai.response.time_to_first_chunk", None, 0.001),
    "chunks": ("llmretry.chunks", None, None),
    "stream_reason": ("llmretry.stream_reason", "llmretry.stream_reason", None),
    # usage: {"prompt_tokens", "completion_tokens"} -> the two below.
    "usage": ("gen_ai.usage", None, None),
    # The response's own text (first 500 bytes): content, see _CONTENT_FIELDS.
    "body_preview": (None, "llmretry.body_preview", None),
}
# Fields that may hold text of the exchange: kept only with capture_content.
_CONTENT_FIELDS = frozenset({"body_preview"})
# Attribute values the events give as names of the engine's ("error_kind":
# "http_status") and that the conventions want as they are: error.type is
# llmretry's kind (timeout, network, http_status, circuit_open, ...).

_ATTEMPT_EVENT = "llmretry.attempt"
_ENDS = ("llm_request_succeeded", "llm_request_gave_up")

# Bucket boundaries the GenAI conventions give.
_SECONDS_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                    20.48, 40.96, 81.92]
_TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                  16777216, 67108864]

# gen_ai.provider.name by host; any other OpenAI-compatible server is
# "openai", the API flavour it speaks (the conventions' advice).
_PROVIDERS = (
    (".openai.azure.com", "azure.ai.openai"), ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"), ("api.mistral.ai", "mistral_ai"),
    ("api.x.ai", "x_ai"), ("api.perplexity.ai", "perplexity"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
)
_DEFAULT_BASE = "https://api.openai.com/v1"

# Request settings -> span attributes (first key present wins).
_REQUEST_SETTINGS = (
    (("max_tokens", "max_completion_tokens", "max_output_tokens"), "gen_ai.request.max_tokens",
     int),
    (("temperature",), "gen_ai.request.temperature", float),
    (("top_p",), "gen_ai.request.top_p", float),
    (("frequency_penalty",), "gen_ai.request.frequency_penalty", float),
    (("presence_penalty",), "gen_ai.request.presence_penalty", float),
    (("seed",), "gen_ai.request.seed", int),
)


# ---------------------------------------------------------------------------
# Where a call goes

class _Endpoint:
    """What the span says of a call's target: the operation (from the URL's
    path), the provider, the server's host and port. Never the URL's
    user-info or query (a key could be there)."""

    __slots__ = ("operation", "provider", "address", "port", "api_type")

    def __init__(self, url: str) -> None:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
            path = parts.path.rstrip("/").lower()
        except ValueError:
            host, port, path = None, None, ""
        if port is None and host:
            port = 443 if url[:6].lower() == "https:" else 80
        self.address = host
        self.port = port
        self.api_type: Optional[str] = "chat_completions"
        if path.endswith("/embeddings"):
            self.operation, self.api_type = "embeddings", None
        elif path.endswith("/chat/completions"):
            self.operation = "chat"
        elif path.endswith("/completions"):
            self.operation, self.api_type = "text_completion", None
        elif path.endswith("/responses"):
            self.operation, self.api_type = "chat", "responses"
        else:
            self.operation = "chat"
        self.provider = "openai"
        for suffix, name in _PROVIDERS:
            if host and (host == suffix.lstrip(".") or host.endswith(suffix)):
                self.provider = name
                break


def _url_of(url: Any, base: Any, endpoint: Any = None) -> str:
    """The URL a call posts to (the core's rule: ``url``, else ``base_url``
    plus the endpoint's path, else $OPENAI_BASE_URL's, else OpenAI's)."""
    if isinstance(url, str) and url:
        return url
    root = base if isinstance(base, str) and base else (
        os.environ.get("OPENAI_BASE_URL") or _DEFAULT_BASE)
    path = endpoint if isinstance(endpoint, str) and endpoint else "chat/completions"
    return root.rstrip("/") + "/" + path


class _Targets:
    """The endpoints of a call's targets: its own, then each fallback's."""

    __slots__ = ("endpoints",)

    def __init__(self, endpoints: List[_Endpoint]) -> None:
        self.endpoints = endpoints

    def __getitem__(self, target: Any) -> _Endpoint:
        if isinstance(target, int) and 0 <= target < len(self.endpoints):
            return self.endpoints[target]
        return self.endpoints[0]


_targets_cache: Dict[Tuple[Any, ...], _Targets] = {}


def _targets_of(kwargs: Dict[str, Any]) -> _Targets:
    """The targets of a call from its engine keywords (a plan's: the
    policy, the client's defaults and the call's own already resolved)."""
    key = (kwargs.get("url"), kwargs.get("base_url"), kwargs.get("fallbacks"),
           kwargs.get("endpoint"))
    targets = _targets_cache.get(key)
    if targets is not None:
        return targets
    primary = _url_of(key[0], key[1], key[3])
    endpoints = [_Endpoint(primary)]
    try:
        fallbacks = json.loads(key[2]) if isinstance(key[2], str) else ()
    except ValueError:
        fallbacks = ()
    for target in fallbacks if isinstance(fallbacks, list) else ():
        if isinstance(target, dict) and (target.get("url") or target.get("base_url")):
            endpoints.append(_Endpoint(_url_of(target.get("url"), target.get("base_url"),
                                               key[3])))
        else:
            endpoints.append(endpoints[0])
    targets = _Targets(endpoints)
    if len(_targets_cache) >= 256:      # a bound, not an LRU: a program has few endpoints
        _targets_cache.clear()
    _targets_cache[key] = targets
    return targets


# ---------------------------------------------------------------------------
# Request and response: what events do not hold

def _request_attributes(body: Any) -> Dict[str, Any]:
    """The span attributes of a request body's settings (never its text)."""
    attrs: Dict[str, Any] = {}
    if not isinstance(body, dict):
        return attrs
    model = body.get("model")
    if isinstance(model, str):
        attrs["gen_ai.request.model"] = model
    if body.get("stream") is True:
        attrs["gen_ai.request.stream"] = True
    for keys, name, kind in _REQUEST_SETTINGS:
        for key in keys:
            value = body.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attrs[name] = kind(value)
                break
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    stop = body.get("stop")
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attrs["gen_ai.request.stop_sequences"] = list(stop)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        attrs["gen_ai.output.type"] = "json"
    return attrs


def _parsed(body: Any) -> Any:
    """A body as a dict: str/bytes bodies are the caller's JSON text."""
    if isinstance(body, (str, bytes, bytearray)):
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None
    return body


def _parts(content: Any) -> List[Dict[str, Any]]:
    """A message's content as the conventions' parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: List[Dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "content": part["text"]})
        else:
            parts.append({"type": str(kind)})     # an image, a file: named, not copied
    return parts


def _message(msg: Dict[str, Any]) -> Dict[str, Any]:
    role = msg.get("role")
    out: Dict[str, Any] = {"role": role if isinstance(role, str) else "user"}
    if role == "tool":
        out["parts"] = [{"type": "tool_call_response", "id": msg.get("tool_call_id"),
                         "response": msg.get("content")}]
        return out
    parts = _parts(msg.get("content"))
    for call in msg.get("tool_calls") or ():
        if isinstance(call, dict):
            fn = call.get("function")
            fn = fn if isinstance(fn, dict) else {}
            parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                          "arguments": fn.get("arguments")})
    out["parts"] = parts
    return out


def _input_messages(body: Any) -> Optional[List[Dict[str, Any]]]:
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if isinstance(messages, list):
        return [_message(m) for m in messages if isinstance(m, dict)]
    given = body.get("input")      # the Responses API, embeddings
    if isinstance(given, str):
        return [{"role": "user", "parts": [{"type": "text", "content": given}]}]
    if isinstance(given, list):
        return [_message(m) if isinstance(m, dict) else
                {"role": "user", "parts": [{"type": "text", "content": str(m)}]}
                for m in given]
    return None


def _response_attributes(data: Any, capture: bool) -> Dict[str, Any]:
    """The span attributes of a response: its id, finish reasons and (with
    capture) its messages."""
    attrs: Dict[str, Any] = {}
    if not isinstance(data, dict):
        return attrs
    rid = data.get("id")
    if isinstance(rid, str):
        attrs["gen_ai.response.id"] = rid
    choices = data.get("choices")
    if isinstance(choices, list):
        reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
        if reasons and all(isinstance(r, str) for r in reasons):
            attrs["gen_ai.response.finish_reasons"] = reasons
        if capture:
            out = []
            for c in choices:
                if isinstance(c, dict) and isinstance(c.get("message"), dict):
                    msg = _message(c["message"])
                    msg["finish_reason"] = c.get("finish_reason")
                    out.append(msg)
            attrs["gen_ai.output.messages"] = json.dumps(out, ensure_ascii=False)
    elif capture and isinstance(data.get("output"), list):     # the Responses API
        out = [_message(item) for item in data["output"]
               if isinstance(item, dict) and item.get("type") == "message"]
        attrs["gen_ai.output.messages"] = json.dumps(out, ensure_ascii=False)
    return attrs


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
        self.attempts = meter.create_counter(
            "llmretry.attempts", unit="{attempt}", description="Attempts started")
        self.retries = meter.create_counter(
            "llmretry.retries", unit="{retry}", description="Retries scheduled")
        self.rate_limited = meter.create_counter(
            "llmretry.rate_limited", unit="{response}",
            description="Attempts the server refused with 429")
        self.circuit_open = meter.create_counter(
            "llmretry.circuit_open", unit="{call}",
            description="Calls refused because their endpoint's circuit breaker was open")


def _metric_attributes(endpoint: _Endpoint, model: Any) -> Dict[str, Any]:
    attrs: Dict[str, Any] = {"gen_ai.operation.name": endpoint.operation,
                             "gen_ai.provider.name": endpoint.provider}
    if isinstance(model, str):
        attrs["gen_ai.request.model"] = model
    if endpoint.address:
        attrs["server.address"] = endpoint.address
        attrs["server.port"] = endpoint.port
    return attrs


# ---------------------------------------------------------------------------
# One logical call

class _Call:
    """One logical call seen through its events, made a span when it ends.

    Events arrive on the thread (or event loop) that waits for the call, so
    a call is never touched by two threads at once. The span is made at the
    end with the times observed (the SDK takes explicit start and end
    times): nothing is held open, and a call abandoned mid-way leaves
    nothing behind but this object, freed with it.
    """

    __slots__ = ("tel", "targets", "parent", "start_ns", "request", "inputs", "attempts",
                 "last", "ended", "end_on_final", "counts")

    def __init__(self, tel: _Telemetry, targets: _Targets, parent: Any,
                 start_ns: Optional[int], body: Any = None, end_on_final: bool = False) -> None:
        self.tel = tel
        self.targets = targets
        self.parent = parent
        self.start_ns = start_ns
        self.request: Dict[str, Any] = {}
        self.inputs: Optional[str] = None
        self.attempts: Dict[Any, List[Any]] = {}   # attempt -> [end time, attributes]
        self.last: Dict[str, Any] = {}       # span attributes from the events so far
        self.ended = False
        self.end_on_final = end_on_final
        # Attempts started, retries, 429s, circuit-open refusals: added to
        # the counters once, at the end (one measurement each, not one per
        # event: the SDK's cost is per measurement).
        self.counts = [0, 0, 0, 0]
        if body is not None:
            self.set_body(body)

    def set_body(self, body: Any) -> None:
        body = _parsed(body)
        self.request = _request_attributes(body)
        if self.tel.capture:
            messages = _input_messages(body)
            if messages is not None:
                self.inputs = json.dumps(messages, ensure_ascii=False)

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
        if name == "llm_request_started":
            counts[0] += 1
        elif name == "llm_retry_scheduled":
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
                    self.last["gen_ai.usage.input_tokens"] = value.get("prompt_tokens")
                    self.last["gen_ai.usage.output_tokens"] = value.get("completion_tokens")
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
        if name in _ENDS and self.end_on_final:
            self.end()

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

    def _emit(self, result: Any, error: Optional[BaseException],
              end_ns: Optional[int]) -> None:
        tel = self.tel
        end_ns = end_ns or time_ns()
        attrs = dict(self.last)
        attrs.update(self.request)
        meta = result.meta if isinstance(result, Result) else None
        usage = None
        total_ms = None
        if meta is not None:
            usage = meta.usage_total or meta.usage
            total_ms = meta.total_ms
            attrs["llmretry.request_id"] = meta.request_id
            attrs["llmretry.attempts"] = meta.attempts
            attrs["llmretry.target"] = meta.target
            if meta.resends:
                attrs["llmretry.resends"] = meta.resends
            if meta.response_model:
                attrs["gen_ai.response.model"] = meta.response_model
            if meta.stream:
                attrs["gen_ai.request.stream"] = True
                if meta.ttft_ms is not None:
                    attrs["gen_ai.response.time_to_first_chunk"] = meta.ttft_ms * 0.001
            attrs.update(_response_attributes(result.data, tel.capture))
            target = meta.target
        elif isinstance(error, LLMError):
            usage = error.usage_total
            total_ms = error.total_ms
            attrs["error.type"] = error.kind
            attrs["llmretry.request_id"] = error.request_id
            attrs["llmretry.attempts"] = error.attempts
            if error.reason:
                attrs["llmretry.reason"] = error.reason
            if error.resends:
                attrs["llmretry.resends"] = error.resends
            target = error.target
        else:
            target = attrs.get("llmretry.target", 0)
            if error is not None and "error.type" not in attrs:
                attrs["error.type"] = type(error).__qualname__
        if "llmretry.attempts" not in attrs:
            attrs["llmretry.attempts"] = len(self.attempts)
        if usage:
            attrs["gen_ai.usage.input_tokens"] = usage.get("prompt_tokens")
            attrs["gen_ai.usage.output_tokens"] = usage.get("completion_tokens")
        if not attrs.get("llmretry.target"):
            attrs.pop("llmretry.target", None)
        endpoint = self.targets[target]
        model = attrs.get("gen_ai.request.model")
        attrs["gen_ai.operation.name"] = endpoint.operation
        attrs["gen_ai.provider.name"] = endpoint.provider
        if endpoint.api_type and endpoint.provider == "openai":
            attrs["openai.api.type"] = endpoint.api_type
        if endpoint.address:
            attrs["server.address"] = endpoint.address
            attrs["server.port"] = endpoint.port
        if self.inputs is not None:
            attrs["gen_ai.input.messages"] = self.inputs
        start_ns = self.start_ns
        if start_ns is None and total_ms is not None:
            start_ns = end_ns - int(total_ms * 1_000_000)
        if start_ns is None or start_ns > end_ns:
            start_ns = end_ns
        attrs = {k: v for k, v in attrs.items() if v is not None}
        failed = "error.type" in attrs
        name = f"{endpoint.operation} {model}" if isinstance(model, str) else endpoint.operation
        span = tel.tracer.start_span(name, context=self.parent, kind=SpanKind.CLIENT,
                                     attributes=attrs, start_time=start_ns)
        for at, fields in self.attempts.values():
            span.add_event(_ATTEMPT_EVENT, fields, timestamp=at)
        if failed:
            span.set_status(Status(StatusCode.ERROR, attrs["error.type"]))
        span.end(end_time=end_ns)
        # Metrics: the conventions' attributes (low cardinality: no ids).
        mattrs = _metric_attributes(endpoint, model)
        for counter, count in zip((tel.attempts, tel.retries, tel.rate_limited,
                                   tel.circuit_open), self.counts):
            if count:
                counter.add(count, mattrs)
        if attrs.get("gen_ai.response.model"):
            mattrs["gen_ai.response.model"] = attrs["gen_ai.response.model"]
        if failed:
            mattrs["error.type"] = attrs["error.type"]
        tel.duration.record((end_ns - start_ns) / 1e9, mattrs)
        mattrs.pop("error.type", None)
        ttfc = attrs.get("gen_ai.response.time_to_first_chunk")
        if ttfc is not None:
            tel.ttfc.record(ttfc, mattrs)
        for key, kind in (("gen_ai.usage.input_tokens", "input"),
                          ("gen_ai.usage.output_tokens", "output")):
            tokens = attrs.get(key)
            if isinstance(tokens, int):
                tel.tokens.record(tokens, dict(mattrs, **{"gen_ai.token.type": kind}))


def _tee(call_sink: Callable[[Dict[str, Any]], None], user: Any) -> Callable[[Dict[str, Any]], None]:
    """The logger a call gets: the telemetry's sink, then the caller's own
    logger (which keeps its own levels, and fails as it did: the engine
    reports it and goes on). The telemetry's errors go nowhere."""
    if user is None:
        def tee(ev: Dict[str, Any]) -> None:
            try:
                call_sink(ev)
            except Exception:   # telemetry must never break a call
                pass
    else:
        def tee(ev: Dict[str, Any]) -> None:
            try:
                call_sink(ev)
            except Exception:
                pass
            user(ev)
    return tee


# ---------------------------------------------------------------------------
# Which calls are instrumented

_lock = threading.Lock()
_everywhere: Optional[_Telemetry] = None
_per_client: "weakref.WeakKeyDictionary[Client, _Telemetry]" = weakref.WeakKeyDictionary()
_originals: Dict[Tuple[Any, str], Any] = {}


def _telemetry_of(client: Any) -> Optional[_Telemetry]:
    if _per_client:
        tel = _per_client.get(client)
        if tel is not None:
            return tel
    return _everywhere


def _with_sink(plan: Any, sink: Callable[[Dict[str, Any]], None]) -> Any:
    """``plan`` whose logger is ``sink`` followed by the plan's own."""
    new = plan.with_options([("logger", _tee(sink, plan.kwargs.get("on_event")))])
    new.auto_key = plan.auto_key
    return new


def _end_with(call: _Call, exc: BaseException) -> None:
    # An argument refused before any I/O made no request: no span.
    if isinstance(exc, LLMError) or call.attempts or call.last.get("llmretry.reason"):
        call.end(error=exc)


class _Finish:
    """A stream's finish (outcome -> Result or raise), watched: the span ends
    with the assembled result or the error."""

    __slots__ = ("inner", "call")

    def __init__(self, inner: Callable[[Any], Any], call: _Call) -> None:
        self.inner = inner
        self.call = call

    def __call__(self, out: Any) -> Any:
        try:
            res = self.inner(out)
        except BaseException as exc:
            self.call.end(error=exc)
            raise
        self.call.end(result=res)
        return res


# The hooks: each wraps one of the funnels every call of its kind passes
# through (the module-level functions, the Client's methods, policies, the
# CLI), runs it with a logger that also feeds the call's record, and ends
# the record with the outcome.

def _hook_run(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Client._run: every synchronous call_llm."""
    def _run(self: Client, body: Any, plan: Any) -> Any:
        tel = _telemetry_of(self)
        if tel is None:
            return orig(self, body, plan)
        call = _Call(tel, _targets_of(plan.kwargs), otel_context.get_current(), time_ns(), body)
        try:
            res = orig(self, body, _with_sink(plan, call.on_event))
        except BaseException as exc:
            _end_with(call, exc)
            raise
        call.end(result=res)
        return res
    return _run


def _hook_start_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_client._start_stream: every stream_llm."""
    def _start_stream(client: Client, body: Any, plan: Any, stream_buffer_bytes: Any) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, body, plan, stream_buffer_bytes)
        call = _Call(tel, _targets_of(plan.kwargs), otel_context.get_current(), time_ns(), body)
        call.request["gen_ai.request.stream"] = True
        s = orig(client, body, _with_sink(plan, call.on_event), stream_buffer_bytes)
        s._finish = _Finish(s._finish, call)
        return s
    return _start_stream


def _async_kwargs(call: _Call, extra: Dict[str, Any],
                  kwargs: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """An asyncio call's keywords with the record's logger (every event)."""
    extra = dict(extra)
    extra.pop("event_mask", None)
    return extra, dict(kwargs, on_event=_tee(call.on_event, kwargs.get("on_event")))


def _hook_acall(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_aio.acall: every acall_llm."""
    async def acall(client: Client, engine: Any, payload: bytes, extra: Dict[str, Any],
                    kwargs: Dict[str, Any], finish: Callable[[Any], Any]) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return await orig(client, engine, payload, extra, kwargs, finish)
        call = _Call(tel, _targets_of(kwargs), otel_context.get_current(), time_ns(), payload)
        extra, kwargs = _async_kwargs(call, extra, kwargs)
        try:
            res = await orig(client, engine, payload, extra, kwargs, finish)
        except BaseException as exc:
            _end_with(call, exc)
            raise
        call.end(result=res)
        return res
    return acall


def _hook_astream(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_aio.astream: every astream_llm."""
    def astream(client: Client, engine: Any, payload: bytes, extra: Dict[str, Any],
                kwargs: Dict[str, Any], finish: Callable[[Any], Any],
                parse: Callable[[bytes], Any]) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, engine, payload, extra, kwargs, finish, parse)
        call = _Call(tel, _targets_of(kwargs), otel_context.get_current(), time_ns(), payload)
        call.request["gen_ai.request.stream"] = True
        extra, kwargs = _async_kwargs(call, extra, kwargs)
        return orig(client, engine, payload, extra, kwargs, _Finish(finish, call), parse)
    return astream


def _hook_close(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Stream.close: a stream left early ends its span with what its events
    said (read to its end, it ended with its result)."""
    def close(self: Any) -> None:
        try:
            orig(self)
        finally:
            finish = self._finish
            if type(finish) is _Finish:
                finish.call.end()
    return close


def _hook_aclose(orig: Callable[..., Any]) -> Callable[..., Any]:
    """AsyncStream.aclose: as Stream.close."""
    async def aclose(self: Any) -> None:
        try:
            await orig(self)
        finally:
            finish = self._finish
            if type(finish) is _Finish:
                finish.call.end()
    return aclose


class _Batch:
    """The records of a batch's calls, by request id: events come tagged
    with it, each item's value carries it (and its index, hence its body)."""

    __slots__ = ("tel", "targets", "parent", "start_ns", "items", "calls")

    def __init__(self, tel: _Telemetry, kwargs: Dict[str, Any], items: Any) -> None:
        self.tel = tel
        self.targets = _targets_of(kwargs)
        self.parent = otel_context.get_current()
        self.start_ns = time_ns()
        # A list's bodies are read back by index; a lazy batch keeps none
        # (its memory stays flat): its spans lack the request's settings
        # (the model comes from the events) and its input messages.
        self.items = items
        self.calls: Dict[Any, _Call] = {}

    def on_event(self, ev: Dict[str, Any]) -> None:
        rid = ev.get("request_id")
        call = self.calls.get(rid)
        if call is None:
            call = self.calls[rid] = _Call(self.tel, self.targets, self.parent, None)
        call.on_event(ev)

    def on_result(self, user: Any) -> Callable[[int, Any], Any]:
        def on_result(index: int, value: Any) -> Any:
            try:
                self.item_done(index, value)
            except Exception:   # telemetry must never break a batch
                pass
            if user is not None:
                return user(index, value)
            return None
        return on_result

    def item_done(self, index: int, value: Any) -> None:
        rid: Optional[str]
        if isinstance(value, Result):
            rid, total_ms = value.meta.request_id, value.meta.total_ms
        elif isinstance(value, LLMError):
            rid, total_ms = value.request_id, value.total_ms
        else:               # never sent (a bad input line)
            return
        call = self.calls.pop(rid, None)
        if call is None:    # no event came (the batch's deadline passed first)
            call = _Call(self.tel, self.targets, self.parent, None)
        items = self.items
        if items is not None and 0 <= index < len(items):
            call.set_body(items[index])
        now = time_ns()
        # The call's own clock: from its submission, waits for a slot included.
        call.start_ns = max(self.start_ns, now - int((total_ms or 0) * 1_000_000))
        if isinstance(value, Result):
            call.end(result=value, end_ns=now)
        else:
            call.end(error=value, end_ns=now)


def _hook_engine_job(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_client._engine_job: every batch run on the engine (call_many,
    acall_many, ``llmretry batch``): one record per item."""
    def _engine_job(client: Client, batch: Any, encoded: Any, plan: Any, limit: int,
                    deadline_ms: Any, adaptive: bool) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, batch, encoded, plan, limit, deadline_ms, adaptive)
        records = _Batch(tel, plan.kwargs, batch.items)
        # Each item's value, as it finishes, through the batch's on_result
        # (this batch's own attribute: the caller's runs after it).
        batch.on_result = records.on_result(batch.on_result)
        return orig(client, batch, encoded, _with_sink(plan, records.on_event), limit,
                    deadline_ms, adaptive)
    return _engine_job


def _hook_call_of(orig: Callable[..., Any]) -> Callable[..., Any]:
    """TransportCore.call_of: llmretry.httpx's calls. The SDK reads the
    response, so the record ends with the call's last event."""
    def call_of(self: TransportCore, request: Any, content: bytes) -> Any:
        call = orig(self, request, content)
        tel = _telemetry_of(self.client) if call is not None else None
        if tel is None:
            return call
        record = _Call(tel, _targets_of(call.kwargs), otel_context.get_current(), time_ns(),
                       content, end_on_final=True)
        call.kwargs.pop("event_mask", None)      # every event, for the record
        call.kwargs["on_event"] = _tee(record.on_event, call.kwargs.get("on_event"))
        return call
    return call_of


_HOOKS: Tuple[Tuple[Any, str, Callable[[Any], Any]], ...] = (
    (Client, "_run", _hook_run),
    (_client_module, "_start_stream", _hook_start_stream),
    (_client_module, "_engine_job", _hook_engine_job),
    (_aio, "acall", _hook_acall),
    (_aio, "astream", _hook_astream),
    (Stream, "close", _hook_close),
    (AsyncStream, "aclose", _hook_aclose),
    (TransportCore, "call_of", _hook_call_of),
)


def _install() -> None:
    if _originals:
        return
    for owner, name, hook in _HOOKS:
        orig = vars(owner)[name]
        _originals[owner, name] = orig
        wrapped = hook(orig)
        wrapped.__wrapped__ = orig
        setattr(owner, name, wrapped)


def _remove() -> None:
    for (owner, name), orig in _originals.items():
        setattr(owner, name, orig)
    _originals.clear()


# ---------------------------------------------------------------------------
# The public functions

def instrument(client: Optional[Client] = None, *, tracer_provider: Any = None,
               meter_provider: Any = None, capture_content: bool = False) -> None:
    """Trace and measure llmretry's calls with OpenTelemetry.

    ``client``: None for every :class:`~llmretry.Client` (the default client
    of the module-level functions included), or one client (its calls, and
    the ``llmretry.httpx`` transports built on it). ``tracer_provider`` and
    ``meter_provider`` default to the global ones (set later is fine).
    ``capture_content`` adds the request's messages and the answer's
    (``gen_ai.input.messages``, ``gen_ai.output.messages``) and response
    bodies of failed attempts to the spans: off by default, as they may
    hold personal data. The API key is never recorded.

    Calling it again for the same target replaces its settings.
    """
    global _everywhere
    if client is not None and not isinstance(client, Client):
        raise TypeError(f"client must be a llmretry.Client or None, "
                        f"not {type(client).__name__}")
    if not isinstance(capture_content, bool):
        raise TypeError(f"capture_content must be a bool, not {type(capture_content).__name__}")
    tel = _Telemetry(tracer_provider, meter_provider, capture_content)
    with _lock:
        if client is None:
            _everywhere = tel
        else:
            _per_client[client] = tel
        _install()


def uninstrument(client: Optional[Client] = None) -> None:
    """Stop instrumenting: every client (None), or that one client's own
    instrumentation (it then follows ``instrument()``'s, if any)."""
    global _everywhere
    with _lock:
        if client is None:
            _everywhere = None
            _per_client.clear()
        else:
            _per_client.pop(client, None)
        if _everywhere is None and not _per_client:
            _remove()


# ---------------------------------------------------------------------------
# The CLI's --otel

class _CliExport:
    """``llmretry --otel``: an SDK exporting spans and metrics with OTLP/HTTP
    to $OTEL_EXPORTER_OTLP_ENDPOINT (the exporters read it, and the other
    OTEL_EXPORTER_OTLP_* variables); flushed when the command ends."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "llmretry"})
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # A long interval: the command's metrics go out once, at shutdown.
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(),
                                               export_interval_millis=60000)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def shutdown(self) -> None:
        uninstrument()
        self.tracer_provider.shutdown()     # flushes what is queued
        self.meter_provider.shutdown()
