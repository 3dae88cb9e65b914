"""llmretry.otel's instruments: the tracer, the meter's instruments and the
counters llmretry sums itself, of one instrument() call (_Telemetry), and
what calls alike share (their spans' starting names and attributes, their
metrics' attribute sets), made once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Sequence, Tuple

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import Observation

from . import __version__
from ._otel_mapping import (_SECONDS_BUCKETS, _TOKEN_BUCKETS, _Endpoint, _metric_attributes,
                            _span_name)

_SCOPE = "llmretry"
# The version of the conventions the names follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"

class _Telemetry:
    """A tracer, a meter and the instruments of one instrument() call."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, capture_content: bool) -> None:
        self.capture = bool(capture_content)
        self.tracer = otel_trace.get_tracer(_SCOPE, __version__, tracer_provider,
                                            schema_url=SCHEMA_URL)
        meter = otel_metrics.get_meter(_SCOPE, __version__, meter_provider,
                                       schema_url=SCHEMA_URL)
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration (every attempt and wait of a call)",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS)
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk", unit="s",
            description="Time from the call's start to the first chunk of a stream",
            explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS)
        self.counts = _counts_of(meter)
        # (endpoint, model, response model) -> the metrics' attribute sets.
        self.metric_sets: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}
        # (endpoint or None, model, policy) -> a span's starting name and attributes.
        self.starts: Dict[Tuple[Any, ...], Tuple[str, Dict[str, Any]]] = {}


class _Counts:
    """The four counters (attempts, retries, 429s, circuit-open refusals),
    summed here by attribute set and read by the SDK when it collects
    (observable counters): a call adds to a list under a lock instead of
    making an SDK measurement (whose cost, ~15 µs, is per measurement)."""

    _INSTRUMENTS = (
        ("llmretry.attempts", "{attempt}", "Attempts started"),
        ("llmretry.retries", "{retry}", "Retries scheduled"),
        ("llmretry.rate_limited", "{response}", "Attempts the server refused with 429"),
        ("llmretry.circuit_open", "{call}",
         "Calls refused because their endpoint's circuit breaker was open"),
    )

    def __init__(self, meter: Any) -> None:
        self.lock = threading.Lock()
        self.totals: Dict[Any, List[Any]] = {}   # key -> [attributes, 4 totals]
        # The attempts of the batches running (key -> [attributes, attempts]
        # each): a batch sums its items' itself, without the lock (its items
        # end on one thread), and adds them to the totals when it ends; the
        # attempts counter reads them meanwhile (start_batch, end_batch).
        self.running: List[Dict[Any, List[Any]]] = []
        for i, (name, unit, description) in enumerate(self._INSTRUMENTS):
            meter.create_observable_counter(name, callbacks=[self._observer(i)], unit=unit,
                                            description=description)

    def _observer(self, i: int) -> Callable[[Any], List[Observation]]:
        def observe(_options: Any) -> List[Observation]:
            with self.lock:
                rows = self._with_running() if i == 0 and self.running else self.totals
                return [Observation(row[i + 1], row[0]) for row in rows.values()
                        if row[i + 1]]
        return observe

    def _with_running(self) -> Dict[Any, List[Any]]:
        """The totals with the running batches' attempts so far (the lock
        held). A batch's thread may add a key meanwhile: its sums are read
        at once (list() of a dict's items runs without a switch)."""
        rows = {key: list(row) for key, row in self.totals.items()}
        for sums in self.running:
            for key, (attrs, attempts) in list(sums.items()):
                row = rows.get(key)
                if row is None:
                    row = rows[key] = [attrs, 0, 0, 0, 0]
                row[1] += attempts
        return rows

    def start_batch(self) -> Dict[Any, List[Any]]:
        """A batch starts: the dict it sums its items' attempts in (by the
        counters' key: [attributes, attempts]); end_batch adds them up."""
        sums: Dict[Any, List[Any]] = {}
        with self.lock:
            self.running.append(sums)
        return sums

    def end_batch(self, sums: Dict[Any, List[Any]]) -> None:
        with self.lock:
            for i, running in enumerate(self.running):
                if running is sums:
                    del self.running[i]
                    break
            else:
                return      # ended already
            for key, (attrs, attempts) in sums.items():
                row = self.totals.get(key)
                if row is None:
                    row = self.totals[key] = [attrs, 0, 0, 0, 0]
                row[1] += attempts

    def add_attempts(self, key: Any, attrs: Dict[str, Any], attempts: int) -> None:
        """add() of a call with no retry, 429 or refusal (most calls)."""
        with self.lock:
            row = self.totals.get(key)
            if row is None:
                row = self.totals[key] = [attrs, 0, 0, 0, 0]
            row[1] += attempts

    def add(self, key: Any, attrs: Dict[str, Any], counts: Sequence[int]) -> None:
        with self.lock:
            row = self.totals.get(key)
            if row is None:
                row = self.totals[key] = [attrs, 0, 0, 0, 0]
            row[1] += counts[0]
            row[2] += counts[1]
            row[3] += counts[2]
            row[4] += counts[3]


# One _Counts per meter: the SDK keeps an observable instrument's first
# registration (instrument() again on the same provider would register
# callbacks nobody calls), so a meter's counters are made once.
_meter_counts: "weakref.WeakKeyDictionary[Any, _Counts]" = weakref.WeakKeyDictionary()


def _counts_of(meter: Any) -> _Counts:
    try:
        counts = _meter_counts.get(meter)
    except TypeError:           # a meter that cannot be weakly referenced
        return _Counts(meter)
    if counts is None:
        counts = _meter_counts[meter] = _Counts(meter)
    return counts


def _metric_sets(tel: _Telemetry, endpoint: _Endpoint, model: Any,
                 response_model: Any) -> Tuple[Any, ...]:
    """The metrics' attribute sets of a call (made once per endpoint and
    model, not per call): the counters' key and attributes, the histograms',
    the token histogram's for input and output."""
    sets = tel.metric_sets.get((endpoint, model, response_model))
    if sets is None:
        base = _metric_attributes(endpoint, model)
        hist = dict(base)
        if response_model:
            hist["gen_ai.response.model"] = response_model
        # The counters' key: endpoints alike count alike.
        key = (endpoint.operation, endpoint.provider, endpoint.address, endpoint.port, model)
        sets = (key, base, hist, dict(hist, **{"gen_ai.token.type": "input"}),
                dict(hist, **{"gen_ai.token.type": "output"}))
        if len(tel.metric_sets) >= 1024:    # a bound: a program has few endpoints and models
            tel.metric_sets.clear()
        tel.metric_sets[endpoint, model, response_model] = sets
    return sets


def _start_of(tel: _Telemetry, endpoint: _Endpoint, single: bool, model: Any,
              policy: Any) -> Tuple[str, Dict[str, Any]]:
    """A call's span name and the attributes it starts with (made once per
    endpoint, model and policy, not per call; the SDK copies them): the
    conventions' sampling-relevant ones, what is known before the call
    runs. The endpoint's only for a call with one target (with fallbacks
    the one that answers is known at the end); the rest comes at the end,
    and only if the span records."""
    key = (endpoint if single else None, model, policy)
    start = tel.starts.get(key)
    if start is None:
        attrs: Dict[str, Any] = dict(endpoint.attrs) if single else {}
        if isinstance(model, str) and endpoint.genai:
            attrs["gen_ai.request.model"] = model
        if policy:
            attrs["llmretry.policy"] = policy
        start = (_span_name(endpoint, model), attrs)
        if len(tel.starts) >= 1024:     # a bound: a program has few endpoints and models
            tel.starts.clear()
        tel.starts[key] = start
    return start
