"""llmretry.otel's mapping: what a call's span and metrics say, from its
events, its request and its response (the table EVENT_FIELDS, the targets'
endpoints, the request's settings, the response's id, finish reasons and,
with capture_content, the messages). No OpenTelemetry here: a Lua host
could follow the same table. docs/observability.md prints it.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ._llmretry import url_join

# ---------------------------------------------------------------------------
# The mapping: engine event fields -> telemetry. One table, read by the
# span, its attempt events and the metrics alike (docs/observability.md
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

# Request settings -> span attributes: body key -> (attribute, type, rank);
# of keys naming one attribute, the lowest rank present wins.
_REQUEST_SETTINGS: Dict[str, Tuple[str, Any, int]] = {
    "max_tokens": ("gen_ai.request.max_tokens", int, 0),
    "max_completion_tokens": ("gen_ai.request.max_tokens", int, 1),
    "max_output_tokens": ("gen_ai.request.max_tokens", int, 2),
    "temperature": ("gen_ai.request.temperature", float, 0),
    "top_p": ("gen_ai.request.top_p", float, 0),
    "frequency_penalty": ("gen_ai.request.frequency_penalty", float, 0),
    "presence_penalty": ("gen_ai.request.presence_penalty", float, 0),
    "seed": ("gen_ai.request.seed", int, 0),
}


# ---------------------------------------------------------------------------
# Where a call goes

# The API's resources that are not a model's generation: the Files and
# Batch APIs llmretry.batch_api calls, the lists and retrievals the SDK sends
# through llmretry.httpx.
_NOT_GENERATION = re.compile(r"/(files|batches|uploads|models)(/|$)")


class _Endpoint:
    """What the span says of a call's target: the operation (from the URL's
    path), the provider, the server's host and port. Never the URL's
    user-info or query (a key could be there).

    A call that is no generation (not a POST, or a POST to the Files or
    Batch API) is no GenAI operation: ``genai`` is False, its span is an
    HTTP client span named by its method (``operation``), with
    ``http.request.method`` and no gen_ai.* attribute, and it records none
    of the GenAI metrics."""

    __slots__ = ("operation", "provider", "address", "port", "api_type", "attrs", "genai")

    def __init__(self, url: str, method: str = "POST") -> None:
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
        self.genai = True
        if method != "POST" or (_NOT_GENERATION.search(path) and not path.endswith(
                ("/completions", "/responses", "/embeddings"))):
            self.operation, self.api_type, self.genai = method, None, False
        elif path.endswith("/embeddings"):
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
        # The span's attributes of the endpoint, made once (not per call).
        self.attrs: Dict[str, Any] = {"gen_ai.operation.name": self.operation,
                                      "gen_ai.provider.name": self.provider} if self.genai \
            else {"http.request.method": method}
        if self.api_type and self.provider == "openai":
            self.attrs["openai.api.type"] = self.api_type
        if host:
            self.attrs["server.address"] = host
            self.attrs["server.port"] = port


def _url_of(url: Any, base: Any, endpoint: Any = None) -> str:
    """The URL a call posts to (the core's rule: ``url``, else ``base_url``
    plus the endpoint's path, else $OPENAI_BASE_URL's, else OpenAI's)."""
    if isinstance(url, str) and url:
        return url
    root = base if isinstance(base, str) and base else (
        os.environ.get("OPENAI_BASE_URL") or _DEFAULT_BASE)
    path = endpoint if isinstance(endpoint, str) and endpoint else "chat/completions"
    return url_join(root, "/" + path)


class _Targets:
    """The endpoints of a call's targets: its own (``first``), then each
    fallback's (``single``: none)."""

    __slots__ = ("endpoints", "first", "single")

    def __init__(self, endpoints: List[_Endpoint]) -> None:
        self.endpoints = endpoints
        self.first = endpoints[0]
        self.single = len(endpoints) == 1

    def __getitem__(self, target: Any) -> _Endpoint:
        if isinstance(target, int) and 0 <= target < len(self.endpoints):
            return self.endpoints[target]
        return self.endpoints[0]


_targets_cache: Dict[Tuple[Any, ...], _Targets] = {}


def _targets_of(kwargs: Dict[str, Any]) -> _Targets:
    """The targets of a call from its engine keywords (a plan's: the
    policy, the client's defaults and the call's own already resolved)."""
    key = (kwargs.get("url"), kwargs.get("base_url"), kwargs.get("fallbacks"),
           kwargs.get("endpoint"), kwargs.get("method"))
    targets = _targets_cache.get(key)
    if targets is not None:
        return targets
    primary = _url_of(key[0], key[1], key[3])
    method = key[4].upper() if isinstance(key[4], str) else "POST"
    endpoints = [_Endpoint(primary, method)]
    try:
        fallbacks = json.loads(key[2]) if isinstance(key[2], str) else ()
    except ValueError:
        fallbacks = ()
    for target in fallbacks if isinstance(fallbacks, list) else ():
        if isinstance(target, dict) and (target.get("url") or target.get("base_url")):
            endpoints.append(_Endpoint(_url_of(target.get("url"), target.get("base_url"),
                                               key[3]), method))
        else:
            endpoints.append(endpoints[0])
    targets = _Targets(endpoints)
    if len(_targets_cache) >= 256:      # a bound, not an LRU: a program has few endpoints
        _targets_cache.clear()
    _targets_cache[key] = targets
    return targets


# ---------------------------------------------------------------------------
# Request and response: what events do not hold

# The body keys _body_attributes reads (a call's cost is per key looked at).
_REQUEST_KEYS = frozenset(_REQUEST_SETTINGS) | {"stream", "n", "stop", "response_format"}


def _body_attributes(attrs: Dict[str, Any], body: Any, capture: bool) -> None:
    """Add to ``attrs`` the span attributes of a request body (a dict, or
    the caller's JSON text): its settings but its model (the span starts
    with that), never its text; with ``capture`` its messages."""
    if type(body) is not dict:
        body = _parsed(body)
        if not isinstance(body, dict):
            return
    for key in body:        # a body has few keys: no set made of them
        if key not in _REQUEST_KEYS:
            continue
        value = body[key]
        spec = _REQUEST_SETTINGS.get(key)
        if spec is not None:
            name, kind, rank = spec
            t = type(value)
            if (t is kind or (t is not bool and isinstance(value, (int, float)))) and (
                    not rank or _ranked_first(body, name, rank)):
                attrs[name] = value if t is kind else kind(value)
        elif key == "stream":
            if value is True:
                attrs["gen_ai.request.stream"] = True
        elif key == "n":
            if isinstance(value, int) and not isinstance(value, bool) and value != 1:
                attrs["gen_ai.request.choice.count"] = value
        elif key == "stop":
            if isinstance(value, str):
                attrs["gen_ai.request.stop_sequences"] = [value]
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                attrs["gen_ai.request.stop_sequences"] = list(value)
        elif isinstance(value, dict) and value.get("type") in ("json_object", "json_schema"):
            attrs["gen_ai.output.type"] = "json"        # response_format
    if capture:
        messages = _input_messages(body)
        if messages is not None:
            attrs["gen_ai.input.messages"] = json.dumps(messages, ensure_ascii=False)


def _ranked_first(body: Dict[str, Any], name: str, rank: int) -> bool:
    """Whether no key of a lower rank naming attribute ``name`` has a number
    in ``body`` (max_tokens over max_completion_tokens over max_output_tokens)."""
    for key, (other, _kind, other_rank) in _REQUEST_SETTINGS.items():
        if other == name and other_rank < rank:
            value = body.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return False
    return True


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


def _response_attributes(attrs: Dict[str, Any], data: Any, capture: bool) -> None:
    """Add to ``attrs`` the span attributes of a response: its id, finish
    reasons and (with capture) its messages."""
    if not isinstance(data, dict):
        return
    rid = data.get("id")
    if isinstance(rid, str):
        attrs["gen_ai.response.id"] = rid
    choices = data.get("choices")
    if isinstance(choices, list):
        first = choices[0] if len(choices) == 1 else None
        if type(first) is dict:         # one choice (most answers): no list walked
            reason = first.get("finish_reason")
            if type(reason) is str:
                attrs["gen_ai.response.finish_reasons"] = [reason]
        else:
            try:
                reasons = [c["finish_reason"] for c in choices]
            except (TypeError, KeyError):
                reasons = None
            if reasons and all(type(r) is str for r in reasons):
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


def _span_name(endpoint: _Endpoint, model: Any) -> str:
    if isinstance(model, str) and endpoint.genai:
        return f"{endpoint.operation} {model}"
    return endpoint.operation


def _metric_attributes(endpoint: _Endpoint, model: Any) -> Dict[str, Any]:
    if not endpoint.genai:
        attrs: Dict[str, Any] = {"http.request.method": endpoint.operation}
    else:
        attrs = {"gen_ai.operation.name": endpoint.operation,
                 "gen_ai.provider.name": endpoint.provider}
        if isinstance(model, str):
            attrs["gen_ai.request.model"] = model
    if endpoint.address:
        attrs["server.address"] = endpoint.address
        attrs["server.port"] = endpoint.port
    return attrs
