"""Call options: their types, their conversion to the engine's keywords, plans.

``CallOptions`` and ``BatchOptions`` are generated from the core's option
table; the converters check each Python value's type (the core checks the
ranges). A :class:`_Plan` is a call's options converted once, layered
explicit keywords over a client's defaults (over a policy's, _PolicyPlan).
"""

from __future__ import annotations

import functools
import inspect
import json
import operator
from typing import (Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence,
                    Tuple, TypedDict, TypeVar, Union, cast)

from . import _llmretry
from ._logging import DEFAULT, event_mask_of, event_sink
from ._models import ModelCheck
from ._policies import BUILTIN_DEFAULTS, POLICY_KEYS, Policy, _to_json, new_idempotency_key

Body = Union[Mapping[str, Any], str, bytes]
Validate = Callable[[Any], Any]


# The keywords of every call function, typed from the core's option table:
# ``**options: Unpack[CallOptions]`` in their signatures. The block is
# generated (``make generate``); a test fails when it is stale.
# BEGIN GENERATED call-options (tools/gen_surface.py, from the core's tables: do not edit)
class BatchOptions(TypedDict, total=False):
    """The call keywords the calls of a batch share (``**options`` of
    call_many and acall_many, whose ``deadline_ms`` is the batch's and
    ``call_deadline_ms`` each call's), each as docs/reliability.md says."""

    #: the full endpoint URL, used as is (instead of base_url + / + endpoint)
    url: Optional[str]
    #: the API's base URL, / + endpoint appended before its query, if any (else
    #: $OPENAI_BASE_URL, else https://api.openai.com/v1)
    base_url: Optional[str]
    #: the API path appended to base_url (docs/endpoints.md); url, when set, wins
    endpoint: Literal["chat/completions", "completions", "embeddings", "responses"]
    #: sent as Authorization: Bearer (else $OPENAI_API_KEY, else none); never in a log,
    #: event or error
    api_key: Optional[str]
    #: one attempt, connect to last byte (for a stream: to the first chunk)
    timeout_ms: int
    #: attempts = 1 + retries; every request the server saw counts, a refused one (429) too
    max_retries: int
    #: the exponential backoff's base
    base_delay_ms: int
    #: the exponential backoff's cap
    max_delay_ms: int
    #: additive: min(cap, base·2ⁿ) + U(0, base); full: U(0, min(cap, base·2ⁿ)); none:
    #: min(cap, base·2ⁿ)
    jitter: Literal["additive", "full", "none"]
    #: unsafe: never retry once the request may have reached the server
    retry_mode: Literal["safe", "unsafe"]
    #: the statuses that may be retried (null: 408, 429, 500-599 except 501 and 505)
    retry_statuses: Optional[Sequence[int]]
    #: a longer server-requested wait ends the call
    max_retry_after_ms: int
    #: a 2xx body that is not JSON, or that validate rejects, is retried
    retry_invalid_response: bool
    #: larger bodies fail with response_too_large
    max_response_bytes: int
    #: requests a minute to the endpoint (its URL, key and model), paced evenly on the
    #: client
    rpm: int
    #: tokens a minute to the endpoint, estimated from each body and corrected by its usage
    tpm: int
    #: the endpoint's retry budget: over a rolling 10 s, retries <= ratio x requests + min
    retry_budget_ratio: float
    #: the retry budget's allowance: retries <= ratio x requests + min
    retry_budget_min: int
    #: that many transient failures in a row (timeout, network, 408, 429, 5xx) open the
    #: endpoint's circuit breaker
    breaker_failures: int
    #: how long the breaker stays open before one probe may go
    breaker_cooldown_ms: int
    #: targets ({model, base_url or url, api_key or api_key_env, headers}) tried in order
    #: when the current one gives up
    fallbacks: Optional[Sequence[Mapping[str, Any]]]
    #: a JSON Schema every answer must match (docs/structured-outputs.md)
    schema: Union[Mapping[str, Any], str, bool, None]
    #: a retry after an answer that failed the schema sends that answer and its errors back
    repair: bool
    #: extra request headers
    headers: Optional[Mapping[str, str]]
    #: the CA bundle to verify servers with, instead of libcurl's default one
    ca_file: Optional[str]
    #: for a stream, the longest gap between two chunks
    idle_timeout_ms: int
    #: the HTTP method; GET and DELETE send no body (a retried POST may repeat its effect)
    method: Literal["POST", "GET", "DELETE"]
    #: the body's Content-Type (null: application/json); another type sends the body as is,
    #: unparsed
    content_type: Optional[str]
    #: a 2xx answer's bytes are the result as text, not parsed as JSON (JSON Lines, say)
    raw_response: bool
    #: a pydantic model: its strict schema is the call's schema, its instance result.parsed
    response_model: Any
    #: validate(data): raising or returning False rejects a response (invalid_response)
    validate: Optional[Validate]
    #: where events go: the "llmretry" logger, None, a Logger or a callable
    logger: Any


class CallOptions(BatchOptions, total=False):
    """Every keyword of call_llm besides ``body``, ``client`` and ``policy``
    (the same for Client(), stream_llm, acall_llm, astream_llm and their
    Client methods): a batch's, and these that are each call's own."""

    #: one budget for all attempts and waits; each attempt gets min(timeout, time left)
    deadline_ms: Optional[int]
    #: sent as Idempotency-Key on every attempt; in a policy only "auto" (a new key per
    #: call)
    idempotency_key: Optional[str]
    #: sent as X-Client-Request-Id (else a new UUID v4)
    request_id: Optional[str]
# END GENERATED call-options


# ---------------------------------------------------------------------------
# Argument conversion: Python values to the extension's keywords. Types are
# checked here (bool is not an int); ranges are the core's to check.

def _type_name(value: Any) -> str:
    return type(value).__name__


def _text(name: str, value: str) -> str:
    """``value`` when it can be sent as UTF-8 (no lone surrogate)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            # The position, never the text: it could be a key.
            raise ValueError(f"{name} is not valid text: a lone surrogate at "
                             f"position {exc.start}") from None
    return value


def _opt_str(name: str, value: Any) -> Optional[str]:
    if value is None:
        return value
    if isinstance(value, str):
        return _text(name, value)
    raise TypeError(f"{name} must be a str or None, not {_type_name(value)}")


def _str(name: str, value: Any) -> str:
    if isinstance(value, str):
        return _text(name, value)
    raise TypeError(f"{name} must be a str, not {_type_name(value)}")


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_INT32_MAX = 2 ** 31 - 1


def _int(name: str, value: Any, low: int = _INT64_MIN, high: int = _INT64_MAX) -> int:
    """An int (not a bool) that fits the C field; the core checks the range."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not bool")
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, not {_type_name(value)}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} is out of range (got {value})")
    return value  # type: ignore[no-any-return]


def _int32(name: str, value: Any) -> int:
    return _int(name, value, -(2 ** 31), _INT32_MAX)


def _opt_int(name: str, value: Any) -> Optional[int]:
    return None if value is None else _int(name, value)


def _whole(name: str, value: Any) -> Any:
    """An integer option given as a float: accepted when it is a whole number,
    as arithmetic on milliseconds gives floats (``timeout_ms=0.5 * 1000``); a
    fraction is refused rather than rounded, naming the option."""
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise TypeError(f"{name} must be a whole number (an int, or a float such as "
                        f"500.0), not {value!r}")
    return value


def _int_option(name: str, value: Any) -> int:
    return _int(name, _whole(name, value))


def _opt_int_option(name: str, value: Any) -> Optional[int]:
    return None if value is None else _int(name, _whole(name, value))


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be a bool, not {_type_name(value)}")


def _statuses(name: str, value: Any) -> Optional[Tuple[int, ...]]:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of ints or None, "
                        f"not {_type_name(value)}")
    return tuple(_int(f"{name}[{i}]", v) for i, v in enumerate(value))


def _headers(name: str, value: Any) -> Optional[List[str]]:
    """A ``{name: value}`` mapping as the ``"Name: value"`` lines libcurl
    sends; each checked by the core's rule (llmretry_check_header)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of str to str or None, "
                        f"not {_type_name(value)}")
    lines = []
    for i, (key, val) in enumerate(value.items()):
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, not {_type_name(key)}")
        _text(f"{name}: the name of header #{i}", key)
        # The name first: an invalid one is never repeated (it may be a
        # whole "Authorization: Bearer sk-..." line).
        _llmretry.check_header(key, "", i)
        if not isinstance(val, str):
            raise TypeError(f"{name}[{key!r}] must be a str, not {_type_name(val)}")
        _text(f"{name}[{key!r}]", val)
        _llmretry.check_header(key, val, i)
        lines.append(f"{key}: {val}")
    return lines


def _number(name: str, value: Any) -> float:
    """A real number (int or float, not bool); the core checks the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {_type_name(value)}")
    return float(value)


def _targets(name: str, value: Any) -> Optional[str]:
    """A list of target dicts as the JSON text the core checks and reads."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of dicts (targets) or None, "
                        f"not {_type_name(value)}")
    targets = []
    for i, target in enumerate(value):
        if not isinstance(target, Mapping):
            raise TypeError(f"{name}[{i}] must be a dict, not {_type_name(target)}")
        for key, val in target.items():
            if not isinstance(key, str):
                raise TypeError(f"{name}[{i}] keys must be str, not {_type_name(key)}")
            if key == "headers" and val is not None:
                if not isinstance(val, Mapping):
                    raise TypeError(f"{name}[{i}].headers must be a dict of str to str, "
                                    f"not {_type_name(val)}")
                continue
            if val is not None and not isinstance(val, str):
                raise TypeError(f"{name}[{i}].{key} must be a str, not {_type_name(val)}")
        targets.append(dict(target))
    try:
        return json.dumps(targets, separators=(",", ":"))
    except (TypeError, ValueError):
        raise TypeError(f"{name}: header names and values must be str") from None


def _schema(name: str, value: Any) -> Optional[str]:
    """A JSON Schema (a dict, JSON text, or True/False) as the JSON text the
    core compiles (and refuses, naming the keyword, when it cannot check it)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    if not isinstance(value, (Mapping, bool)):
        raise TypeError(f"{name} must be a dict, JSON text or None, not {_type_name(value)}")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} cannot be encoded as JSON: {exc}") from None


# How a Python value becomes a core option of each type (the core's option
# table: _llmretry.options()), by (type, nullable).
_CONVERTERS: Dict[Tuple[str, bool], Callable[[str, Any], Any]] = {
    ("text", True): _opt_str, ("text", False): _str, ("enum", False): _str,
    ("int", True): _opt_int_option, ("int", False): _int_option, ("bool", False): _bool,
    ("statuses", True): _statuses, ("headers", True): _headers,
    ("number", False): _number, ("targets", True): _targets, ("schema", True): _schema,
}
_NULLABLE = 1   # LLMRETRY_OPTFLAG_NULLABLE
_ENDPOINT = ("url", "base_url")

# Every call keyword but body, client and policy (CallOptions, generated from
# the core's table), and how a Python value becomes the Engine.call keyword
# of each core option: the types come from the core's table too, so no rule
# about an option lives here.
_OPTION_NAMES = frozenset(CallOptions.__annotations__)
_ENGINE_OPTIONS: Dict[str, Callable[[str, Any], Any]] = {
    name: _CONVERTERS[kind, bool(flags & _NULLABLE)]
    for name, kind, flags in _llmretry.options() if name in _OPTION_NAMES}
_MODEL_AND_VALIDATE = ("response_model and validate cannot be combined: put the checks in the "
                       "model (pydantic validators)")

# What a client shows of itself, with the built-in values when not given.


# The example body the errors about a missing or wrong body show.
_BODY_EXAMPLE = '{"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}'


def _check_batch_options(kwargs: Mapping[str, Any]) -> None:
    """Refuse a batch's shared options before the batch opens its record.

    The core checks the options when the first item is submitted, which is
    after the failures file was emptied and the progress shown: this runs
    the core's same check first, so that a bad option raises with nothing
    changed.
    """
    _llmretry.check_options(**kwargs)


class _Plan:
    """Converted call options: Engine.call keywords, plus a validate callable.

    ``kwargs`` holds only what differs from the engine's own defaults, and
    ``on_event`` when the logger makes events; it is never mutated once
    built, so one plan serves any number of concurrent calls. ``event_mask``
    (for logging loggers) tells at call time which events the logger keeps.
    """

    __slots__ = ("kwargs", "validate", "event_mask", "auto_key")

    def __init__(self, kwargs: Dict[str, Any], validate: Optional[Validate],
                 event_mask: Optional[Callable[[], int]] = None,
                 auto_key: bool = False) -> None:
        self.kwargs = kwargs
        self.validate = validate
        self.event_mask = event_mask
        # A batch gives each item its own idempotency key (policy "auto").
        self.auto_key = auto_key

    def with_options(self, options: Iterable[Tuple[str, Any]]) -> "_Plan":
        """A new plan: this one with ``options`` (public names) applied, as a
        higher layer (explicit over client defaults over built-in)."""
        kwargs = dict(self.kwargs)
        validate = self.validate
        event_mask = self.event_mask
        options = list(options)
        if any(name in _ENDPOINT for name, _ in options):
            # The endpoint is one setting of two keys: a layer naming url or
            # base_url replaces both (the core's rule: llmretry/policies.h).
            for name in _ENDPOINT:
                kwargs.pop(name, None)
        for name, value in options:
            if name == "logger":
                sink = event_sink(value)
                event_mask = event_mask_of(sink)
                if sink is None:
                    kwargs.pop("on_event", None)
                else:
                    kwargs["on_event"] = sink
            elif name == "validate":
                if value is not None and not callable(value):
                    raise TypeError(f"validate must be callable or None, "
                                    f"not {_type_name(value)}")
                if value is not None and isinstance(validate, ModelCheck):
                    raise TypeError(_MODEL_AND_VALIDATE)
                validate = value
            elif name == "response_model":
                # The model's strict schema for the core, pydantic as the
                # validate hook (docs/structured-outputs.md).
                if value is None:
                    if isinstance(validate, ModelCheck):
                        validate = None
                        kwargs.pop("schema", None)
                    continue
                if validate is not None and not isinstance(validate, ModelCheck):
                    raise TypeError(_MODEL_AND_VALIDATE)
                validate = ModelCheck(value)
                kwargs["schema"] = validate.schema_text
            else:
                kwargs[name] = _ENGINE_OPTIONS[name](name, value)
        return _Plan(kwargs, validate, event_mask)

    def with_call_options(self, options: Mapping[str, Any]) -> "_Plan":
        """A new plan with a call's keywords applied (DEFAULT: not given,
        the client's default stands)."""
        if not options:
            return self
        return self.with_options((name, value) for name, value in options.items()
                                 if value is not DEFAULT)


_BASE_PLAN = _Plan({}, None).with_options([("logger", DEFAULT)])


# Keys of a request body: given as keywords, they were meant for the body
# (the core's list, which Lua's message reads too).
_BODY_KEYS = frozenset(_llmretry.body_fields())


def _body_hint(names: Iterable[str]) -> str:
    """What to say when keywords were meant for the request body."""
    meant = sorted(_BODY_KEYS.intersection(names))
    if not meant:
        return ""
    return (f"; {', '.join(meant)} {'goes' if len(meant) == 1 else 'go'} in the request "
            f"body: pass the body as a dict, such as {_BODY_EXAMPLE}")


def _unknown_names(unknown: Iterable[str], known: Iterable[str]) -> str:
    """The unknown keywords, each with the known one it most likely meant
    (the core's rule: ``timeout (did you mean timeout_ms?)``)."""
    candidates = sorted(known)
    said = []
    for name in unknown:
        meant = None if name in _BODY_KEYS else _llmretry.option_suggest(name, candidates)
        said.append(f"{name} (did you mean {meant}?)" if meant else name)
    return ", ".join(said)


def _check_option_names(names: Iterable[str], where: str, own: Iterable[str] = ()) -> None:
    """TypeError for names that are no call option; ``own``: the function's
    own keywords (``limit``, ``max_in_flight``), suggested too."""
    unknown = sorted(set(names).difference(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"{where} got unexpected keyword argument(s): "
                        + _unknown_names(unknown, _OPTION_NAMES.union(own))
                        + _body_hint(unknown))


F = TypeVar("F", bound=Callable[..., Any])


def _needs_body(fn: F) -> F:
    """``fn`` saying what a body is when called without one: Python's own
    "missing 1 required positional argument" does not tell a newcomer who
    wrote ``call_llm(model=..., messages=...)`` to pass a dict. Type
    checkers and help() see ``fn``'s own signature."""
    def message(kwargs: Mapping[str, Any]) -> str:
        return (f"{fn.__name__}() needs the request body as its first argument"
                + (_body_hint(kwargs) or f", a dict such as {_BODY_EXAMPLE}"))

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            if not args and "body" not in kwargs:
                raise TypeError(message(kwargs))
            return await fn(*args, **kwargs)
        return cast(F, acall)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not args and "body" not in kwargs:
            raise TypeError(message(kwargs))
        return fn(*args, **kwargs)
    return cast(F, call)


class _PolicyPlan:
    """A policy made ready for calls: its plan over the client's, and what
    is applied per call (the body's model, an ``"auto"`` idempotency key)."""

    __slots__ = ("policy", "plan", "model", "auto_key")

    def __init__(self, policy: Policy, client_plan: _Plan) -> None:
        self.policy = policy
        # The core resolves the policy over the client's defaults (policies.h:
        # policy > client defaults > built-in, the endpoint as one setting);
        # explicit keywords go over this plan per call.
        layer = {k: v for k, v in client_plan.kwargs.items()
                 if k in POLICY_KEYS or k in _ENDPOINT}
        resolved = json.loads(_llmretry.resolve_policy(
            _to_json(dict(policy.settings)), None, _to_json(layer)))
        model, auto = resolved.pop("model"), resolved.pop("idempotency_key")
        resolved.setdefault("url", None)
        # Built-in values the client did not override are the engine's own.
        plan = client_plan.with_options(
            (k, v) for k, v in resolved.items()
            if k in client_plan.kwargs or v != BUILTIN_DEFAULTS.get(k))
        plan.kwargs["policy"] = policy.name
        self.plan = plan
        self.model: Optional[str] = model if isinstance(model, str) else None
        self.auto_key = auto == "auto"

    def body(self, body: Any) -> Any:
        """The body with the policy's model when it is a dict naming none."""
        if self.model is not None and isinstance(body, dict) and "model" not in body:
            return dict(body, model=self.model)
        return body


def _with_auto_key(plan: _Plan) -> _Plan:
    """``plan`` with a fresh idempotency key (one call, all its attempts)."""
    return _Plan(dict(plan.kwargs, idempotency_key=new_idempotency_key()),
                 plan.validate, plan.event_mask)
