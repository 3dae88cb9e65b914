"""Results: a successful call's :class:`Result` and :class:`Meta`, and how a
finished call's outcome becomes one (or its LLMError).

Successes are usually built in C (bindings/python/results.c, registered here
with ``_set_result_types``); the rest are built from the outcome's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Tuple,
                    Union)

from . import _batch, _llmretry
from ._models import ModelCheck
from ._options import Validate, _Plan
from .errors import LLMError, StreamInterruptedError, error_from_outcome


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


# A pickle names a class by its module, and these were written in _client.py
# (which imports them still): a Meta or Result pickled by one version of the
# package (a Ray or Dask worker, a file kept) must load in another.
Meta.__module__ = Result.__module__ = "llmretry._client"


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
    """A finished call's value (Engine.call's or Call.outcome's) as a
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
