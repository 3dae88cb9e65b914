"""The mock's scripts checked: steps, limits, outages, routes, clocks (the
validation a PUT of ``/_mock/scenario`` and ``MockServer.script`` share),
and the constants they default to."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional, Tuple

from . import _sse


Step = Dict[str, Any]
Record = Dict[str, Any]

FAULTS = frozenset(
    {"reset", "close", "no_headers", "stall_body", "truncate", "invalid_json",
     "huge", "trickle"})

HEADER_SHORTCUTS: Tuple[Tuple[str, str], ...] = (
    ("retry_after", "Retry-After"),
    ("retry_after_ms", "retry-after-ms"),
    ("should_retry", "x-should-retry"),
    ("ratelimit_reset_requests", "x-ratelimit-reset-requests"),
    ("ratelimit_reset_tokens", "x-ratelimit-reset-tokens"),
)

DEFAULT_USAGE: Dict[str, int] = {
    "prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
# An embeddings answer's: one vector per input, and usage without completion
# tokens (as OpenAI's /v1/embeddings reports it).
DEFAULT_EMBEDDING: Tuple[float, ...] = (0.0, 0.25, -0.5)
DEFAULT_EMBEDDING_USAGE: Dict[str, int] = {"prompt_tokens": 8, "total_tokens": 8}
DEFAULT_STALL_MS = 30000
DEFAULT_INTERVAL_MS = 1000
DEFAULT_HUGE_SIZE = 64 * 1024 * 1024
INVALID_JSON_BODY = b'{"choices": [ not json'

_CHUNK = 256 * 1024
_PADDING = b"x" * _CHUNK
_MAX_BODY = 1 << 31
_NO_BODY_STATUSES = frozenset({204, 304})


class ScriptError(ValueError):
    """A scenario script that does not follow the protocol."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_step(step: Any, where: str) -> Step:
    """Validate one step; return it (a dict) or raise ScriptError."""
    if not isinstance(step, dict):
        raise ScriptError(f"{where}: a step must be a JSON object")
    status = step.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) \
            or not 100 <= status <= 999:
        raise ScriptError(f"{where}: status must be an integer in 100..999")
    headers = step.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            raise ScriptError(f"{where}: headers must be an object")
        for name, value in headers.items():
            if not name or not isinstance(name, str):
                raise ScriptError(f"{where}: bad header name {name!r}")
            _check_header_value(value, f"{where}: header {name}")
    for key, _ in HEADER_SHORTCUTS:
        if key in step:
            _check_header_value(step[key], f"{where}: {key}")
    for key in ("delay_ms", "stall_ms", "interval_ms", "idle_close_ms"):
        if key in step and (not _is_number(step[key]) or step[key] < 0):
            raise ScriptError(f"{where}: {key} must be a number >= 0")
    if "size" in step:
        size = step["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ScriptError(f"{where}: size must be an integer >= 0")
    fault = step.get("fault")
    if fault is not None and fault not in FAULTS:
        raise ScriptError(
            f"{where}: unknown fault {fault!r} (one of {sorted(FAULTS)})")
    try:
        _sse.check_stream(step, where)
    except _sse.BadStream as exc:
        raise ScriptError(str(exc)) from None
    return step


def _check_header_value(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise ScriptError(f"{where}: a header value must be a string, "
                          "number, boolean or null")


def _check_script(steps: Any, after: Any) -> Tuple[List[Step], Optional[Step]]:
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        raise ScriptError("steps must be an array")
    checked = [_check_step(s, f"steps[{i}]") for i, s in enumerate(steps)]
    if after is not None:
        after = _check_step(after, "after")
    return copy.deepcopy(checked), copy.deepcopy(after)


LIMIT_KEYS = frozenset({"rpm", "tpm", "window_ms", "retry_after",
                        "rate_headers", "stated_per"})
DEFAULT_WINDOW_MS = 60000
DEFAULT_COMPLETION_TOKENS = DEFAULT_USAGE["completion_tokens"]


def _check_fields(obj: Any, name: str, known: "frozenset[str]") -> None:
    """A script's object field: an object of known keys only."""
    if not isinstance(obj, dict):
        raise ScriptError(f"{name} must be an object")
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ScriptError(f"{name}: unknown field(s) {unknown} (known: {sorted(known)})")


def _check_limits(limits: Any) -> Optional[Dict[str, Any]]:
    """Validate a script's ``limits``; return it with defaults filled in.

    Unknown keys are errors (unlike a step's): a misspelt ``rmp`` would
    otherwise silently leave the scenario unlimited.
    """
    if limits is None:
        return None
    _check_fields(limits, "limits", LIMIT_KEYS)
    for key in ("rpm", "tpm"):
        value = limits.get(key)
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int) or value < 1):
            raise ScriptError(f"limits: {key} must be an integer >= 1 or null")
    window = limits.get("window_ms", DEFAULT_WINDOW_MS)
    if not _is_number(window) or not 0 < window < float("inf"):
        raise ScriptError("limits: window_ms must be a number > 0")
    for key in ("retry_after", "rate_headers"):
        if key in limits and not isinstance(limits[key], bool):
            raise ScriptError(f"limits: {key} must be a boolean")
    stated_per = limits.get("stated_per", "minute")
    if stated_per not in ("minute", "window"):
        raise ScriptError('limits: stated_per must be "minute" or "window"')
    return {"rpm": limits.get("rpm"), "tpm": limits.get("tpm"),
            "window_ms": window,
            "retry_after": limits.get("retry_after", True),
            "rate_headers": limits.get("rate_headers", True),
            "stated_per": stated_per}


OUTAGE_MODES = frozenset({"503", "reset", "close", "hang"})
OUTAGE_KEYS = frozenset({"mode", "from_ms", "to_ms"})
OUTAGE_BODY = json.dumps({"error": {
    "message": "mock outage: the service is unavailable",
    "type": "server_error", "code": None}}).encode("utf-8")
_HANG_POLL = 0.05


def _check_outage_mode(mode: Any, where: str) -> str:
    if mode not in OUTAGE_MODES:
        raise ScriptError(f"{where}: unknown outage mode {mode!r} "
                          f"(one of {sorted(OUTAGE_MODES)})")
    return str(mode)


def _check_outage(outage: Any) -> Optional[Dict[str, Any]]:
    """Validate a script's ``outage`` window; return it with defaults.

    Unknown keys are errors, as in ``limits``: a misspelt ``to`` would
    otherwise leave the scenario down for good.
    """
    if outage is None:
        return None
    _check_fields(outage, "outage", OUTAGE_KEYS)
    mode = _check_outage_mode(outage.get("mode", "503"), "outage")
    start = outage.get("from_ms", 0)
    if not _is_number(start) or not 0 <= start < float("inf"):
        raise ScriptError("outage: from_ms must be a number >= 0")
    end = outage.get("to_ms")
    if end is not None and (not _is_number(end) or not end > start):
        raise ScriptError("outage: to_ms must be a number > from_ms, or null")
    return {"mode": mode, "from_ms": start, "to_ms": end}


CLOCKS = frozenset({"real", "manual"})
# How long a wait on a scenario's clock sleeps before looking at the stop
# flag again (an advance wakes it at once).
_CLOCK_POLL = 0.1


def _check_clock(clock: Any) -> str:
    """A script's ``clock``: "real" (the default) or "manual"."""
    if clock is None:
        return "real"
    if clock not in CLOCKS:
        raise ScriptError(f"clock must be one of {sorted(CLOCKS)}, or null")
    return str(clock)


def _check_advance(ms: Any) -> float:
    """An ``advance_ms`` (POST /_mock/clock): a finite number >= 0."""
    if not _is_number(ms) or not 0 <= ms < float("inf"):
        raise ScriptError("clock: advance_ms must be a number >= 0")
    return float(ms)


def _check_route(route: Any) -> Optional[Dict[str, str]]:
    """Validate a script's ``route``: model -> scenario, non-empty strings."""
    if route is None:
        return None
    if not isinstance(route, dict):
        raise ScriptError("route must be an object of model -> scenario")
    for model, target in route.items():
        if not isinstance(model, str) or not model \
                or not isinstance(target, str) or not target:
            raise ScriptError(f"route: {model!r} -> {target!r}: models and "
                              f"scenarios must be non-empty strings")
    return dict(route)
