"""Calls: the Client, the module-level functions and their results.

A :class:`Client` owns one engine (an I/O thread and its connection cache)
and a set of call defaults, converted and checked once when the client is
made. The module-level :func:`call_llm` uses a default client created on
first use, re-created in a forked child and closed at exit.

Every call keyword defaults to :data:`DEFAULT`, meaning "the client's
default, else the documented one"; passing a value (None included) overrides
the client's default for that call.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import operator
import os
import re
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Dict, Iterable, Iterator, List,
                    Literal, Mapping, Optional, Sequence, Sized, Tuple, TypedDict, TypeVar,
                    Union, cast)

from . import _aio, _batch, _llmretry
from ._models import ModelCheck
from ._batch import BatchResult
from ._logging import DEFAULT, event_mask_of, event_sink
from ._policies import (BUILTIN_DEFAULTS, POLICY_KEYS, Policy, PolicySource, _to_json,
                        load_policies, new_idempotency_key)
from ._pool import map_with_concurrency as _map_with_concurrency
from ._stream import Stream
from ._tokens import estimate_tokens
from .errors import LLMError, StreamInterruptedError, error_from_outcome

if sys.version_info >= (3, 11):
    from typing import Unpack
elif TYPE_CHECKING:     # only type checkers read the annotations (PEP 563) before 3.11
    from typing_extensions import Unpack

__all__ = ["Client", "Result", "Meta", "CallOptions", "BatchOptions", "call_llm",
           "call_llm_with_deadline", "call_many"]

T = TypeVar("T")
R = TypeVar("R")

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
    #: the API's base URL, / + endpoint appended (else $OPENAI_BASE_URL, else
    #: https://api.openai.com/v1)
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
    #: requests a minute to the endpoint (its URL and key), paced evenly on the client
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
# Results


@dataclass(frozen=True, eq=True, init=False)
class Meta:
    """What happened during a successful call.

    Attributes:
        attempt: 0-based index of the attempt that succeeded.
        attempts: how many attempts were made.
        duration_ms: how long the successful attempt took.
        total_ms: how long the whole call took, waits included.
        status: the HTTP status of the successful response.
        usage: ``{"prompt_tokens", "completion_tokens", "total_tokens"}``,
            or None when the response had no usage.
        request_id: the call's request id (sent as ``X-Client-Request-Id``).
        model: the model named in the request body.
        response_model: the model the server says answered.
        system_fingerprint: the server's ``system_fingerprint``.
        resends: requests sent again at once, not counted as attempts (a
            refused stream, a dead or stale kept-alive connection): the
            server saw at most ``attempts + resends`` requests.
        stream: True when the call streamed (its body asked to, or the
            server answered with an event stream).
        ttft_ms: for a stream, the time from the call's start to the first
            chunk of the attempt that succeeded (None otherwise).
        chunks: the chunks that attempt received (0 when not streamed).
        target: which target answered: 0 for the call's own, 1 for its
            first ``fallbacks`` entry, and so on.
        usage_total: the usage of every attempt that returned one, summed
            (attempts whose answer failed validation are billed too; ``usage``
            is the successful attempt's alone), or None when none did.
    """

    # The core's meta shape (core/src/shapes.c). __init__ is written out (not
    # the dataclass's) for the defaults: a field added later must not break
    # code that builds a Meta.
    # BEGIN GENERATED meta (tools/gen_surface.py, from the core's tables: do not edit)
    __slots__ = (
        "attempt", "attempts", "duration_ms", "total_ms", "status", "usage", "request_id",
        "model", "response_model", "system_fingerprint", "resends", "stream", "ttft_ms",
        "chunks", "target", "usage_total",
    )

    attempt: int
    attempts: int
    duration_ms: int
    total_ms: int
    status: int
    usage: Optional[Dict[str, int]]
    request_id: str
    model: Optional[str]
    response_model: Optional[str]
    system_fingerprint: Optional[str]
    resends: int
    stream: bool
    ttft_ms: Optional[int]
    chunks: int
    target: int
    usage_total: Optional[Dict[str, int]]

    def __init__(self, attempt: int, attempts: int, duration_ms: int, total_ms: int,
                 status: int, usage: Optional[Dict[str, int]], request_id: str,
                 model: Optional[str], response_model: Optional[str],
                 system_fingerprint: Optional[str], resends: int = 0, stream: bool = False,
                 ttft_ms: Optional[int] = None, chunks: int = 0, target: int = 0,
                 usage_total: Optional[Dict[str, int]] = None) -> None:
        for name, value in zip(self.__slots__, (attempt, attempts, duration_ms, total_ms,
                                                status, usage, request_id, model,
                                                response_model, system_fingerprint, resends,
                                                stream, ttft_ms, chunks, target,
                                                usage_total)):
            object.__setattr__(self, name, value)
    # END GENERATED meta

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (``usage`` copied)."""
        d = {name: getattr(self, name) for name in self.__slots__}
        for key in ("usage", "usage_total"):
            if d[key] is not None:
                d[key] = dict(d[key])
        return d

    def __reduce__(self) -> Tuple[Any, ...]:
        # Frozen slots refuse the default unpickling by setattr.
        return (Meta, tuple(getattr(self, name) for name in self.__slots__))


# What the extension puts in a Result it builds, in place of its Meta.
_LazyMeta = _llmretry.LazyMeta

if TYPE_CHECKING:
    # To a type checker a Result is the pair it unpacks to, so that
    # ``data, meta = call_llm(body)`` types meta as Meta (an __iter__ alone
    # gives both names one type). At run time it is a plain class that
    # unpacks, indexes and has a length the same way.
    _Pair = Tuple[Any, Meta]
else:
    _Pair = object


class Result(_Pair):
    """A successful call: the parsed response ``data`` and its :class:`Meta`.

    Unpacks as a pair: ``data, meta = llmretry.call_llm(body)``. Its repr
    never shows the data.
    """

    __slots__ = ("data", "_meta", "_parsed")
    _parsed: Any

    def __init__(self, data: Any, meta: Meta) -> None:
        self.data = data    # the response body parsed as JSON
        self._meta: Any = meta

    @property
    def meta(self) -> Meta:
        """What happened during the call (:class:`Meta`)."""
        m = self._meta
        if type(m) is _LazyMeta:
            # A success the extension built keeps its Meta's values until
            # they are read: most batches only read .data (issue 36).
            m = self._meta = m()
        return m  # type: ignore[no-any-return]

    @meta.setter
    def meta(self, meta: Meta) -> None:
        self._meta = meta

    def __reduce__(self) -> Tuple[Any, ...]:
        # The Meta itself (built if it was not), never the lazy values.
        if hasattr(self, "_parsed"):
            return (Result, (self.data, self.meta), (None, {"_parsed": self._parsed}))
        return (Result, (self.data, self.meta))

    @property
    def parsed(self) -> Any:
        """With ``response_model``: the answer as an instance of the model
        (validated by pydantic); else None."""
        return getattr(self, "_parsed", None)

    def __iter__(self) -> Iterator[Any]:
        yield self.data
        yield self.meta

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: Any) -> Any:
        return (self.data, self.meta)[index]

    def __repr__(self) -> str:
        m = self.meta
        return (f"Result(status={m.status}, attempts={m.attempts}, "
                f"request_id={m.request_id!r}, model={m.model!r})")


def _call_extra(plan: "_Plan", model: Optional[str]) -> Tuple[Dict[str, Any],
                                                             Optional["_Validator"]]:
    """Engine keywords of one call besides the plan's: its model, the events
    the logger keeps at its current level, the validator (also returned)."""
    extra: Dict[str, Any] = {}
    if model is not None:
        extra["model"] = model
    if plan.event_mask is not None:
        extra["event_mask"] = plan.event_mask()
    validator = None
    if plan.validate is not None:
        validator = extra["validate"] = _Validator(plan.validate)
    return extra, validator


def _result_of(out: Any, validator: Optional["_Validator"]) -> "Result":
    """A finished call's value (Engine.call's or Stream.outcome's) as a
    Result, or raise its LLMError; counted for the batch of a worker."""
    acc = _batch.current_accounting()
    if type(out) is Result:     # a success the extension parsed and built
        if acc is not None:     # a map_with_concurrency worker: count for its batch
            acc.add_meta(out.meta)
        return out
    if acc is not None:
        acc.add_outcome(out)
    if not out["ok"]:
        err = error_from_outcome(out)
        if isinstance(err, StreamInterruptedError) and out.get("body"):
            # What arrived before the stream broke, assembled.
            try:
                fields: Dict[str, Any] = {"usage": None, "response_model": None,
                                          "system_fingerprint": None}
                fields.update(out)
                fields["status"] = 200
                err.partial = Result(_parse_json(out["body"]), _meta_of(fields))
            except (ValueError, RecursionError):
                err.partial = None
        raise err
    try:
        if validator is not None:
            return validator.result(out["body"], _meta_of(out))
        data = _parse_json(out["body"])
    except (ValueError, RecursionError) as exc:
        raise _unparsable(out, exc) from None
    return Result(data, _meta_of(out))


def _unparsable(out: Dict[str, Any], exc: Exception) -> LLMError:
    """The error for a 2xx body the core accepted but Python cannot parse."""
    fields = dict(out, kind="invalid_response", reason="not_retryable",
                  message=f"HTTP {out['status']} with a body Python cannot parse: {exc}",
                  retry_after_ms=None, error_code=None,
                  body_preview=out["body"][:500].decode("utf-8", "replace"))
    return error_from_outcome(fields)


# A frozen dataclass's __init__ sets each field through object.__setattr__;
# the slots' own setters do the same job in half the time. Successes are
# usually built in C (results.c); this builds the others' Meta from the
# outcome's fields, which are Meta's (the core's meta shape).
_META_SETTERS: Tuple[Tuple[str, Callable[[Meta, Any], None]], ...] = tuple(
    (name, getattr(Meta, name).__set__) for name in Meta.__slots__)
_new_object = object.__new__


def _meta_of(out: Mapping[str, Any]) -> Meta:
    m = _new_object(Meta)
    get = out.get
    for name, set_field in _META_SETTERS:
        set_field(m, get(name))
    return m


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


_HEADER_NAME_FORBIDDEN = frozenset(" \t\r\n\0:")


def _headers(name: str, value: Any) -> Optional[List[str]]:
    """A ``{name: value}`` mapping as the ``"Name: value"`` lines libcurl sends."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of str to str or None, "
                        f"not {_type_name(value)}")
    lines = []
    for i, (key, val) in enumerate(value.items()):
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, not {_type_name(key)}")
        # An invalid name is not repeated: a whole "Authorization: Bearer sk-..."
        # line given as a name would put the key in the message.
        if not key or not _HEADER_NAME_FORBIDDEN.isdisjoint(key):
            raise ValueError(f"{name}: the name of header #{i} is invalid (a name is "
                             f"non-empty, without spaces, ':' or control characters)")
        _text(f"{name}: the name of header #{i}", key)
        if not isinstance(val, str):
            raise TypeError(f"{name}[{key!r}] must be a str, not {_type_name(val)}")
        if "\r" in val or "\n" in val or "\0" in val:
            raise ValueError(f"{name}[{key!r}] must not contain CR, LF or NUL")
        _text(f"{name}[{key!r}]", val)
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
_SHOWN_IN_REPR = ("base_url", "timeout_ms", "max_retries", "deadline_ms")

# The request body as sent: compact UTF-8 JSON, strict about NaN.
_BODY_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                                 allow_nan=False)


def _make_fast_encoder() -> Optional[Callable[[Any], str]]:
    """The C encoder behind _BODY_ENCODER, made once (None if unavailable).

    ``JSONEncoder.encode`` builds a new C encoder per call; reusing one
    saves microseconds per call. It keeps no circular-reference memo (it
    is shared between threads): a cycle ends as RecursionError.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder = make(None, _BODY_ENCODER.default, json.encoder.encode_basestring,
                       None, ":", ",", False, False, False)

        def encode(obj: Any) -> str:
            return "".join(encoder(obj, 0))

        if encode({"a": [1, "\u00e9"]}) != '{"a":[1,"\u00e9"]}':
            return None
        return encode
    except Exception:   # a Python whose private encoder differs: use the public one
        return None


_encode_json: Callable[[Any], str] = _make_fast_encoder() or _BODY_ENCODER.encode

# The response parser: the decoder's scanner, without json.loads' wrappers.
_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parse_json(body: bytes) -> Any:
    """Parse a response body (ValueError when it is not UTF-8 JSON, or when
    Python's decoder cannot follow its nesting).

    cJSON accepts 1000 levels; Python's decoder recurses and gives up
    earlier, how much earlier depending on the caller's stack. That is the
    server's body failing to decode, so it is a ValueError like any other
    (an invalid response), never a RecursionError escaping a call or a batch.
    """
    try:
        text = body.decode("utf-8")
        try:
            value, end = _scan_once(text, 0)
        except StopIteration:   # leading whitespace, or not JSON: let loads tell
            return json.loads(text)
        if end != len(text):
            return json.loads(text)
        return value
    except RecursionError:
        raise ValueError("the body is nested too deeply for Python's JSON decoder") from None


# call_many's successes are made Results by the extension, straight from
# each body: it needs the classes, the scanner and, for what the scanner
# refuses, _parse_json (whose ValueError then says why).
_llmretry._set_result_types(Result, Meta, _scan_once, _parse_json)


# A body given as text must be the JSON text of an object (or an array, sent
# as is for a server to judge): checked at its first character (the core
# parses the rest), so a prompt passed as the body ("hello") is told what a
# body is rather than "not valid JSON". The text itself is never quoted: it
# may be the prompt.
_OBJECT_TEXT = re.compile(r"[ \t\r\n]*[{\[]")
_OBJECT_BYTES = re.compile(rb"[ \t\r\n]*[{\[]")
_BODY_EXAMPLE = '{"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]}'
_NOT_AN_OBJECT = ("body must be a dict or the JSON text of an object, such as "
                  + _BODY_EXAMPLE + "; this %s is not")


def _encode_body(body: Any) -> Tuple[bytes, Optional[str]]:
    """The body as bytes, and its model when it is a dict naming one."""
    if isinstance(body, dict):
        try:
            payload = _encode_json(body).encode("utf-8")
        except (TypeError, ValueError) as exc:
            # The message names a type or a character, never the content.
            raise TypeError(f"body cannot be sent as JSON: {exc}") from None
        except RecursionError:
            raise TypeError("body cannot be sent as JSON: it is circular "
                            "or nested too deeply") from None
        model = body.get("model")
        return payload, model if type(model) is str else None
    if isinstance(body, str):
        if not _OBJECT_TEXT.match(body):
            raise ValueError(_NOT_AN_OBJECT % "str")
        try:
            return body.encode("utf-8"), None
        except UnicodeEncodeError as exc:
            raise TypeError(f"body cannot be sent as UTF-8: {exc.reason}") from None
    if isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
        if not _OBJECT_BYTES.match(payload):
            raise ValueError(_NOT_AN_OBJECT % _type_name(body))
        if not payload.isascii():
            # JSON is UTF-8; the core checks the syntax, not the encoding.
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"body is not valid UTF-8 (byte {exc.start}: "
                                 f"{exc.reason})") from None
        return payload, None
    raise TypeError(f"body must be a dict (or the JSON text of an object as str or bytes), "
                    f"not {_type_name(body)}")


def _encode_bodies(bodies: Sequence[Any]) -> List[Tuple[bytes, Optional[str]]]:
    """Every body of a batch encoded, or the error of the first bad one,
    naming its index."""
    out = []
    for i, body in enumerate(bodies):
        try:
            out.append(_encode_body(body))
        except (TypeError, ValueError) as exc:
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(f"bodies[{i}]: {exc}") from None
    return out


def _batch_items(bodies: Any) -> Union[Sequence[Any], Iterator[Any]]:
    """The bodies of a batch: a list or tuple as it is, any other iterable
    as an iterator (read lazily); TypeError naming ``bodies``."""
    if isinstance(bodies, (list, tuple)):
        return bodies
    # One body instead of a list of them is the likely mistake: iterating it
    # would send its keys or its characters.
    if isinstance(bodies, (str, bytes, bytearray, memoryview, Mapping)):
        raise TypeError(f"bodies must be an iterable of request bodies (e.g. a list "
                        f"of dicts), not one {_type_name(bodies)}")
    try:
        it: Iterator[Any] = iter(bodies)
        return it
    except TypeError:
        raise TypeError(f"bodies must be an iterable of request bodies, "
                        f"not {_type_name(bodies)}") from None


class _LazyBodies:
    """The bodies of a batch read lazily: the iterator, what makes each
    item the body sent (``prep``: the policy's model, stream usage), and
    the items that fail without being sent (the CLI's bad lines)."""

    __slots__ = ("items", "prep", "invalid")

    def __init__(self, items: Iterator[Any], prep: Callable[[Any], Any],
                 invalid: Optional[Mapping[int, BaseException]] = None) -> None:
        self.items = items
        self.prep = prep
        self.invalid = invalid


def _with_stream_usage_one(body: Any, responses: bool = False) -> Any:
    """_with_stream_usage for one body."""
    if _asks_stream_usage(body) and not responses:
        return dict(body, stream_options={"include_usage": True})
    return body


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


# Keys of a chat body: given as keywords, they were meant for the body.
_BODY_KEYS = frozenset(("model", "messages", "prompt", "input", "temperature", "max_tokens",
                        "max_completion_tokens", "top_p", "n", "stop", "seed", "tools",
                        "tool_choice", "response_format", "stream", "stream_options", "user"))


def _body_hint(names: Iterable[str]) -> str:
    """What to say when keywords were meant for the request body."""
    meant = sorted(_BODY_KEYS.intersection(names))
    if not meant:
        return ""
    return (f"; {', '.join(meant)} {'goes' if len(meant) == 1 else 'go'} in the request "
            f"body: pass the body as a dict, such as {_BODY_EXAMPLE}")


def _check_option_names(names: Iterable[str], where: str) -> None:
    unknown = sorted(set(names).difference(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"{where} got unexpected keyword argument(s): "
                        + ", ".join(unknown) + _body_hint(unknown))


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


def _shown_shared(spec: str) -> str:
    """``shared`` as a repr may show it: a Redis URL's password (and user)
    as ``***``, up to the last ``@`` before the host, as the core reads it."""
    scheme, sep, rest = spec.partition("://")
    if not sep:
        return spec
    end = len(rest)
    for c in "/?#":
        if c in rest:
            end = min(end, rest.index(c))
    at = rest.rfind("@", 0, end)
    return f"{scheme}://***{rest[at:]}" if at >= 0 else spec


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


class _Validator:
    """Adapts a user ``validate(data)`` to the engine's ``validate(body)``.

    Parses each 2xx body once and keeps the accepted parse for Result.data.
    """

    __slots__ = ("check", "body", "data", "parsed")

    def __init__(self, check: Validate) -> None:
        self.check = check
        self.body: Optional[bytes] = None
        self.data: Any = None
        self.parsed: Any = None     # response_model: the accepted instance

    def __call__(self, body: bytes) -> Optional[str]:
        try:
            data = _parse_json(body)
        except (ValueError, RecursionError) as exc:
            return f"the body is not JSON that Python can decode: {exc}"
        try:
            verdict = self.check(data)
        except Exception as exc:    # a rejection; BaseException cancels the call
            return str(exc) or type(exc).__name__
        if verdict is False:
            return "validate returned False"
        self.body = body
        self.data = data
        self.parsed = verdict if isinstance(self.check, ModelCheck) else None
        return None

    def data_for(self, body: bytes) -> Any:
        if body is self.body or body == self.body:
            return self.data
        return _parse_json(body)

    def result(self, body: bytes, meta: "Meta") -> "Result":
        """The Result of an accepted body (with response_model, its instance:
        the one accepted, or for a batch's shared validator validated again)."""
        data = self.data_for(body)
        res = Result(data, meta)
        if isinstance(self.check, ModelCheck):
            same = body is self.body or body == self.body
            res._parsed = self.parsed if same else self.check(data)
        return res


# ---------------------------------------------------------------------------
# The client

# Live clients, so a forked child can drop its parent's engines.
_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
# A parent's engines, kept referenced in a forked child: freeing one there
# could wait on a lock some parent thread held at fork time.
_parent_engines: List[Any] = []


class Client:
    """An engine (I/O thread, connection cache) and a set of call defaults.

    ``defaults`` are any :func:`call_llm` keywords except ``body`` and
    ``client``; they are converted and checked here, once (an unknown name or
    a wrong type raises TypeError; value ranges are checked at the first
    call). ``max_in_flight`` caps the calls the engine runs at once;
    ``max_host_connections`` (0: no cap) the connections it opens to one
    host (calls past it wait for one: an HTTP/1.1 server needs one per call
    in flight, an HTTP/2 one shares each among many).

    ``shared`` says where each endpoint's rate budget, retry budget and
    circuit breaker live: ``None`` (the default, or the ``LLMRETRY_SHARED``
    environment variable when set) keeps them in this process; ``"shm:NAME"``
    shares them with every process on this host that names NAME (gunicorn
    workers, a multiprocessing pool, notebooks on one key);
    ``"redis://[:password@]host:port[/db]"`` with every process on every
    machine using that Redis. Their calls then pace against one limit, their
    retries count against one budget and one breaker opens for all
    (docs/shared.md). A Redis that is down or slow never fails a call: each
    process paces alone until it is back.

    ``policies`` are named policies (a mapping ``{name: {key: value}}`` or
    a ``.toml``/``.json`` file, see :func:`llmretry.load_policies`), checked
    here; a call picks one with ``policy="name"``. For one call, explicit
    arguments beat the policy, the policy beats these defaults, and these
    beat the built-in ones.

    Use it as a context manager, or call :meth:`close`, to stop its I/O
    thread. In a forked child a client makes itself a new engine on first
    use. A client is safe to share between threads.

    Example::

        with llmretry.Client(base_url="http://127.0.0.1:8080/v1",
                             timeout_ms=10000, max_retries=5) as client:
            data, meta = client.call_llm(body)
    """

    def __init__(self, *, max_in_flight: int = 256, max_host_connections: int = 0,
                 shared: Optional[str] = None,
                 policies: Optional[PolicySource] = None,
                 **defaults: Unpack[CallOptions]) -> None:
        _check_option_names(defaults, "Client()")
        max_in_flight = _int32("max_in_flight", max_in_flight)
        self._max_in_flight = max_in_flight
        self._max_host_connections = _int32("max_host_connections", max_host_connections)
        if shared is None:
            shared = os.environ.get("LLMRETRY_SHARED") or None
        if shared is not None and not isinstance(shared, str):
            raise TypeError(f"shared must be a str such as 'shm:NAME' or "
                            f"'redis://host:port' or None, not {type(shared).__name__}")
        self._shared = shared
        self._defaults: Dict[str, Any] = dict(defaults)
        self._plan = _BASE_PLAN.with_options(defaults.items())
        loaded = load_policies(policies) if policies is not None else {}
        self._policies: Dict[str, _PolicyPlan] = {
            name: _PolicyPlan(pol, self._plan) for name, pol in loaded.items()}
        self._lock = threading.Lock()
        self._closed = False
        self._engine: Any = _llmretry.Engine(max_in_flight, self._max_host_connections,
                                             shared)
        _live_clients.add(self)

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"],
                  **defaults: Unpack[CallOptions]) -> "Client":
        """A client with the policies of a ``.toml``/``.json`` file and these
        defaults (as :class:`Client`)."""
        return cls(policies=path, **defaults)

    @property
    def policies(self) -> Dict[str, Policy]:
        """The client's policies by name."""
        return {name: pp.policy for name, pp in self._policies.items()}

    def _policy_plan(self, name: Any) -> _PolicyPlan:
        """The named policy, or ValueError naming it and the known ones."""
        pp = self._policies.get(name) if isinstance(name, str) else None
        if pp is None:
            if not isinstance(name, str):
                raise TypeError(f"policy must be a str or None, not {_type_name(name)}")
            known = ", ".join(sorted(self._policies)) or "none"
            raise ValueError(f"unknown policy {name!r} (known policies: {known})")
        return pp

    def endpoint_stats(self) -> List[Dict[str, Any]]:
        """What the client's engine knows of each endpoint it has called
        (a URL and the key sent to it, never the key itself), one dict each:

        ``url``, ``has_key``; ``requests`` and ``retries`` sent so far;
        ``window_requests``, ``window_retries`` over the retry budget's
        rolling 10 s and ``retries_refused`` (calls that gave up as
        ``retry_budget_exhausted``); ``breaker`` (``"closed"``, ``"open"``,
        ``"half_open"``), ``consecutive_failures``, ``breaker_opened``
        (times), ``short_circuited`` (attempts failed as ``circuit_open``),
        ``open_ms_left``; ``rpm``, ``tpm`` in force (configured, else
        learned; 0: none) and ``in_flight``.
        """
        engine = self._engine
        return engine.endpoint_stats() if engine is not None else []

    # -- lifecycle ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def close(self) -> None:
        """Cancel the calls in flight and stop the I/O thread. Idempotent."""
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        _aio.forget(self)           # the channels of its event loops

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _reopen(self) -> Any:
        """The engine, made anew after a fork; RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this llmretry Client is closed")
            if self._engine is None:
                self._engine = _llmretry.Engine(self._max_in_flight,
                                                self._max_host_connections, self._shared)
            return self._engine

    def _forget_engine_after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._engine is not None:
            _parent_engines.append(self._engine)
            self._engine = None

    def __repr__(self) -> str:
        shown = {k: self._defaults.get(k, BUILTIN_DEFAULTS.get(k)) for k in _SHOWN_IN_REPR}
        parts = [f"{k}={v!r}" for k, v in shown.items()]
        parts.append("api_key=<set>" if self._defaults.get("api_key") else "api_key=<unset>")
        if self._shared:
            parts.append(f"shared={_shown_shared(self._shared)!r}")
        if self._closed:
            parts.append("closed")
        return f"Client({', '.join(parts)})"

    # -- calls ---------------------------------------------------------------

    def _run(self, body: Any, plan: _Plan) -> Result:
        """One call with a converted plan: the Result, or raise LLMError."""
        engine, payload, extra, validator = self._prepare(body, plan)
        out = engine.call(payload, as_result=True, **extra, **plan.kwargs)
        return _result_of(out, validator)

    def _prepare(self, body: Any, plan: _Plan) -> Tuple[Any, bytes, Dict[str, Any],
                                                        Optional["_Validator"]]:
        """What one call hands the engine: the engine, the encoded body, the
        keywords besides plan.kwargs (stream_usage for a dict that streams)
        and the validator."""
        payload, model = _encode_body(body)
        engine = self._engine
        if engine is None:
            engine = self._reopen()
        extra, validator = _call_extra(plan, model)
        if type(body) is dict and body.get("stream") is True:
            # A dict that streams: ask for its usage (the core adds
            # stream_options unless the body sets them) and assemble.
            extra["stream_usage"] = True
        if plan.kwargs.get("tpm"):
            # Under a token budget, tiktoken's count when the host has it.
            tokens = estimate_tokens(body)
            if tokens:
                extra["estimated_tokens"] = tokens
        return engine, payload, extra, validator

    def _plan_of(self, body: Any, policy: Optional[str], options: Mapping[str, Any],
                 where: str) -> Tuple[Any, _Plan]:
        """The body to send and the plan of a call given as keywords (the
        stream and asyncio functions): the named policy's settings under
        the explicit ones. ValueError/TypeError before any I/O."""
        if options:
            _check_option_names(options, where)
        if policy is None:
            return body, self._plan.with_call_options(options)
        pp = self._policy_plan(policy)
        plan = pp.plan.with_call_options(options)
        if pp.auto_key and options.get("idempotency_key", DEFAULT) is DEFAULT:
            plan = _with_auto_key(plan)
        return pp.body(body), plan

    def call_llm(self, body: Body, *, policy: Optional[str] = None,
                 **options: Unpack[CallOptions]) -> Result:
        """:func:`llmretry.call_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "call_llm()")
        return self._run(body, plan)

    def stream_llm(self, body: Body, *, policy: Optional[str] = None,
                   stream_buffer_bytes: int = DEFAULT,
                   **options: Unpack[CallOptions]) -> Stream:
        """:func:`llmretry.stream_llm` with this client's engine and defaults."""
        return _client_stream(self, body, policy, stream_buffer_bytes, options)

    def call_llm_with_deadline(self, body: Body, deadline_ms: int = 180000,
                               **options: Any) -> Result:
        """:meth:`call_llm` with a total deadline (default 180 s)."""
        return self.call_llm(body, deadline_ms=deadline_ms, **options)

    def call_many(self, bodies: Iterable[Body], limit: int = 8, *,
                  deadline_ms: Optional[int] = None,
                  call_deadline_ms: Optional[int] = DEFAULT,
                  failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                  resume: bool = False,
                  progress: Union[bool, Callable[[int, int, int], Any]] = False,
                  adaptive: bool = True,
                  on_result: Optional[Callable[[int, Any], Any]] = None,
                  policy: Optional[str] = None,
                  keep_results: bool = True,
                  **options: Unpack[BatchOptions]) -> BatchResult:
        """:func:`llmretry.call_many` with this client's engine and defaults."""
        job = self._many(bodies, limit, deadline_ms, call_deadline_ms, failures_path, resume,
                         progress, adaptive, on_result, policy, dict(options), "call_many()",
                         keep_results)
        return self._run_batch(*job)

    def _many(self, bodies: Iterable[Body], limit: int, deadline_ms: Optional[int],
              call_deadline_ms: Optional[int], failures_path: Any, resume: bool,
              progress: Any, adaptive: bool, on_result: Any, policy: Optional[str],
              options: Dict[str, Any], where: str,
              keep_results: bool = True) -> Tuple[Any, ...]:
        """call_many's arguments checked and converted (before any I/O): the
        arguments of _run_batch."""
        _check_option_names(options, where)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {_type_name(limit)}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1 (got {limit})")
        if limit > self._max_in_flight:
            # The engine's cap on calls at once (file descriptors, memory)
            # holds for batches too: say so rather than run fewer silently.
            warnings.warn(
                f"{where[:-2]}(limit={limit}) on a Client whose max_in_flight is "
                f"{self._max_in_flight}: at most {self._max_in_flight} calls run at once; "
                f"use Client(max_in_flight={min(limit, _INT32_MAX)}) (and pass client=) for more",
                RuntimeWarning, stacklevel=3)
        batch_deadline = _opt_int_option("deadline_ms", deadline_ms)
        if batch_deadline is not None and batch_deadline < 0:
            raise ValueError(f"deadline_ms must be >= 0 or None (got {batch_deadline})")
        adaptive = _bool("adaptive", adaptive)
        if call_deadline_ms is not DEFAULT:
            # Checked under its own name: "deadline_ms" is the batch's.
            if call_deadline_ms is not None:
                call_deadline_ms = _int_option("call_deadline_ms", call_deadline_ms)
                if call_deadline_ms < 0:
                    raise ValueError(f"call_deadline_ms must be >= 0 or None "
                                     f"(got {call_deadline_ms})")
            options["deadline_ms"] = call_deadline_ms
        items = _batch_items(bodies)
        logger = options.get("logger", self._defaults.get("logger", DEFAULT))
        if not isinstance(items, Iterator):
            # A list or tuple: every body encoded and checked before any call.
            plan, sent = self._batch_plan(policy, options, items)
            encoded: Any = _encode_bodies(sent)
            batch = _batch.Batch(items, failures_path=failures_path, resume=resume,
                                 progress=progress, on_result=on_result, logger=logger,
                                 parse_items=True, keep_results=keep_results)
        else:
            # Any other iterable: each item read, encoded and checked just
            # before it is submitted (_LazyEngineBatch).
            plan, prep = self._batch_prep(policy, options)
            encoded = _LazyBodies(items, prep)
            batch = _batch.Batch(None, failures_path=failures_path, resume=resume,
                                 progress=progress, on_result=on_result, logger=logger,
                                 parse_items=True, keep_results=keep_results,
                                 n=len(bodies) if isinstance(bodies, Sized) else None)
        return batch, encoded, plan, limit, batch_deadline, adaptive

    def _batch_prep(self, policy: Any,
                    options: Dict[str, Any]) -> Tuple[_Plan, Callable[[Any], Any]]:
        """_batch_plan for a batch read lazily: the plan, and what makes
        each item the body sent."""
        if policy is None:
            plan = self._plan.with_options(options.items()) if options else self._plan
            _check_batch_options(plan.kwargs)
            responses = _responses_api(plan.kwargs)
            return plan, lambda body: _with_stream_usage_one(body, responses)
        pp = self._policy_plan(policy)
        plan = pp.plan.with_options(options.items()) if options else pp.plan
        if pp.auto_key and "idempotency_key" not in options:
            plan = _Plan(plan.kwargs, plan.validate, plan.event_mask, auto_key=True)
        _check_batch_options(plan.kwargs)
        responses = _responses_api(plan.kwargs)
        if pp.model is None:
            return plan, lambda body: _with_stream_usage_one(body, responses)
        return plan, lambda body: _with_stream_usage_one(pp.body(body), responses)

    def _batch_plan(self, policy: Any, options: Dict[str, Any],
                    items: Sequence[Any]) -> Tuple[_Plan, Sequence[Any]]:
        """The plan of a batch's calls and the bodies to send (the policy's
        model filled in, streaming dicts asking for usage); ValueError for an
        unknown policy."""
        if policy is None:
            plan = self._plan.with_options(options.items()) if options else self._plan
            _check_batch_options(plan.kwargs)
            return plan, _with_stream_usage(items, _responses_api(plan.kwargs))
        pp = self._policy_plan(policy)
        plan = pp.plan.with_options(options.items()) if options else pp.plan
        if pp.auto_key and "idempotency_key" not in options:
            plan = _Plan(plan.kwargs, plan.validate, plan.event_mask, auto_key=True)
        if pp.model is not None:
            items = [pp.body(body) for body in items]
        _check_batch_options(plan.kwargs)
        return plan, _with_stream_usage(items, _responses_api(plan.kwargs))

    def _run_batch(self, batch: "_batch.Batch",
                   encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                   plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool,
                   already_ok: Optional[Any] = None,
                   invalid: Optional[Mapping[int, BaseException]] = None) -> BatchResult:
        """Run ``batch`` (its bodies already encoded) as one engine group.

        Every request runs on the engine thread; this thread only waits,
        delivers events and builds the results, item by item, for the
        batch's record (``already_ok``: indices not to run, ``invalid``:
        items failed without being sent, both as Batch.open).
        Ctrl-C raises BatchInterrupted, holding what finished. ``encoded``
        is a _LazyBodies for a lazy batch (``invalid`` then goes there).
        """
        try:
            return self._run_batch_inner(batch, encoded, plan, limit, deadline_ms, adaptive,
                                         already_ok, invalid)
        except KeyboardInterrupt as exc:
            raise _batch.interrupted(batch, exc) from None

    def _run_batch_inner(self, batch: "_batch.Batch",
                         encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                         plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool,
                         already_ok: Optional[Any],
                         invalid: Optional[Mapping[int, BaseException]]) -> BatchResult:
        with batch:
            if isinstance(encoded, _LazyBodies):
                encoded.invalid = invalid
                invalid = None
            batch.open(already_ok, invalid)
            if batch.lazy or batch.runnable:
                job = _engine_job(self, batch, encoded, plan, limit, deadline_ms, adaptive)
                try:
                    job.engine.call_many(*job.args, **job.kwargs)
                finally:
                    job.finish()
        return batch.result()

    # -- asyncio (see llmretry._aio) --------------------------------------------

    async def acall_llm(self, body: Body, *, policy: Optional[str] = None,
                        **options: Unpack[CallOptions]) -> Result:
        """:func:`llmretry.acall_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "acall_llm()")
        engine, payload, extra, validator = self._prepare(body, plan)
        return await _aio.acall(self, engine, payload, extra, plan.kwargs,
                                lambda out: _result_of(out, validator))

    def astream_llm(self, body: Body, *, policy: Optional[str] = None,
                    stream_buffer_bytes: int = DEFAULT,
                    **options: Unpack[CallOptions]) -> "_aio.AsyncStream":
        """:func:`llmretry.astream_llm` with this client's engine and defaults."""
        body, plan = self._plan_of(body, policy, options, "astream_llm()")
        engine, payload, extra, validator = _stream_call(self, body, plan, stream_buffer_bytes)
        return _aio.astream(self, engine, payload, extra, plan.kwargs,
                            lambda out: _result_of(out, validator), _parse_json)

    async def acall_many(self, bodies: Iterable[Body], limit: int = 8, *,
                         deadline_ms: Optional[int] = None,
                         call_deadline_ms: Optional[int] = DEFAULT,
                         failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                         resume: bool = False,
                         progress: Union[bool, Callable[[int, int, int], Any]] = False,
                         adaptive: bool = True,
                         on_result: Optional[Callable[[int, Any], Any]] = None,
                         policy: Optional[str] = None,
                         keep_results: bool = True,
                         **options: Unpack[BatchOptions]) -> BatchResult:
        """:func:`llmretry.acall_many` with this client's engine and defaults."""
        batch, encoded, plan, limit, batch_deadline, adaptive = self._many(
            bodies, limit, deadline_ms, call_deadline_ms, failures_path, resume, progress,
            adaptive, on_result, policy, dict(options), "acall_many()", keep_results)
        try:
            with batch:
                batch.open()
                if batch.lazy or batch.runnable:
                    job = _engine_job(self, batch, encoded, plan, limit, batch_deadline,
                                      adaptive)
                    try:
                        await _aio.amany(job)
                    finally:
                        job.finish()
            result: BatchResult = batch.result()
            return result
        except KeyboardInterrupt as exc:
            raise _batch.interrupted(batch, exc) from None

    async def amap_with_concurrency(self, items: Iterable[T], limit: int,
                                    worker: Callable[[T, int], Awaitable[R]], *,
                                    return_exceptions: bool = False,
                                    deadline_ms: Optional[int] = None,
                                    failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                                    resume: bool = False,
                                    progress: Union[bool, Callable[[int, int, int], Any]] = False,
                                    adaptive: bool = True,
                                    on_result: Optional[Callable[[int, Any], Any]] = None,
                                    logger: Any = DEFAULT) -> BatchResult:
        """:func:`llmretry.amap_with_concurrency`; the batch summary goes to
        this client's default logger unless ``logger`` says otherwise."""
        if logger is DEFAULT:
            logger = self._defaults.get("logger", DEFAULT)
        return await _aio.amap_with_concurrency(
            items, limit, worker, return_exceptions=return_exceptions, deadline_ms=deadline_ms,
            failures_path=failures_path, resume=resume, progress=progress, adaptive=adaptive,
            on_result=on_result, logger=logger)

    def map_with_concurrency(self, items: Iterable[T], limit: int,
                             worker: Callable[[T, int], R], *,
                             return_exceptions: bool = False,
                             deadline_ms: Optional[int] = None,
                             failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                             resume: bool = False,
                             progress: Union[bool, Callable[[int, int, int], Any]] = False,
                             adaptive: bool = True,
                             on_result: Optional[Callable[[int, Any], Any]] = None,
                             logger: Any = DEFAULT) -> BatchResult:
        """:func:`llmretry.map_with_concurrency` (the pool is the same); the
        batch summary goes to this client's default logger unless ``logger``
        says otherwise."""
        if logger is DEFAULT:
            logger = self._defaults.get("logger", DEFAULT)
        return _map_with_concurrency(items, limit, worker,
                                     return_exceptions=return_exceptions,
                                     deadline_ms=deadline_ms, failures_path=failures_path,
                                     resume=resume, progress=progress, adaptive=adaptive,
                                     on_result=on_result, logger=logger)


class _EngineBatch:
    """One batch's run on the engine: the arguments of Engine.call_many (or
    Engine.batch, its asyncio form) for the items still to run, and the
    batch record's side of each item as it finishes.

    Every request runs on the engine thread; the host thread only waits,
    delivers events and builds the results, item by item, for the batch's
    record."""

    __slots__ = ("engine", "args", "kwargs", "batch", "_each", "_values", "_stats",
                 "_validator")

    def __init__(self, client: "Client", batch: "_batch.Batch",
                 encoded: Sequence[Tuple[bytes, Optional[str]]], plan: _Plan,
                 limit: int, deadline_ms: Optional[int], adaptive: bool) -> None:
        to_run = batch.runnable
        keep = batch.results is not None
        self.engine = client._engine if client._engine is not None else client._reopen()
        self.batch = batch
        extra: Dict[str, Any] = {}
        if plan.event_mask is not None:
            extra["event_mask"] = plan.event_mask()
        validator = None
        if plan.validate is not None:
            validator = extra["validate"] = _Validator(plan.validate)
        if plan.auto_key:
            extra["idempotency_keys"] = [new_idempotency_key() for _ in to_run]
        items = batch.items
        if plan.kwargs.get("tpm") and items is not None:
            # Under a token budget, tiktoken's count per item when the host
            # has it (0: the core estimates).
            tokens = [estimate_tokens(items[i]) for i in to_run]
            if any(tokens):
                extra["estimated_tokens"] = tokens
        self._validator = validator

        # The engine makes each success a Result; what it hands back as an
        # outcome dict (a failure, a body Python cannot parse, a validator's
        # verdict to apply) becomes a value here.
        def item_done(k: int, value: Any) -> None:
            failed = not_started = False
            if type(value) is dict:
                value, failed, not_started = _batch_value(value, validator)
            batch.item_done(to_run[k], value, failed, not_started=not_started)

        # Items are watched one by one only when something wants each one
        # as it finishes (a record, progress, on_result); otherwise the
        # values are recorded once the run ends.
        self._each = batch.needs_each_item()
        self._values: Optional[List[Any]] = [None] * len(to_run) if keep else None
        self._stats: Dict[str, int] = {}
        self.args = ([encoded[i][0] for i in to_run],)
        # The extension reads limit as a C int: a larger one means the same
        # (no batch has 2**31 calls in flight).
        self.kwargs = dict(models=[encoded[i][1] for i in to_run],
                           limit=min(limit, _INT32_MAX), batch_deadline_ms=deadline_ms,
                           adaptive=adaptive, on_result=item_done if self._each else None,
                           results=self._values, keep_results=keep, stats=self._stats,
                           as_result=True, **extra, **plan.kwargs)

    def finish(self) -> None:
        """After the run (also when it raised): the totals and, unless each
        item was recorded as it finished, every value."""
        self.batch.add_totals(self._stats)
        if not self._each:
            assert self._values is not None
            validator = self._validator
            self.batch.record_values(self._values, lambda out: _batch_value(out, validator))


class _LazyEngineBatch:
    """_EngineBatch for a batch read lazily: the engine pulls (index, body,
    model, key) from a generator as its pacer wants more (at most its
    submit-ahead window, 4 * limit + 64, unfinished at once), each item
    encoded just then; an item is held (for the failures file) only while
    it is in flight."""

    __slots__ = ("engine", "args", "kwargs", "batch", "_stats")

    def __init__(self, client: "Client", batch: "_batch.Batch", source: _LazyBodies,
                 plan: _Plan, limit: int, deadline_ms: Optional[int], adaptive: bool) -> None:
        self.engine = client._engine if client._engine is not None else client._reopen()
        self.batch = batch
        extra: Dict[str, Any] = {}
        if plan.event_mask is not None:
            extra["event_mask"] = plan.event_mask()
        validator = None
        if plan.validate is not None:
            validator = extra["validate"] = _Validator(plan.validate)
        auto_key, prep, invalid = plan.auto_key, source.prep, source.invalid
        # index -> item while in flight, for its failures-file line.
        in_flight: Dict[int, Any] = {}
        keep_items = batch.journal is not None

        count_tokens = bool(plan.kwargs.get("tpm"))

        def feed() -> Iterator[Tuple[int, bytes, Optional[str], Optional[str], int]]:
            for i, item in enumerate(source.items):
                if not batch.wants(i):
                    continue
                if invalid and i in invalid:
                    batch.item_done(i, invalid[i], True, item=item)
                    continue
                try:
                    body = prep(item)
                    payload, model = _encode_body(body)
                except (TypeError, ValueError) as exc:
                    kind = TypeError if isinstance(exc, TypeError) else ValueError
                    raise kind(f"bodies[{i}]: {exc}") from None
                if keep_items:
                    in_flight[i] = item
                yield (i, payload, model, new_idempotency_key() if auto_key else None,
                       estimate_tokens(body) if count_tokens else 0)

        def item_done(i: int, value: Any) -> None:
            failed = not_started = False
            if type(value) is dict:
                value, failed, not_started = _batch_value(value, validator)
            batch.item_done(i, value, failed, not_started=not_started,
                            item=in_flight.pop(i, None))

        self._stats: Dict[str, int] = {}
        self.args = (feed(),)
        self.kwargs = dict(limit=min(limit, _INT32_MAX), batch_deadline_ms=deadline_ms,
                           adaptive=adaptive, on_result=item_done, keep_results=False,
                           stats=self._stats, as_result=True, **extra, **plan.kwargs)

    def finish(self) -> None:
        """After the run (also when it raised): the totals."""
        self.batch.add_totals(self._stats)


def _engine_job(client: "Client", batch: "_batch.Batch",
                encoded: Union[Sequence[Tuple[bytes, Optional[str]]], _LazyBodies],
                plan: _Plan, limit: int, deadline_ms: Optional[int],
                adaptive: bool) -> Union[_EngineBatch, _LazyEngineBatch]:
    """The engine run of a batch, lazy or not."""
    if isinstance(encoded, _LazyBodies):
        return _LazyEngineBatch(client, batch, encoded, plan, limit, deadline_ms, adaptive)
    return _EngineBatch(client, batch, encoded, plan, limit, deadline_ms, adaptive)


def _asks_stream_usage(body: Any) -> bool:
    return (type(body) is dict and body.get("stream") is True
            and "stream_options" not in body)


def _responses_url(url: Optional[str]) -> bool:
    """Is url the Responses API's (its path ends with /responses)? There
    stream_options is not a field (the core's rule: lr_stream_with_usage)."""
    if not url:
        return False
    path = url.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    return path.rstrip("/").lower().endswith("/responses")


def _responses_api(kwargs: Mapping[str, Any]) -> bool:
    """Do calls with these engine keywords go to the Responses API (a url
    ending with /responses, else endpoint="responses": url wins)?"""
    url = kwargs.get("url")
    return _responses_url(url) if url else kwargs.get("endpoint") == "responses"


def _with_stream_usage(items: Sequence[Any], responses: bool = False) -> Sequence[Any]:
    """The batch's bodies, each dict that streams asking for its usage
    (unless they go to the Responses API).

    One call does it with the core's stream_usage (_run); a batch's options
    are shared by all its items, and its str/bytes bodies are the caller's
    own text, so here it is done per item, in the dict: the same bytes the
    core would insert. The caller's dicts are not changed (copies)."""
    if responses or not any(_asks_stream_usage(b) for b in items):
        return items
    return [dict(b, stream_options={"include_usage": True}) if _asks_stream_usage(b) else b
            for b in items]


def _batch_value(out: Dict[str, Any],
                 validator: Optional[_Validator]) -> Tuple[Any, bool, bool]:
    """A call_many outcome dict as (value, failed, not_started)."""
    value = _value_of(out, validator)
    failed = not isinstance(value, Result)
    return value, failed, (failed and out.get("attempts") == 0
                           and out.get("kind") == "deadline_exceeded")


def _value_of(out: Dict[str, Any], validator: Optional[_Validator]) -> Union[Result, LLMError]:
    """A batch item's Result, or its LLMError (failures are not raised)."""
    if not out["ok"]:
        return error_from_outcome(out)
    try:
        if validator is not None:
            return validator.result(out["body"], _meta_of(out))
        data = _parse_json(out["body"])
    except (ValueError, RecursionError) as exc:
        return _unparsable(out, exc)
    return Result(data, _meta_of(out))


# ---------------------------------------------------------------------------
# The default client and the module-level functions

_default_client: Optional[Client] = None
_default_lock = threading.Lock()


def _get_default_client() -> Client:
    global _default_client
    with _default_lock:
        if _default_client is None or _default_client.closed:
            _default_client = Client()
        return _default_client


def _client_or_default(client: Any) -> Client:
    if client is None:
        return _default_client or _get_default_client()
    if isinstance(client, Client):
        return client
    raise TypeError(f"client must be a llmretry.Client or None, not {_type_name(client)}")


@_needs_body
def call_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
             **options: Unpack[CallOptions]) -> Result:
    """Call an OpenAI-compatible chat endpoint under the retry policy.

    ``body`` is a dict (sent as compact UTF-8 JSON; its ``"model"`` names the
    call's model in events) or a str/bytes of JSON sent as is. Returns a
    :class:`Result` (``data, meta = result``) or raises an
    :class:`~llmretry.LLMError` subclass once the policy gives up. Wrong
    arguments raise TypeError/ValueError naming them, before any I/O.

    Keywords left out take ``client``'s defaults (the default client has
    none), else these:

    * ``base_url``: else ``$OPENAI_BASE_URL``, else
      ``https://api.openai.com/v1``; ``/`` + the endpoint is appended:
      ``endpoint="chat/completions"``, or ``"completions"``, ``"embeddings"``,
      ``"responses"``. ``url``: the full endpoint URL instead.
    * ``api_key``: else ``$OPENAI_API_KEY``, else no ``Authorization``.
    * ``timeout_ms=60000`` per attempt; ``deadline_ms=None`` for the whole
      call, waits included.
    * ``max_retries=3``; ``base_delay_ms=800``, ``max_delay_ms=30000`` and
      ``jitter="additive"`` (or ``"full"``, ``"none"``) for the backoff.
    * ``retry_mode="safe"``; ``"unsafe"`` never retries a request that may
      have reached the server.
    * ``retry_statuses=None``: 408, 429 and 5xx but 501 and 505.
    * ``max_retry_after_ms=120000``: a longer server-requested wait ends
      the call.
    * ``retry_invalid_response=True``: retry 2xx bodies that are not a JSON
      object or that ``validate`` rejects.
    * ``max_response_bytes=33554432`` (32 MiB).
    * ``headers``: extra ``{name: value}`` request headers.
    * ``request_id`` (else a UUID v4) and ``idempotency_key``.
    * ``ca_file``: the CA bundle to verify servers with instead of
      libcurl's default bundle (TLS is always verified; a verification
      failure is not retried).
    * ``idle_timeout_ms=30000``: for a streaming body (``"stream": True``),
      the longest gap between two chunks; ``timeout_ms`` then bounds the
      wait for the first one. The result is the assembled chat.completion.
    * ``rpm=0`` and ``tpm=0`` (0: none): client-side rate limits of the
      endpoint (``base_url`` + key), shared by every call, batch and loop
      of the client: at most that many requests and tokens a minute, paced
      evenly; a call's tokens are estimated from its body (prompt
      characters / 4 plus ``max_tokens``) and corrected by the usage.
      Without them the server's ``x-ratelimit-*`` headers pace, and a 429
      naming a wait pauses every call to the endpoint. A call waiting for
      budget still fails at its deadline.
    * ``retry_budget_ratio=0.2``, ``retry_budget_min=10``: the endpoint's
      retry budget: over a rolling 10 s its retries may be at most ratio x
      its requests + min (retries the server timed with Retry-After are
      free); past it a call gives up at once (``retry_budget_exhausted``).
    * ``breaker_failures=0`` (off), ``breaker_cooldown_ms=30000``: the
      endpoint's circuit breaker: that many transient failures in a row
      open it; meanwhile calls fail at once with
      :class:`~llmretry.CircuitOpenError` (nothing sent) or go to their
      fallback; after the cooldown one probe goes, and its success closes it.
    * ``fallbacks``: a list of targets ``{"model", "base_url" or "url",
      "api_key" or "api_key_env", "headers"}`` tried in order when the
      current one gives up (not after a cancel, the deadline, or a 400/422),
      within the same ``deadline_ms``. A target without a URL is the same
      endpoint with another model; one with a URL sends only its own key
      and headers. ``meta.target`` says which answered (0: the primary).
    * ``schema``: a JSON Schema (dict or JSON text) every answer must
      match: each choice's message content, read with :func:`extract_json`,
      is validated by the core (docs/structured-outputs.md). A body with
      ``response_format`` ``json_schema`` is held to its own schema without
      it. A mismatch is ``invalid_response`` (retried) with the errors in
      ``validation_errors``; a ``message.refusal`` raises
      :class:`~llmretry.RefusalError`, not retried.
    * ``repair=False``: True makes a retry after an answer that failed the
      schema (or ``validate``) send the body with the failed answer and one
      user message naming its errors appended (as instructor does).
    * ``response_model``: a pydantic v2 model: its strict schema
      (:func:`~llmretry.strict_schema`) is the call's ``schema``, pydantic
      validates each answer (a rejection is retried like a mismatch), and the
      instance is ``result.parsed``. Not with ``validate``.
    * ``validate(data)``: raising an Exception or returning False rejects
      a response (``invalid_response``).
    * ``logger``: the ``"llmretry"`` logger; None for no events; a
      ``logging.Logger``/``LoggerAdapter``; or a callable given each event.
    * ``policy``: the name of one of ``client``'s policies; its settings
      apply where these keywords are left out (then the client's defaults,
      then the built-in ones). Its name is in every event. An unknown name
      raises ValueError before any I/O.

    Example::

        data, meta = llmretry.call_llm(
            {"model": "gpt-4.1-mini",
             "messages": [{"role": "user", "content": "Say hi"}]},
            timeout_ms=20000, deadline_ms=60000)
        print(data["choices"][0]["message"]["content"], meta.usage)
    """
    return _client_or_default(client).call_llm(body, policy=policy, **options)


@_needs_body
def call_llm_with_deadline(body: Body, deadline_ms: int = 180000,
                           **options: Any) -> Result:
    """:func:`call_llm` with a total deadline (default 180 s) for all attempts."""
    return call_llm(body, deadline_ms=deadline_ms, **options)


def call_many(bodies: Iterable[Body], limit: int = 8, *,
              deadline_ms: Optional[int] = None,
              call_deadline_ms: Optional[int] = DEFAULT,
              failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
              resume: bool = False,
              progress: Union[bool, Callable[[int, int, int], Any]] = False,
              adaptive: bool = True,
              on_result: Optional[Callable[[int, Any], Any]] = None,
              client: Optional[Client] = None,
              policy: Optional[str] = None,
              keep_results: bool = True,
              **options: Unpack[BatchOptions]) -> BatchResult:
    """One call per body, as one batch on the engine thread; in input order.

    Every request runs on the engine's I/O thread; the calling thread only
    waits (GIL released), delivers events and builds the results. Returns a
    :class:`~llmretry.BatchResult`: a list holding, for each body, its
    :class:`Result` or, when it failed, its :class:`~llmretry.LLMError`
    (failures are returned in place, never raised), with ``.summary``.
    Wrong arguments raise before any call starts; so do bad bodies when
    ``bodies`` is a list or tuple (every body is encoded first).

    ``bodies`` may be any iterable: anything but a list or tuple (a
    generator over a file) is read lazily, each item encoded just before it
    is submitted, so only the items in flight are held (at most
    ``4 * limit + 64`` read and not finished); a body that cannot be sent
    then raises TypeError or ValueError naming ``bodies[i]`` when it is
    reached, the items before it having run (and being in the failures
    file: fix it and ``resume``). ``keep_results=False`` keeps no values:
    each goes only to ``on_result`` (and the failures file), and the
    BatchResult returned (or a BatchInterrupted's ``partial``) is an empty
    list with its ``.summary``. A generator with ``on_result`` and
    ``keep_results=False`` runs in memory that does not grow with the
    batch. ``resume`` reads the same iterable again from its start: the
    items an earlier run completed are skipped as they are read.

    ``options`` are :func:`call_llm` keywords, applied to every call
    (except ``request_id`` and ``idempotency_key``); ``policy`` names one of
    ``client``'s policies for every call (with ``idempotency_key = "auto"``
    each item gets its own key, the same on all its attempts). The batch
    policy:

    * ``limit``: at most this many calls in flight. A 429 whose wait the
      server names (``Retry-After``, ``x-ratelimit-reset-*``) pauses every
      new start of the batch for that long, not just that item's retry;
      with ``adaptive`` (the default) the number in flight halves on a
      burst of 429s and grows back by one per window-full of successes,
      never above ``limit``.
    * ``deadline_ms``: a budget for the *whole batch*. Items not started in
      time fail with :class:`~llmretry.DeadlineExceededError` (0 attempts);
      running calls get the smaller of their own deadline and the time
      left. A deadline for each call is ``call_deadline_ms``.
    * ``failures_path``: each failed item is appended to this file as one
      JSON line ``{"index", "item", "error": {"kind", "status", "message",
      "request_id", "attempts"}}`` the moment it fails, and the index of
      each success to ``failures_path + ".done"``.
    * ``resume=True`` (needs ``failures_path``): run only the items an
      earlier run of the same bodies did not complete (the failed ones and
      those never run, e.g. after Ctrl-C); the others are not called again
      and their slots hold :data:`~llmretry.SKIPPED`. Keep the earlier
      results yourself (``on_result``); the record says which items
      succeeded, not what they returned.
    * ``progress``: True shows a bar (``tqdm.auto`` when tqdm is installed:
      a widget in Jupyter, text on stderr elsewhere; else a plain line on
      stderr), closed before the summary is logged; a callable gets ``(done, total, failed)`` after each item
      (``total`` None for an iterable of unknown length read lazily).
    * ``on_result(index, value)`` is called on this thread as each item
      finishes (value: its Result or its exception), before it is recorded;
      an exception from it stops the batch and propagates.

    The summary (items ok and failed, attempts, retries, tokens, elapsed)
    is ``result.summary`` and is emitted as an ``llm_batch_summary`` event
    to ``logger``. Ctrl-C cancels the calls in flight and raises
    :class:`BatchInterrupted` (a ``KeyboardInterrupt``) whose ``partial``
    is the BatchResult of what finished; the failures file then lists every
    item that failed before it, and ``resume`` runs the rest.

    Example::

        out = llmretry.call_many(bodies, limit=4, deadline_ms=600000,
                                 failures_path="failed.jsonl", resume=True,
                                 progress=True)
        for i, res in enumerate(out):
            if isinstance(res, llmretry.Result):
                save(i, res.data)
        print(out.summary.total_tokens, "tokens")
    """
    return _client_or_default(client).call_many(
        bodies, limit, deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
        failures_path=failures_path, resume=resume, progress=progress, adaptive=adaptive,
        on_result=on_result, policy=policy, keep_results=keep_results, **options)


# ---------------------------------------------------------------------------
# Process lifecycle: a forked child makes its own engines; exit closes them.

def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for client in list(_live_clients):
        client._forget_engine_after_fork()


def _close_all_at_exit() -> None:
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:   # exiting anyway: never mask the exit status
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)


# ---------------------------------------------------------------------------
# Streaming

def _stream_body(body: Any) -> Any:
    """A dict body with ``"stream": True`` (a copy when it said otherwise);
    str and bytes bodies are sent as they are."""
    if isinstance(body, dict) and body.get("stream") is not True:
        return dict(body, stream=True)
    return body


def _stream_call(client: "Client", body: Any, plan: _Plan, stream_buffer_bytes: Any
                 ) -> Tuple[Any, bytes, Dict[str, Any], Optional["_Validator"]]:
    """Client._prepare for a stream: the body made to stream, its buffer."""
    body = _stream_body(body)
    engine, payload, extra, validator = client._prepare(body, plan)
    if isinstance(body, dict):
        extra["stream_usage"] = True    # a dict: the core asks for its usage
    if stream_buffer_bytes is not DEFAULT:
        extra["stream_buffer_bytes"] = _int("stream_buffer_bytes", stream_buffer_bytes)
    return engine, payload, extra, validator


def _start_stream(client: "Client", body: Any, plan: _Plan,
                  stream_buffer_bytes: Any) -> Stream:
    engine, payload, extra, validator = _stream_call(client, body, plan, stream_buffer_bytes)
    raw = engine.stream(payload, as_result=True, **extra, **plan.kwargs)
    return Stream(raw, lambda out: _result_of(out, validator), _parse_json)


def _client_stream(client: "Client", body: Any, policy: Optional[str],
                   stream_buffer_bytes: Any, options: Mapping[str, Any]) -> Stream:
    body, plan = client._plan_of(body, policy, options, "stream_llm()")
    return _start_stream(client, body, plan, stream_buffer_bytes)


@_needs_body
def stream_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
               stream_buffer_bytes: int = DEFAULT, **options: Unpack[CallOptions]) -> Stream:
    """Start a streaming call and return its :class:`Stream` (a context
    manager; the call runs from here on, chunks waiting for you to read).

    ``body`` as for :func:`call_llm`; a dict gets ``"stream": True`` (and
    the core asks for ``stream_options.include_usage`` unless it sets
    ``stream_options``). ``options`` are :func:`call_llm`'s keywords;
    ``timeout_ms`` bounds the wait for the first chunk, ``idle_timeout_ms``
    (default 30000) each gap between two, ``deadline_ms`` the whole call;
    ``stream_buffer_bytes`` (default 1 MiB) of unread chunks pause the
    transfer until you read.

    Example::

        with llmretry.stream_llm(body, deadline_ms=120000) as s:
            for text in s.text_deltas():
                print(text, end="", flush=True)
            data, meta = s.result()     # the assembled chat.completion
    """
    return _client_stream(_client_or_default(client), body, policy, stream_buffer_bytes,
                          options)


# ---------------------------------------------------------------------------
# asyncio, module level (the default client, or client=)

@_needs_body
async def acall_llm(body: Body, *, client: Optional[Client] = None,
                    policy: Optional[str] = None, **options: Unpack[CallOptions]) -> Result:
    """:func:`call_llm` for asyncio: ``await`` it on a running event loop.

    The same keywords, rules, Result and errors as :func:`call_llm`; no
    thread waits for it (the engine's I/O thread does the requests, this
    loop's thread reads their news through ``loop.add_reader``), so
    thousands can be awaited at once (``Client(max_in_flight=...)`` caps
    how many run). Loggers and validators run on the loop's thread.
    Cancelling the task (``task.cancel()``, ``asyncio.timeout``) cancels the
    call at once and raises ``CancelledError``.

    Example::

        async with asyncio.timeout(30):
            data, meta = await llmretry.acall_llm(body, max_retries=3)
    """
    return await _client_or_default(client).acall_llm(body, policy=policy, **options)


@_needs_body
def astream_llm(body: Body, *, client: Optional[Client] = None, policy: Optional[str] = None,
                stream_buffer_bytes: int = DEFAULT,
                **options: Unpack[CallOptions]) -> "_aio.AsyncStream":
    """:func:`stream_llm` for asyncio: an :class:`AsyncStream` to ``async
    with``, whose chunks come with ``async for`` (call it on a running loop).

    Example::

        async with llmretry.astream_llm(body) as s:
            async for text in s.text_deltas():
                print(text, end="", flush=True)
            data, meta = await s.result()
    """
    return _client_or_default(client).astream_llm(
        body, policy=policy, stream_buffer_bytes=stream_buffer_bytes, **options)


async def acall_many(bodies: Iterable[Body], limit: int = 8, *,
                     client: Optional[Client] = None,
                     deadline_ms: Optional[int] = None,
                     call_deadline_ms: Optional[int] = DEFAULT,
                     failures_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                     resume: bool = False,
                     progress: Union[bool, Callable[[int, int, int], Any]] = False,
                     adaptive: bool = True,
                     on_result: Optional[Callable[[int, Any], Any]] = None,
                     policy: Optional[str] = None,
                     keep_results: bool = True,
                     **options: Unpack[BatchOptions]) -> BatchResult:
    """:func:`call_many` for asyncio: the batch runs on the engine thread
    while the loop keeps running; ``on_result``, ``progress`` and the
    failures file are handled on the loop's thread as items finish.
    Cancelling the task cancels the calls in flight (the failures file then
    holds what finished; ``resume=True`` runs the rest).

    Example::

        out = await llmretry.acall_many(bodies, limit=16, progress=True,
                                        failures_path="failed.jsonl")
        print(out.summary.ok, "ok")
    """
    return await _client_or_default(client).acall_many(
        bodies, limit, deadline_ms=deadline_ms, call_deadline_ms=call_deadline_ms,
        failures_path=failures_path, resume=resume, progress=progress, adaptive=adaptive,
        on_result=on_result, policy=policy, keep_results=keep_results, **options)
