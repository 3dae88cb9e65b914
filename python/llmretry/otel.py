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
attributes), _otel_record (a call's record made a span and metrics, the
instruments) and this module (the hooks on the call paths, instrument()).

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
from typing import Any, Callable, Dict, List, Optional, Tuple

from opentelemetry import context as otel_context

from . import _aio, _engine_batch, _llmretry, _streaming
from ._aio import AsyncStream
from ._bodies import _LazyBodies
from ._client import Client, Result
from ._http_transport import TransportCore
from ._logging import event_mask_of
from ._otel_mapping import EVENT_FIELDS, _targets_of
from ._otel_record import SCHEMA_URL, _Call, _Telemetry
from ._results import _value_of
from ._stream import Stream
from .errors import LLMError

__all__ = ["instrument", "uninstrument", "EVENT_FIELDS", "SCHEMA_URL"]


# ---------------------------------------------------------------------------
# A call's logger

def _bits(*names: str) -> int:
    return sum(1 << _llmretry.EVENT_NAMES.index(name) for name in names)


# The events telemetry asks the engine for (failures, retries, give-ups);
# a caller's logger adds those it keeps.
_NEEDED = _bits("llm_request_failed", "llm_request_error", "llm_retry_scheduled",
                "llm_request_gave_up")
_ALL = (1 << len(_llmretry.EVENT_NAMES)) - 1


def _tee(call_sink: Callable[[Dict[str, Any]], None], user: Any) -> Callable[[Dict[str, Any]], None]:
    """The logger a call gets: the telemetry's sink, then the caller's own
    logger (which keeps its own levels, and fails as it did: the engine
    reports it and goes on). The telemetry's errors go nowhere. Its
    ``event_mask`` asks for the events either of them wants."""
    def tee(ev: Dict[str, Any]) -> None:
        try:
            call_sink(ev)
        except Exception:   # telemetry must never break a call
            pass
        if user is not None:
            user(ev)

    user_mask = event_mask_of(user) if user is not None else None
    if user is None:
        tee.event_mask = lambda: _NEEDED        # type: ignore[attr-defined]
    elif user_mask is None:     # a plain callable gets every event
        tee.event_mask = lambda: _ALL           # type: ignore[attr-defined]
    else:
        tee.event_mask = lambda: _NEEDED | user_mask()     # type: ignore[attr-defined]
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


def _new_call(tel: _Telemetry, kwargs: Dict[str, Any], body: Any, stream: bool = False,
              end_on_final: bool = False) -> _Call:
    """The record of a call starting now, under the current span."""
    call = _Call(tel, _targets_of(kwargs), otel_context.get_current(), time_ns(), body,
                 end_on_final=end_on_final, policy=kwargs.get("policy"))
    if stream:
        call.request["gen_ai.request.stream"] = True
    return call


def _wire(call: _Call, kwargs: Dict[str, Any]) -> Any:
    """Set a call's own engine keywords (``kwargs``, changed in place): its
    logger (the record's, then the caller's), its span started and its
    context in the headers. Returns the logger (its event_mask is the call's)."""
    tee = _tee(call.on_event, kwargs.get("on_event"))
    kwargs["on_event"] = tee
    headers = call.start(kwargs.get("headers"))
    if headers is not None:
        kwargs["headers"] = headers
    return tee


def _with_sink(plan: Any, sink: Callable[[Dict[str, Any]], None]) -> Any:
    """``plan`` whose logger is ``sink`` followed by the plan's own."""
    new = plan.with_options([("logger", _tee(sink, plan.kwargs.get("on_event")))])
    new.auto_key = plan.auto_key
    return new


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
        with _Ending(_new_call(tel, kwargs, payload)) as call:
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
        call = _new_call(tel, kwargs, payload, stream=True)
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


class _Batch:
    """The records of a batch's items. Each item's span starts when the
    run submits it (Engine.call_many's ``item_headers``, on the batch's
    thread), and its requests carry the span's context; the item's events
    come tagged with its request id, its value with its number in the run
    and its request id."""

    __slots__ = ("tel", "targets", "policy", "parent", "start_ns", "items", "runnable",
                 "headers", "started", "calls")

    def __init__(self, tel: _Telemetry, kwargs: Dict[str, Any], items: Any,
                 runnable: Optional[List[int]]) -> None:
        self.tel = tel
        self.targets = _targets_of(kwargs)
        self.policy = kwargs.get("policy")
        self.parent = otel_context.get_current()
        self.start_ns = time_ns()
        # A list's bodies are read back by index; a lazy batch keeps none
        # (its memory stays flat): its spans lack the request's settings
        # (the model comes from the result or the events) and its input messages.
        self.items = items
        # A list's run submits its runnable items (those not done before a
        # resume), numbered from 0: the k-th is item runnable[k]. A lazy
        # batch's items come with their own indices.
        self.runnable = runnable
        self.headers = kwargs.get("headers")
        self.started: Dict[int, _Call] = {}     # number in the run -> record, in flight
        self.calls: Dict[Any, _Call] = {}       # request id -> an item's events so far

    def item_headers(self, k: int) -> Optional[List[str]]:
        """The run submits its ``k``-th item now: the item's record starts,
        and its requests carry the batch's headers plus its span's context
        (None: the batch's alone)."""
        try:
            index = self.runnable[k] if self.runnable is not None else k
            items = self.items
            body = items[index] if items is not None and 0 <= index < len(items) else None
            call = _Call(self.tel, self.targets, self.parent, time_ns(), body,
                         policy=self.policy)
            self.started[k] = call
            lines = call.start(self.headers)
        except Exception:   # telemetry must never break a batch
            return None
        return None if lines is self.headers else lines

    def on_event(self, ev: Dict[str, Any]) -> None:
        rid = ev.get("request_id")
        call = self.calls.get(rid)
        if call is None:
            call = self.calls[rid] = _Call(self.tel, self.targets, self.parent, None,
                                           policy=self.policy)
        call.on_event(ev)

    def on_result(self, then: Any) -> Callable[[int, Any], Any]:
        """The run's on_result (the engine's: the item's number in the run,
        its Result or outcome dict): the item's record ends, then ``then``
        (the run's own, if any) goes on. The batch records its items
        its own way (at the end, unless something wants each one)."""
        def on_result(k: int, value: Any) -> Any:
            try:
                self.item_done(k, value)
            except Exception:   # telemetry must never break a batch
                pass
            if then is not None:
                return then(k, value)
            return None
        return on_result

    def item_done(self, k: int, value: Any) -> None:
        call = self.started.pop(k, None)
        if type(value) is dict:
            # An outcome the batch makes its value of (a failure; a body
            # Python parses, or the validator accepted): the same here.
            value = _value_of(value, None)
        rid: Optional[str]
        if isinstance(value, Result):
            rid, total_ms = value.meta.request_id, value.meta.total_ms
        elif isinstance(value, LLMError):
            rid, total_ms = value.request_id, value.total_ms
        else:               # never sent (a bad input line)
            return
        events = self.calls.pop(rid, None) if self.calls else None
        if call is None:    # its start not seen (item_headers failed): no span yet
            call = events or _Call(self.tel, self.targets, self.parent, None,
                                   policy=self.policy)
            # The call's own clock: from its submission, waits for a slot included.
            call.start_ns = max(self.start_ns, time_ns() - int((total_ms or 0) * 1_000_000))
        elif events is not None:
            call.take_events(events)
        if isinstance(value, Result):
            call.end(result=value)
        else:
            call.end(error=value)

    def end_unfinished(self) -> None:
        """The batch is over: items it submitted that never finished (it
        was interrupted, or raised) end as cancelled."""
        started, self.started = self.started, {}
        for call in started.values():
            call.last.setdefault("error.type", "cancelled")
            call.end()


class _Job:
    """A batch's engine run (_engine_batch's) whose finish also ends the
    records of the items left unfinished."""

    __slots__ = ("engine", "args", "kwargs", "job", "records")

    def __init__(self, job: Any, records: _Batch) -> None:
        self.engine, self.args, self.kwargs = job.engine, job.args, job.kwargs
        self.job = job
        self.records = records

    def finish(self) -> None:
        try:
            self.job.finish()
        finally:
            self.records.end_unfinished()


def _hook_engine_job(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_engine_batch._engine_job: every batch run on the engine (call_many,
    acall_many, ``llmretry batch``): one record per item."""
    def _engine_job(client: Client, batch: Any, encoded: Any, plan: Any, limit: int,
                    deadline_ms: Any, adaptive: bool) -> Any:
        tel = _telemetry_of(client)
        if tel is None:
            return orig(client, batch, encoded, plan, limit, deadline_ms, adaptive)
        records = _Batch(tel, plan.kwargs, batch.items,
                         None if isinstance(encoded, _LazyBodies) else batch.runnable)
        job = orig(client, batch, encoded, _with_sink(plan, records.on_event), limit,
                   deadline_ms, adaptive)
        # Each item's start and end, from the engine's run itself: the
        # batch's own bookkeeping stays as it is (its values recorded at
        # the end when nothing else wants each one).
        job.kwargs["item_headers"] = records.item_headers
        job.kwargs["on_result"] = records.on_result(job.kwargs.get("on_result"))
        return _Job(job, records)
    return _engine_job


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
    (_engine_batch, "_engine_job", _hook_engine_job),
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
