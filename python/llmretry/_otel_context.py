"""llmretry.otel's trace context in a call's request headers: the lines
every attempt of a call sends so that a server that traces joins its spans
to the call's (by default W3C ``traceparent``).

The application's global propagator writes them. When it is the API's
default, W3C trace context (and baggage) and nothing else, the lines are
formatted here from the span's context instead, as that propagator writes
them: a batch sends one per item, and the propagator's path through the
context costs several times the formatting (test_otel_context.py checks
that both write the same headers). Any other propagator (B3, Jaeger, one
of the application's, a subclass of the defaults) is called as it is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from opentelemetry import propagate as otel_propagate
from opentelemetry import trace as otel_trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace import span as otel_span


_HEX2 = tuple(f"{i:02x}" for i in range(256))     # trace flags are one byte
# The empty trace state a context made without one holds (one object: told
# by identity, where `not state` is a Python call).
DEFAULT_TRACE_STATE = getattr(otel_span, "DEFAULT_TRACE_STATE", None)


def _tuple_layout() -> Any:
    """SpanContext when the API's is the tuple (trace_id, span_id,
    is_remote, trace_flags, trace_state, is_valid) its properties read
    (each a Python call: a span's context is read unpacked instead), else
    None (another layout: read by its properties)."""
    probe = SpanContext(3, 5, False, TraceFlags(1))
    try:
        if tuple(probe) == (probe.trace_id, probe.span_id, probe.is_remote, probe.trace_flags,
                            probe.trace_state, probe.is_valid) == (3, 5, False, 1,
                                                                   probe.trace_state, True):
            return SpanContext
    except Exception:
        pass
    return None


_TUPLE_CONTEXT = _tuple_layout()


def _w3c_parts(textmap: Any) -> Optional[Sequence[Any]]:
    """The propagators of ``textmap`` when it is the API's default (trace
    context, then baggage, of the API's own classes) or trace context
    alone; else None."""
    if type(textmap) is TraceContextTextMapPropagator:
        return (textmap,)
    if type(textmap) is not CompositePropagator:
        return None
    parts = getattr(textmap, "_propagators", None)
    if not isinstance(parts, (list, tuple)) or not parts:
        return None
    if type(parts[0]) is not TraceContextTextMapPropagator:
        return None
    if len(parts) == 1 or (len(parts) == 2 and type(parts[1]) is W3CBaggagePropagator):
        return parts
    return None


def _name(line: str) -> str:
    return line.split(":", 1)[0].strip().lower()


class _Propagation:
    """The header lines of the calls started under one parent context: the
    caller's own ``headers`` with each call's span context added (made once
    for a call, or for a whole batch).

    A span's lines are the global propagator's. With the API's default one
    they are formatted here: ``traceparent`` from the span's context (a
    span whose context has a ``tracestate`` goes through the propagator),
    ``baggage`` from the parent context's, written once (a span does not
    change the context's baggage). A batch's items (``shared``) under a
    parent span have its trace id: their line's start up to the span id is
    written once (``head``), and only each span id is formatted."""

    __slots__ = ("textmap", "parent", "headers", "fast", "base", "baggage", "extra", "head")

    def __init__(self, parent: Any, headers: Optional[List[str]], shared: bool = False) -> None:
        self.parent = parent
        self.headers = headers
        self.textmap = textmap = otel_propagate.get_global_textmap()
        parts = _w3c_parts(textmap)
        self.fast = parts is not None
        self.baggage: List[str] = []
        self.base: List[str] = []
        self.extra = False      # lines besides traceparent (base or baggage)
        # (the parent's trace id, its line's start); 0: never a valid span's.
        self.head = (0, "")
        if parts is None:
            return
        if len(parts) == 2:
            carrier: Dict[str, str] = {}
            parts[1].inject(carrier, parent)
            self.baggage = [f"{name}: {value}" for name, value in carrier.items()]
        replaced = {"traceparent"} | ({"baggage"} if self.baggage else set())
        self.base = [line for line in headers or () if _name(line) not in replaced]
        self.extra = bool(self.base or self.baggage)
        if shared:
            ctx = otel_trace.get_current_span(parent).get_span_context()
            if ctx.is_valid:
                self.head = (ctx.trace_id,
                             f"traceparent: 00-{ctx.trace_id.to_bytes(16, 'big').hex()}-")

    def lines(self, span: Any) -> Optional[List[str]]:
        """The request header lines of a call whose span is ``span``: the
        caller's with the span's context added (replacing the caller's
        lines of the same names), or None when nothing is added (the
        caller's headers as they are)."""
        if self.fast:
            ctx = span.get_span_context()
            if type(ctx) is _TUPLE_CONTEXT:
                trace_id, span_id, _remote, flags, state, valid = ctx
            else:
                trace_id, span_id, flags, state, valid = (ctx.trace_id, ctx.span_id,
                                                          ctx.trace_flags, ctx.trace_state,
                                                          ctx.is_valid)
            if valid:
                if state is DEFAULT_TRACE_STATE or not state:
                    # TraceContextTextMapPropagator.inject's header: its ids
                    # as 32 and 16 hex digits (what format(id, "032x") gives
                    # a valid one, and faster), its flags as 2.
                    known, head = self.head
                    if trace_id == known:       # a child of the batch's parent
                        line = f"{head}{span_id.to_bytes(8, 'big').hex()}-{_HEX2[flags]}"
                    else:
                        line = (f"traceparent: 00-{trace_id.to_bytes(16, 'big').hex()}-"
                                f"{span_id.to_bytes(8, 'big').hex()}-{_HEX2[flags]}")
                    if self.extra:
                        return [*self.base, line, *self.baggage]
                    return [line]
            elif ctx == INVALID_SPAN_CONTEXT and not self.baggage:
                return None     # the propagator adds nothing (a no-op tracer's span)
        carrier: Dict[str, str] = {}
        self.textmap.inject(carrier, otel_trace.set_span_in_context(span, self.parent))
        if not carrier:
            return None
        lines = [f"{name}: {value}" for name, value in carrier.items()]
        if not self.headers:
            return lines
        names = {name.lower() for name in carrier}
        return [line for line in self.headers if _name(line) not in names] + lines
