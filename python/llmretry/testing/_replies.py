"""What the mock answers: token charges, headers, error and success bodies
of each API, strict mode's refusals, huge bodies."""

from __future__ import annotations

import copy
import http
import json
import math
import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _sse
from ._scripts import (DEFAULT_COMPLETION_TOKENS, DEFAULT_EMBEDDING, DEFAULT_EMBEDDING_USAGE,
                       DEFAULT_HUGE_SIZE, DEFAULT_USAGE, HEADER_SHORTCUTS, INVALID_JSON_BODY, Step)


def _text_length(value: Any) -> int:
    """Characters of a content/input/prompt value: a string, or a list of
    strings and content parts (``{"type": "text", "text": ...}``)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, str):
                total += len(item)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                total += len(item["text"])
        return total
    return 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) \
        and value >= 0


def _token_charge(request: Any, step: Step) -> int:
    """Tokens a request is charged at admission (OpenAI's estimate).

    ceil(prompt characters / 4) plus the completion budget: the body's
    ``max_completion_tokens`` or ``max_tokens``, else the completion_tokens
    of the usage the step would answer with.
    """
    chars = 0
    budget: Optional[int] = None
    if isinstance(request, dict):
        messages = request.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    chars += _text_length(message.get("content"))
        chars += _text_length(request.get("input"))
        chars += _text_length(request.get("prompt"))
        for key in ("max_completion_tokens", "max_tokens"):
            if _is_count(request.get(key)):
                budget = request[key]
                break
    if budget is None:
        usage = step.get("usage")
        budget = DEFAULT_COMPLETION_TOKENS
        if isinstance(usage, dict) \
                and _is_count(usage.get("completion_tokens")):
            budget = usage["completion_tokens"]
    return (chars + 3) // 4 + budget


def _ceil_ms(seconds: float) -> int:
    """A wait rounded up to a millisecond, float noise under a nanosecond
    aside: a manual clock advanced by whole ms waits whole ms (1 s less
    0.999 s is 1.0000000000000009 ms in floats)."""
    return math.ceil(seconds * 1000 - 1e-6)


def _duration(seconds: float) -> str:
    """A wait in OpenAI's (Go's time.Duration) format, rounded up to a
    millisecond: "0s", "250ms", "1s", "1.5s", "6m0s", "1m30.5s", "1h0m0s"."""
    ms = _ceil_ms(seconds) if seconds > 0 else 0
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3600000)
    minutes, rest = divmod(rest, 60000)
    secs, frac = divmod(rest, 1000)
    text = str(secs) + (f".{frac:03d}".rstrip("0") if frac else "") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def _header_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _step_headers(step: Step) -> List[Tuple[str, str]]:
    """The step's own response headers: shortcuts first, then ``headers``."""
    out: List[Tuple[str, str]] = []
    for key, name in HEADER_SHORTCUTS:
        value = step.get(key)
        if value is not None:
            out.append((name, _header_text(value)))
    for name, value in (step.get("headers") or {}).items():
        if value is not None:
            out.append((name, _header_text(value)))
    return out


def _merge_headers(base: List[Tuple[str, str]],
                   extra: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """Later headers replace earlier ones of the same (case-less) name."""
    out = list(base)
    for name, value in extra:
        lower = name.lower()
        for i, (old, _) in enumerate(out):
            if old.lower() == lower:
                out[i] = (name, value)
                break
        else:
            out.append((name, value))
    return out


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _error_body(status: int, error_code: Any) -> Dict[str, Any]:
    return {"error": {"message": f"mock error {status}",
                      "type": error_code if error_code is not None
                      else "server_error",
                      "code": error_code}}


# Strict mode (MockServer(strict=True), --strict): the requests a real
# OpenAI server refuses are refused here too, with its statuses and error
# shape, so that a test catches a wrong base_url or a body missing what every
# call needs instead of getting a success from a lenient mock. Nothing else
# changes: a request that passes gets its scenario's step as usual.
_OPENAI_PATH = re.compile(
    r"/v1/(chat/completions|completions|responses|embeddings|files|batches|models)(?:/|$)")
_ENDPOINT_PATHS = ("/chat/completions", "/completions", "/responses", "/embeddings")
# Each endpoint's required body fields, with the JSON type each must have.
_REQUIRED: Dict[str, Tuple[Tuple[str, Any, str], ...]] = {
    "chat/completions": (("model", str, "a string"), ("messages", list, "an array of objects")),
    "completions": (("model", str, "a string"),),
    "responses": (("model", str, "a string"),),
    "embeddings": (("model", str, "a string"), ("input", (str, list), "a string or an array")),
}


def _openai_error(message: str, param: Optional[str] = None,
                  code: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error",
                      "param": param, "code": code}}


def _strict_refusal(method: str, path: str,
                    body: bytes) -> Optional[Tuple[int, Dict[str, Any]]]:
    """(status, error body) for a request OpenAI would refuse, else None."""
    rest = path
    if rest.startswith("/s/"):      # the scenario prefix is the mock's own
        rest = rest[3:]
        rest = rest[rest.find("/"):] if "/" in rest else ""
    match = _OPENAI_PATH.match(rest)
    if match is None or (method == "POST" and rest != f"/v1/{match.group(1)}" and
                         rest.endswith(_ENDPOINT_PATHS)):
        # (A path with an endpoint's twice, "/v1/chat/completions/chat/completions",
        # is a whole URL given as a base_url: OpenAI has no such route.)
        return 404, _openai_error(f"Invalid URL ({method} {path})")
    required = _REQUIRED.get(match.group(1)) if method == "POST" and \
        rest == f"/v1/{match.group(1)}" else None
    if required is None:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return 400, _openai_error(
            "We could not parse the JSON body of your request. (The OpenAI API "
            "expects a JSON object.)")
    for name, kind, kind_text in required:
        value = doc.get(name)
        if value is None:
            return 400, _openai_error(f"Missing required parameter: '{name}'.",
                                      name, "missing_required_parameter")
        if not isinstance(value, kind):
            return 400, _openai_error(
                f"Invalid type for '{name}': expected {kind_text}, but got "
                f"{type(value).__name__} instead.", name, "invalid_type")
        if isinstance(value, list) and not value:
            return 400, _openai_error(
                f"Invalid '{name}': empty array. Expected an array with minimum "
                f"length 1, but got an empty array instead.", name, "empty_array")
    return None


def _completion(step: Step, n: int, request_model: Optional[str],
                content: Any) -> Dict[str, Any]:
    model = step.get("model", request_model or "mock-model")
    return {
        "id": f"chatcmpl-mock-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": step.get("system_fingerprint", "fp_mock"),
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": step.get("usage", copy.deepcopy(DEFAULT_USAGE)),
    }


def _api_of(path: str) -> str:
    """Which API a path is (what a success answers): "chat", "completions"
    (legacy), "embeddings" or "responses"."""
    if path.endswith("/chat/completions"):
        return "chat"
    for api in ("completions", "embeddings", "responses"):
        if path.endswith("/" + api):
            return api
    return "chat"


def _inputs(request: Any) -> int:
    """How many inputs an embeddings request has (a list's length, else 1)."""
    given = request.get("input") if isinstance(request, dict) else None
    return max(len(given), 1) if isinstance(given, list) else 1


def _api_success(api: str, step: Step, n: int, request_model: Optional[str],
                 request: Any) -> Dict[str, Any]:
    """The success body of a path that is not Chat Completions'."""
    model = step.get("model", request_model or "mock-model")
    content = step.get("content", "ok")
    if api == "embeddings":
        vector = step.get("embedding", list(DEFAULT_EMBEDDING))
        return {"object": "list", "model": model,
                "data": [{"object": "embedding", "index": i, "embedding": vector}
                         for i in range(_inputs(request))],
                "usage": step.get("usage", copy.deepcopy(DEFAULT_EMBEDDING_USAGE))}
    usage = step.get("usage", copy.deepcopy(DEFAULT_USAGE))
    if api == "completions":
        return {"id": f"cmpl-mock-{n}", "object": "text_completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "text": content, "logprobs": None,
                             "finish_reason": "stop"}],
                "usage": usage}
    return {"id": f"resp_mock-{n}", "object": "response",
            "created_at": int(time.time()), "status": "completed", "model": model,
            "output": [{"type": "message", "id": f"msg_mock-{n}",
                        "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": content,
                                     "annotations": []}]}],
            "usage": _sse._responses_usage(usage)}


def _response_body(step: Step, status: int, n: int,
                   request_model: Optional[str], api: str = "chat",
                   request: Any = None) -> bytes:
    if step.get("fault") == "invalid_json":
        return INVALID_JSON_BODY
    if "body" in step:
        body = step["body"]
        if isinstance(body, str):
            return body.encode("utf-8")
        return json.dumps(body).encode("utf-8")
    if 200 <= status < 300 and api != "chat":
        doc = _api_success(api, step, n, request_model, request)
    elif 200 <= status < 300:
        doc = _completion(step, n, request_model, step.get("content", "ok"))
    else:
        doc = _error_body(status, step.get("error_code"))
    return json.dumps(doc).encode("utf-8")


def _huge_parts(step: Step, n: int,
                request_model: Optional[str]) -> Tuple[bytes, int, bytes]:
    """(prefix, padding length, suffix) of a ``size``-byte chat.completion."""
    size = step.get("size", DEFAULT_HUGE_SIZE)
    content = step.get("content", "ok")
    if not isinstance(content, str):
        content = "" if content is None else str(content)
    sentinel = "\u0001llmretry-huge\u0001"
    text = json.dumps(_completion(step, n, request_model, sentinel))
    marker = json.dumps(sentinel)
    at = text.index(marker)
    prefix = (text[:at] + json.dumps(content)[:-1]).encode("utf-8")
    suffix = ('"' + text[at + len(marker):]).encode("utf-8")
    return prefix, max(0, size - len(prefix) - len(suffix)), suffix
