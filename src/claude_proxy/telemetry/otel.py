"""The OpenTelemetry SDK's side of `telemetry/`, imported only when OpenTelemetry is configured:
the providers and the OTLP/HTTP pipeline the environment describes, and the request hooks
(`ProxyTelemetry`) that give each API request its spans (`telemetry/spans.py`) and the GenAI
metrics (`telemetry/genai_metrics.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import NoOpTracer
from starlette.types import Scope

from claude_proxy import __version__
from claude_proxy.record import RequestRecord
from claude_proxy.telemetry import Exporters, ProxyFacts
from claude_proxy.telemetry.genai_metrics import GenAIMetrics
from claude_proxy.telemetry.spans import RequestSpans, Tracing

logger = logging.getLogger("claude_proxy.telemetry")

PROTOCOL = "http/protobuf"
"""The one OTLP protocol the `otel` extra installs an exporter for."""
DEFAULT_ENDPOINT = "http://localhost:4318"
CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
LATEST = "gen_ai_latest_experimental"
TRACED_PREFIX = "/v1/"
"""The API's requests are traced; the dashboard's polling and /metrics are not."""
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
                    "opentelemetry.sdk._shared_internal")
QUIET_SECONDS = 600.0
"""An exporter's failures are logged at most once in this long (and not in the first this
long after the start-up check said the collector is unreachable)."""


def build(environ: Mapping[str, str], facts: ProxyFacts,
          exporters: Exporters | None) -> ProxyTelemetry | None:
    """The telemetry the environment describes (or `exporters`, in tests): None, after one
    WARNING, when it asks for what cannot be exported."""
    resource = _resource(environ)
    if exporters is not None:
        in_memory = TracerProvider(resource=resource)
        in_memory.add_span_processor(SimpleSpanProcessor(exporters.spans))
        return ProxyTelemetry(in_memory, MeterProvider(resource=resource,
                                                       metric_readers=[exporters.metrics]),
                              facts, environ)
    protocol = _protocol(environ)
    if protocol != PROTOCOL:
        logger.warning("OpenTelemetry is off: OTLP protocol %r is not supported (claude-proxy "
                       "exports %s)", protocol, PROTOCOL)
        return None
    traced = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"
    metered = environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none"
    if not traced and not metered:
        return None
    tracer_provider = _otlp_tracing(resource) if traced else None
    meters = _otlp_metrics(resource) if metered else None
    _quiet_exporters()
    _check_collector(_endpoint(environ, "TRACES" if traced else "METRICS"))
    return ProxyTelemetry(tracer_provider, meters, facts, environ)


class ProxyTelemetry:
    """Traces and GenAI metrics for every API request (`telemetry.Telemetry`)."""

    def __init__(self, tracer_provider: TracerProvider | None, meters: MeterProvider | None,
                 facts: ProxyFacts, environ: Mapping[str, str]) -> None:
        self._tracer_provider, self._meters = tracer_provider, meters
        latest = LATEST in _opt_ins(environ)
        self.tracing = Tracing(
            tracer_provider.get_tracer("claude_proxy", __version__)
            if tracer_provider is not None else NoOpTracer(),
            GenAIMetrics(meters, latest) if meters is not None else None, facts,
            environ.get(CONTENT_VARIABLE, "").strip().lower() == "true",
            "gen_ai.usage.cache_write.input_tokens" if latest
            else "gen_ai.usage.cache_creation.input_tokens")

    def started(self, record: RequestRecord, scope: Scope) -> None:
        if not record.path.startswith(TRACED_PREFIX):
            return
        try:
            record.trace = RequestSpans(self.tracing, record, scope)
        except Exception:  # telemetry never fails a request
            logger.debug("could not open the request's trace", exc_info=True)

    def finished(self, record: RequestRecord, finished: float) -> None:
        if isinstance(record.trace, RequestSpans):
            try:
                record.trace.finish(record, finished)
            except Exception:
                logger.debug("could not end the request's trace", exc_info=True)

    def shutdown(self) -> None:
        """Flush what is batched and stop the exporters' threads (at the app's end)."""
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
        if self._meters is not None:
            self._meters.shutdown()


# ---------------------------------------------------------------- the OTLP pipeline


def _protocol(environ: Mapping[str, str]) -> str:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = environ.get(name, "").strip()
        if value and value != PROTOCOL:
            return value
    return PROTOCOL


def _opt_ins(environ: Mapping[str, str]) -> set[str]:
    return {part.strip() for part in environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")}


def _resource(environ: Mapping[str, str]) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; the service is
    `claude-proxy` when neither names it."""
    attributes: dict[str, Any] = {"service.version": __version__}
    if ("OTEL_SERVICE_NAME" not in environ
            and "service.name=" not in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")):
        attributes["service.name"] = "claude-proxy"
    return Resource.create(attributes)


def _otlp_tracing(resource: Resource) -> TracerProvider:
    """The sampler (OTEL_TRACES_SAMPLER), the batching (OTEL_BSP_*) and the exporter's
    endpoint, headers, timeout and compression are read by the SDK itself."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def _otlp_metrics(resource: Resource) -> MeterProvider:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    return MeterProvider(resource=resource, metric_readers=[reader])


def _endpoint(environ: Mapping[str, str], signal: str) -> str:
    return (environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "").strip()
            or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT)


class _OncePerInterval(logging.Filter):
    """Lets one of an exporter's failure lines through per QUIET_SECONDS: a collector that is
    down says so once, not every few seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.last = -QUIET_SECONDS

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.last < QUIET_SECONDS:
            return False
        self.last = now
        return True


_EXPORTER_FILTER = _OncePerInterval()


def _quiet_exporters() -> None:
    for name in EXPORTER_LOGGERS:
        exporter_logger = logging.getLogger(name)
        if _EXPORTER_FILTER not in exporter_logger.filters:
            exporter_logger.addFilter(_EXPORTER_FILTER)


def _check_collector(endpoint: str) -> None:
    """One WARNING if the collector cannot be reached now, from a thread: the start is not
    delayed, and requests are served either way (spans wait in the batch, then are dropped)."""
    url = urlsplit(endpoint)
    host = url.hostname or "localhost"
    port = url.port or (443 if url.scheme == "https" else 80)
    shown = f"{url.scheme}://{host}:{port}"  # never a password the URL may carry

    def check() -> None:
        import socket

        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError as exc:
            _EXPORTER_FILTER.last = time.monotonic()
            logger.warning("OpenTelemetry collector at %s is unreachable (%s): spans and "
                           "metrics are dropped until it answers; requests are served as usual",
                           shown, exc.strerror or type(exc).__name__)

    threading.Thread(target=check, name="otel-collector-check", daemon=True).start()
