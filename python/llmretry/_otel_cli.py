"""The CLI's ``--otel`` (docs/observability.md, "The CLI"): OpenTelemetry's SDK
exporting spans and metrics with OTLP/HTTP, flushed when the command ends.

A collector that is down or does not answer costs the command the exporters'
timeout once at its end (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s unless set: both
signals are flushed at once, not one after the other) and one line of its
own on stderr, instead of the exporters' retry messages, one per attempt and
signal, between the command's own lines."""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Dict, List, Optional, Set

from .otel import instrument, uninstrument

# The exporters' own loggers (their retries and their giving up).
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http"
# (exporter module, what the line calls it, its OTEL_EXPORTER_OTLP_<...>_ENDPOINT)
SIGNALS = (("trace_exporter", "spans", "TRACES"), ("metric_exporter", "metrics", "METRICS"))
REASON_MAX = 300


def _reason(logged: str) -> str:
    """The exporter's message made a reason: the system's words for a
    connection that failed ("[Errno 111] Connection refused", deep in
    urllib3's), the deadline for one that never answered (the exporter
    says only that it gave up), else the message itself, cut."""
    errno = re.search(r"\[Errno -?[0-9]+\] [^\"')]+", logged)
    if errno:
        return errno.group(0)
    if logged.startswith("Failed to export") and "due to timeout" in logged:
        timeout = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") or "10"
        return f"no answer within {timeout} s, OTEL_EXPORTER_OTLP_TIMEOUT"
    return logged.removeprefix("Transient error ")[:REASON_MAX]


class _Trouble(logging.Handler):
    """What the exporters logged: which signals failed, and the first reason."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.signals: Set[str] = set()
        self.reason: Optional[str] = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for module, signal, _ in SIGNALS:
                if record.name.endswith(module):
                    self.signals.add(signal)
            if self.reason is None:
                self.reason = _reason(record.getMessage())
        except Exception:           # a logging handler never raises
            self.handleError(record)


class CliExport:
    """The SDK, its providers and exporters for one command; ``shutdown()``
    flushes both and says in one line what could not be sent (None: all was)."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Until shutdown(): main() may run in a process that goes on.
        self.trouble = _Trouble()
        self.logger = logging.getLogger(EXPORTER_LOGGER)
        self.propagated = self.logger.propagate
        self.logger.addHandler(self.trouble)
        self.logger.propagate = False
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                    or "llmretry"})
        # Shut down by shutdown() alone: the SDK's own at exit would wait for the
        # collector again after a Ctrl-C ended that wait.
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # A long interval: the command's metrics go out once, at shutdown.
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(),
                                               export_interval_millis=60000)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader],
                                            shutdown_on_exit=False)
        instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def shutdown(self) -> Optional[str]:
        uninstrument()
        # Each flush waits for its collector, up to the exporters' timeout:
        # side by side, a collector away costs that once.
        flushes = [threading.Thread(target=p.shutdown, name=f"llmretry-otel-{n}", daemon=True)
                   for n, p in (("spans", self.tracer_provider),
                                ("metrics", self.meter_provider))]
        for t in flushes:
            t.start()
        try:
            for t in flushes:
                t.join()
        finally:
            self.logger.removeHandler(self.trouble)
            self.logger.propagate = self.propagated
        if not self.trouble.signals:
            return None
        # In one order, whichever flush gave up first; signals sent to one
        # place named together.
        where: Dict[str, List[str]] = {}
        for _, signal, kind in SIGNALS:
            if signal in self.trouble.signals:
                where.setdefault(_endpoint(kind), []).append(signal)
        what = ", ".join(f"{' and '.join(signals)} not exported to {endpoint}"
                         for endpoint, signals in where.items())
        return f"{what} ({self.trouble.reason}); the command's results are not affected"


def _endpoint(kind: str) -> str:
    """Where a signal went, as its exporter reads the environment: its own
    endpoint when set, else the common one."""
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{kind}_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318")
