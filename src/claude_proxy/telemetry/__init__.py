"""OpenTelemetry traces and GenAI metrics, off unless the standard `OTEL_` variables ask for
them (docs/opentelemetry.md).

Off, nothing of OpenTelemetry's SDK is imported; a request pays an `is None` test where its
record opens and closes and at each `mark`, and a context-variable read per upstream request.

On, `telemetry/otel.py` turns each request's record (`record.py`) into spans as its moments
are marked (`telemetry/spans.py`): a SERVER span per HTTP request, a CLIENT span per upstream
request, a span per web search, and the GenAI metrics (`telemetry/genai_metrics.py`);
exporting is batched in the SDK's own threads, off the request path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Scope

from claude_proxy.record import RequestRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("claude_proxy.telemetry")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                      "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
EXPORTER_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER")

# What the profile's provider is called by the GenAI conventions' `gen_ai.provider.name`
# (their well-known values); any other profile is named as it is (a custom value).
GENAI_PROVIDER_NAMES = {
    "openai": "openai",
    "azure": "azure.ai.openai",
    "deepseek": "deepseek",
    "kimi": "moonshot_ai",
    "gemini": "gcp.gemini",
    "anthropic": "anthropic",
    "mistral": "mistral_ai",
    "groq": "groq",
    "xai": "x_ai",
}


@dataclass(frozen=True)
class Upstream:
    """What a span says of a configured provider: its GenAI provider name and its server."""

    provider: str
    address: str
    port: int | None


def upstream_of(profile: str, base_url: str) -> Upstream:
    """The span facts of a provider with this profile and base URL."""
    from urllib.parse import urlsplit  # start-up only

    url = urlsplit(base_url)
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    return Upstream(GENAI_PROVIDER_NAMES.get(profile, profile), url.hostname or "", port)


@dataclass(frozen=True)
class ProxyFacts:
    """What the proxy tells its telemetry at start."""

    upstreams: dict[str, Upstream]
    """The configured providers by name."""
    secrets: list[str]
    """Redacted from a recorded conversation, as from the dashboard's bodies."""
    answer_of: Callable[[RequestRecord], dict[str, Any]]
    """A finished request's answer, a stream's events added up (the dashboard's reader;
    only a recorded conversation needs it)."""


class Telemetry(Protocol):
    """Opens a request's trace when its record opens, and ends it when the record is done."""

    def started(self, record: RequestRecord, scope: Scope) -> None: ...

    def finished(self, record: RequestRecord, finished: float) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Exporters:
    """Where spans and metric points go instead of OTLP (the SDK's in-memory ones in tests)."""

    spans: SpanExporter
    metrics: MetricReader


def configured(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for OpenTelemetry: an OTLP endpoint, or `otlp` as the
    traces or metrics exporter, and not OTEL_SDK_DISABLED=true."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES):
        return True
    return any(environ.get(name, "").strip().lower() == "otlp" for name in EXPORTER_VARIABLES)


def open_telemetry(environ: Mapping[str, str], facts: ProxyFacts,
                   exporters: Exporters | None = None) -> Telemetry | None:
    """The proxy's telemetry when the environment (or a test's `exporters`) asks for it, else
    None; the SDK is imported only then. A configuration the SDK cannot serve (no such
    protocol, the SDK not installed) is one WARNING, and None."""
    if exporters is None and not configured(environ):
        return None
    try:
        from claude_proxy.telemetry.otel import build
    except ImportError as exc:
        logger.warning("OpenTelemetry is configured but its SDK is not installed (%s): "
                       "pip install 'claude-proxy[otel]'; telemetry is off", exc.name)
        return None
    return build(environ, facts, exporters)
