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
path for logs and telemetry), read through the table ``EVENT_FIELDS``;
the request and the result add what events do not hold (the request's
settings, the response id, the finish reasons). The mapping is documented in
docs/observability.md.

The parts: _otel_mapping (the table, endpoints, request and response
attributes), _otel_instruments (the tracer and instruments, what calls
alike share), _otel_context (the span's context in the request headers),
_otel_record (a call's record made a span and metrics), _otel_batch (a
batch's items), _otel_cli (the CLI's --otel) and this module (the hooks on
the call paths, instrument()).

No prompt, answer or response text is recorded unless ``capture_content``
is True; the API key and the ``Authorization`` header never are (nothing
here reads them). Needs ``opentelemetry-api`` (``pip install
'llmretry[otel]'``); importing ``llmretry`` does not import this module.
"""

from __future__ import annotations

import os
import threading
import weakref
from time import time_ns
from typing import Any, Callable, Dict, Optional, Tuple

from opentelemetry import context as otel_context

from . import _aio, _engine_batch, _streaming
from ._aio import AsyncStream
from ._client import Client
from ._http_transport import TransportCore
from ._otel_batch import _hook_engine_job
from ._otel_instruments import SCHEMA_URL, _Telemetry
from ._otel_mapping import EVENT_FIELDS, _targets_of
from ._otel_record import _Call, _Tee
from ._stream import Stream
from .errors import LLMError

__all__ = ["instrument", "uninstrument", "EVENT_FIELDS", "SCHEMA_URL"]


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


def _new_call(tel: _Telemetry, kwargs: Dict[str, Any], body: Any, stream: bool = False,
              end_on_final: bool = False, model: Optional[str] = None) -> _Call:
    """The record of a call starting now, under the current span."""
    return _Call(tel, _targets_of(kwargs), otel_context.get_current(), time_ns(), body,
                 model=model, stream=stream, end_on_final=end_on_final,
                 policy=kwargs.get("policy"))


def _wire(call: _Call, kwargs: Dict[str, Any]) -> Any:
    """Set a call's own engine keywords (``kwargs``, changed in place): its
    logger (the record's, then the caller's), its span started and its
    context in the headers. Returns the logger (its event_mask is the call's)."""
    tee = _Tee(call.on_event, kwargs.get("on_event"))
    kwargs["on_event"] = tee
    headers = call.start(kwargs.get("headers"))
    if headers is not None:
        kwargs["headers"] = headers
    return tee


def _started(plan: Any, call: _Call) -> Any:
    """``plan`` for ``call`` (a copy: this call's alone), wired by _wire."""
    new = plan.with_options(())
    new.auto_key = plan.auto_key
    new.event_mask = _wire(call, new.kwargs).event_mask
    return new


class _Ending:
    """``with _Ending(call):`` ends the call's record with the exception
    raised inside, if any (for sync and async calls alike). An argument
    refused before any I/O made no request: no span."""

    __slots__ = ("call",)

    def __init__(self, call: _Call) -> None:
        self.call = call

    def __enter__(self) -> _Call:
        return self.call

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> None:
        call = self.call
        if exc is not None and (isinstance(exc, LLMError) or call.attempts
                                or call.last.get("llmretry.reason")):
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


def _end_abandoned(stream: Any) -> None:
    """A stream closed: a stream left early ends its span with what its
    events said (read to its end, it ended with its result)."""
    finish = stream._finish
    if type(finish) is _Finish:
        finish.call.end()


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
        with _Ending(_new_call(tel, plan.kwargs, body)) as call:
            return call.finished(orig(self, body, _started(plan, call)))
    return _run


def _hook_acall(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_aio.acall: every acall_llm."""
    async def acall(client: Client, engine: Any, payload: bytes, extra: Dict[str, Any],
                    kwargs: Dict[str, Any], finish: Callable[[Any], Any]) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return await orig(client, engine, payload, extra, kwargs, finish)
        with _Ending(_new_call(tel, kwargs, payload, model=extra.get("model"))) as call:
            kwargs = dict(kwargs)
            extra = dict(extra, event_mask=_wire(call, kwargs).event_mask())
            return call.finished(await orig(client, engine, payload, extra, kwargs, finish))
    return acall


def _hook_start_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_streaming._start_stream: every stream_llm."""
    def _start_stream(client: Client, body: Any, plan: Any, stream_buffer_bytes: Any) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, body, plan, stream_buffer_bytes)
        call = _new_call(tel, plan.kwargs, body, stream=True)
        s = orig(client, body, _started(plan, call), stream_buffer_bytes)
        s._finish = _Finish(s._finish, call)
        return s
    return _start_stream


def _hook_astream(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_aio.astream: every astream_llm."""
    def astream(client: Client, engine: Any, payload: bytes, extra: Dict[str, Any],
                kwargs: Dict[str, Any], finish: Callable[[Any], Any],
                parse: Callable[[bytes], Any]) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, engine, payload, extra, kwargs, finish, parse)
        call = _new_call(tel, kwargs, payload, stream=True, model=extra.get("model"))
        kwargs = dict(kwargs)
        extra = dict(extra, event_mask=_wire(call, kwargs).event_mask())
        return orig(client, engine, payload, extra, kwargs, _Finish(finish, call), parse)
    return astream


def _hook_close(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Stream.close: see _end_abandoned."""
    def close(self: Any) -> None:
        try:
            orig(self)
        finally:
            _end_abandoned(self)
    return close


def _hook_aclose(orig: Callable[..., Any]) -> Callable[..., Any]:
    """AsyncStream.aclose: see _end_abandoned."""
    async def aclose(self: Any) -> None:
        try:
            await orig(self)
        finally:
            _end_abandoned(self)
    return aclose


# A transport's requests in flight -> their records (the outcome comes to
# TransportCore.done with the request).
_transport_lock = threading.Lock()
_transport_calls: "weakref.WeakKeyDictionary[Any, _Call]" = weakref.WeakKeyDictionary()


def _hook_call_of(orig: Callable[..., Any]) -> Callable[..., Any]:
    """TransportCore.call_of: llmretry.httpx's calls. The SDK reads the
    response; the record ends with the outcome (TransportCore.done)."""
    def call_of(self: TransportCore, request: Any, content: bytes) -> Any:
        call = orig(self, request, content)
        tel = _telemetry_of(self.client) if call is not None else None
        if tel is None:
            return call
        record = _new_call(tel, call.kwargs, content, end_on_final=True)
        call.kwargs["event_mask"] = _wire(record, call.kwargs).event_mask()
        with _transport_lock:
            _transport_calls[request] = record
        return call
    return call_of


def _hook_done(orig: Callable[..., Any]) -> Callable[..., Any]:
    """TransportCore.done: a transport's call has its outcome."""
    def done(self: TransportCore, request: Any, out: Any) -> Any:
        with _transport_lock:
            record = _transport_calls.pop(request, None)
        if record is not None:
            record.end_with_outcome(out)
        return orig(self, request, out)
    return done


_HOOKS: Tuple[Tuple[Any, str, Callable[[Any], Any]], ...] = (
    (Client, "_run", _hook_run),
    (_streaming, "_start_stream", _hook_start_stream),
    (_engine_batch, "_engine_job", lambda orig: _hook_engine_job(_telemetry_of, orig)),
    (_aio, "acall", _hook_acall),
    (_aio, "astream", _hook_astream),
    (Stream, "close", _hook_close),
    (AsyncStream, "aclose", _hook_aclose),
    (TransportCore, "call_of", _hook_call_of),
    (TransportCore, "done", _hook_done),
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
