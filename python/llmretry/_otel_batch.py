"""llmretry.otel's batches: a span per item of call_many and acall_many
(and ``llmretry batch``), started as the batch submits the item, its
requests carrying it, ended with the item's value.

An item costs what its span needs and little more: the span starts with
attributes made once per model (_start_of) and its header lines come from
one _Propagation per batch; while it runs, the batch keeps its span, start
time, body and model by the item's number in the run. An item that
succeeds with no events (most) ends its span and records its metrics
straight from its result (_Batch.item_done); one that had events (a
failure, a retry) or failed gets a record (_Call), made at its first
event. Attributes are made only if the span records.
"""

from __future__ import annotations

from time import time_ns
from typing import Any, Callable, Dict, List, Optional, Tuple

from opentelemetry import context as otel_context

from ._bodies import _LazyBodies
from ._otel_context import _Propagation
from ._otel_instruments import _start_of, _Telemetry
from ._otel_mapping import _body_attributes, _targets_of
from ._otel_record import (_CLIENT, _MODEL, _REQUEST_ID, _RESPONSE_MODEL, _STREAM, _TARGET,
                           _TOTAL_MS, _TTFT_MS, _USAGE, _Call, _end_span, _meta_values,
                           _model_of, _record, _success_attributes, _Tee)
from ._results import Result, _value_of
from .errors import LLMError


class _Batch:
    """The records of a batch's items. Each item's span starts when the
    run submits it (Engine.call_many's ``item_headers``, on the batch's
    thread), and its requests carry the span's context; the item's events
    come tagged with its request id, its value with its number in the run
    and its request id."""

    __slots__ = ("tel", "tracer", "targets", "policy", "parent", "start_ns", "items",
                 "encoded", "runnable", "propagation", "by_model", "spans", "calls",
                 "attempt_sums")

    def __init__(self, tel: _Telemetry, kwargs: Dict[str, Any], items: Any, encoded: Any,
                 runnable: Optional[List[int]]) -> None:
        self.tel = tel
        self.tracer = tel.tracer
        self.targets = _targets_of(kwargs)
        self.policy = kwargs.get("policy")
        self.parent = otel_context.get_current()
        self.start_ns = time_ns()
        # A list's bodies are read back by index (its model from the body
        # as encoded, the policy's filled in; its settings from the body
        # given); a lazy batch keeps none (its memory stays flat): its
        # spans lack the request's settings (the model comes from the
        # result or the events) and its input messages.
        self.items = items
        self.encoded = encoded
        # A list's run submits its runnable items (those not done before a
        # resume), numbered from 0: the k-th is item runnable[k]. A lazy
        # batch's items come with their own indices.
        self.runnable = runnable
        self.propagation = _Propagation(self.parent, kwargs.get("headers"), shared=True)
        # Model -> the span's starting name and attributes (_start_of's).
        self.by_model: Dict[Any, Tuple[str, Dict[str, Any]]] = {}
        # Number in the run -> the item's (span, start time, body, model), in flight.
        self.spans: Dict[int, Tuple[Any, int, Any, Optional[str]]] = {}
        self.calls: Dict[Any, _Call] = {}       # request id -> an item's events so far
        # The attempts of its items that end here (not through a record),
        # summed without a lock: _Counts.start_batch's, once the run starts.
        self.attempt_sums: Optional[Dict[Any, List[Any]]] = None

    def _body(self, k: int) -> Tuple[Any, Optional[str]]:
        """The body and model of the run's ``k``-th item (None, None: not kept)."""
        index = self.runnable[k] if self.runnable is not None else k
        items = self.items
        if items is None:
            return None, None
        body = items[index]
        model = self.encoded[index][1]
        if model is None and type(body) is not dict:    # a text body: read for its model
            body, model = _model_of(body)
        return body, model

    def item_headers(self, k: int) -> Optional[List[str]]:
        """The run submits its ``k``-th item now: its span starts, and its
        requests carry the batch's headers plus the span's context (None:
        the batch's alone)."""
        try:
            # self._body(k), written out: this runs for every item.
            items = self.items
            if items is None:
                body = model = None
            else:
                runnable = self.runnable
                index = runnable[k] if runnable is not None else k
                body = items[index]
                model = self.encoded[index][1]
                if model is None and type(body) is not dict:    # a text body
                    body, model = _model_of(body)
            start = self.by_model.get(model)
            if start is None:
                targets = self.targets
                start = self.by_model[model] = _start_of(self.tel, targets.first,
                                                         targets.single, model, self.policy)
            name, attrs = start
            now = time_ns()
            span = self.tracer.start_span(name, self.parent, _CLIENT, attrs, start_time=now)
            self.spans[k] = (span, now, body, model)
            return self.propagation.lines(span)
        except Exception:   # telemetry must never break a batch
            return None

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
        if then is None:
            return self.item_done

        def on_result(k: int, value: Any) -> Any:
            self.item_done(k, value)
            return then(k, value)
        return on_result

    def item_done(self, k: int, value: Any) -> None:
        """The run's ``k``-th item ended with ``value``: its span ends. One
        that succeeded with no events (most) ends here, made as
        _Call._succeeded makes a record's with no events (with the same
        helpers) without the record; any other through its record."""
        try:
            started = self.spans.pop(k, None)
            if type(value) is not Result:       # (most are: one test for them)
                if type(value) is dict:
                    # An outcome the batch makes its value of (a failure; a
                    # body Python parses, or the validator accepted): the same here.
                    value = _value_of(value, None)
                if not isinstance(value, Result):
                    if isinstance(value, LLMError):
                        self._ended(k, started, value, value.request_id, value.total_ms)
                    return          # else never sent (a bad input line)
            values = _meta_values(value)
            calls = self.calls
            if started is None or (calls and values[_REQUEST_ID] in calls):
                self._ended(k, started, value, values[_REQUEST_ID], values[_TOTAL_MS])
                return
            span, start_ns, body, model = started
            end_ns = time_ns()
            if start_ns > end_ns:
                start_ns = end_ns
            targets = self.targets
            target = values[_TARGET]
            endpoint = targets[target] if target else targets.first
            # The request's model names the call, else the result's.
            named = model if model is not None else values[_MODEL] or None
            tel = self.tel
            usage = values[_USAGE]
            if usage:
                in_tokens = usage.get("prompt_tokens")
                out_tokens = usage.get("completion_tokens")
            else:
                in_tokens = out_tokens = None
            if span.is_recording():
                capture = tel.capture
                attrs: Dict[str, Any] = {}
                if body is not None:
                    _body_attributes(attrs, body, capture)
                answered = _success_attributes(attrs, values, value.data, capture, in_tokens,
                                               out_tokens)
                _end_span(span, attrs, targets, endpoint, named, model, None, answered, None,
                          end_ns)
            span.end(end_time=end_ns)
            ttft_ms = values[_TTFT_MS]
            _record(tel, None, endpoint, named, values[_RESPONSE_MODEL], None, start_ns, end_ns,
                    ttft_ms * 0.001 if values[_STREAM] and ttft_ms is not None else None,
                    in_tokens, out_tokens, values[1], self.attempt_sums)
        except Exception:   # telemetry must never break a batch
            pass

    def _ended(self, k: int, started: Optional[Tuple[Any, int, Any, Optional[str]]],
               value: Any, rid: Any, total_ms: Any) -> None:
        """An item's end through its record (_Call): one that had events (a
        failure, a retry: its record made at the first), failed, or whose
        start was not seen (item_headers failed: no span yet)."""
        call = self.calls.pop(rid, None) if self.calls else None
        if started is not None:
            span, start_ns, body, model = started
        else:
            span = None
            # The call's own clock: from its submission, waits for a slot included.
            start_ns = max(self.start_ns, time_ns() - int((total_ms or 0) * 1_000_000))
            body, model = self._body(k)
        if call is None:
            call = _Call(self.tel, self.targets, self.parent, start_ns, None, None, False,
                         False, self.policy)
        else:
            call.start_ns = start_ns
        call.span = span
        call.body, call.model = body, model
        if isinstance(value, Result):
            call.end(result=value)
        else:
            call.end(error=value)

    def finish(self) -> None:
        """The batch is over: its unfinished items end (end_unfinished) and
        its items' attempts go to the counters' totals."""
        try:
            self.end_unfinished()
        finally:
            if self.attempt_sums is not None:
                self.tel.counts.end_batch(self.attempt_sums)

    def end_unfinished(self) -> None:
        """The batch is over: items it submitted that never finished (it
        was interrupted, or raised) end as cancelled."""
        spans, self.spans = self.spans, {}
        for span, start_ns, body, model in spans.values():
            call = _Call(self.tel, self.targets, self.parent, start_ns, policy=self.policy)
            call.span = span
            call.body, call.model = body, model
            call.last["error.type"] = "cancelled"
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
            self.records.finish()


def _hook_engine_job(telemetry_of: Callable[[Any], Optional[_Telemetry]],
                     orig: Callable[..., Any]) -> Callable[..., Any]:
    """_engine_batch._engine_job: every batch run on the engine (call_many,
    acall_many, ``llmretry batch``): one record per item."""
    def _engine_job(client: Any, batch: Any, encoded: Any, plan: Any, limit: int,
                    deadline_ms: Any, adaptive: bool) -> Any:
        tel = telemetry_of(client)
        if tel is None:
            return orig(client, batch, encoded, plan, limit, deadline_ms, adaptive)
        lazy = isinstance(encoded, _LazyBodies)
        records = _Batch(tel, plan.kwargs, None if lazy else batch.items,
                         None if lazy else encoded, None if lazy else batch.runnable)
        with_sink = plan.with_options([("logger", _Tee(records.on_event,
                                                       plan.kwargs.get("on_event")))])
        with_sink.auto_key = plan.auto_key
        job = orig(client, batch, encoded, with_sink, limit, deadline_ms, adaptive)
        # Each item's start and end, from the engine's run itself: the
        # batch's own bookkeeping stays as it is (its values recorded at
        # the end when nothing else wants each one).
        job.kwargs["item_headers"] = records.item_headers
        job.kwargs["on_result"] = records.on_result(job.kwargs.get("on_result"))
        # From here _Job.finish ends it (the callers' finally).
        records.attempt_sums = tel.counts.start_batch()
        return _Job(job, records)
    return _engine_job
