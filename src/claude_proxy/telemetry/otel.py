"""The OpenTelemetry SDK's side of `telemetry/`: imported only when OpenTelemetry is configured.

A request's record becomes its spans as its moments are marked (`record.mark`): the
`upstream request` mark opens a CLIENT span `chat {model}` under the request's SERVER span,
`upstream failed` ends it with `error.type`, `first upstream byte` notes the time to the first
chunk, and the record's end ends the rest with the usage, the stop reason and the cost. The
layers below call nothing of this; the upstream client only asks for the attempt's
`traceparent` (`record.current_trace`).

Names follow the GenAI semantic conventions (Development status; open-telemetry/
semantic-conventions-genai, docs/gen-ai/client-inference.md and gen-ai-metrics.md), in the
generation OTEL_SEMCONV_STABILITY_OPT_IN selects (`GenAIMetrics`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, MutableMapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import (
    NoOpTracer,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Scope

from claude_proxy.logs import redact
from claude_proxy.record import RequestRecord, current_record, stop_reason_of
from claude_proxy.telemetry import Exporters, Upstream

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

# Bucket boundaries the conventions give.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
USAGE_COUNTERS = {  # the latest generation's counters, by the record's token kinds
    "input": "input_tokens", "output": "output_tokens",
    "cache_read": "cache_read.input_tokens", "cache_write": "cache_write.input_tokens",
    "reasoning": "reasoning.output_tokens",
}


def build(environ: Mapping[str, str], upstreams: dict[str, Upstream], secrets: list[str],
          exporters: Exporters | None) -> ProxyTelemetry | None:
    """The telemetry the environment describes (or `exporters`, in tests): None, after one
    WARNING, when it asks for what cannot be exported."""
    resource = _resource(environ)
    if exporters is not None:
        in_memory = TracerProvider(resource=resource)
        in_memory.add_span_processor(SimpleSpanProcessor(exporters.spans))
        return ProxyTelemetry(in_memory, MeterProvider(resource=resource,
                                                       metric_readers=[exporters.metrics]),
                              upstreams, secrets, environ)
    protocol = _protocol(environ)
    if protocol != PROTOCOL:
        logger.warning("OpenTelemetry is off: OTLP protocol %r is not supported (claude-proxy "
                       "exports %s)", protocol, PROTOCOL)
        return None
    traced = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"
    metered = environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none"
    tracer_provider = _otlp_tracing(resource) if traced else None
    meters = _otlp_metrics(resource) if metered else None
    _quiet_exporters()
    _check_collector(_endpoint(environ, "TRACES" if traced else "METRICS"))
    return ProxyTelemetry(tracer_provider, meters, upstreams, secrets, environ)


class ProxyTelemetry:
    """Traces and GenAI metrics for every API request (`telemetry.Telemetry`)."""

    def __init__(self, tracer_provider: TracerProvider | None, meters: MeterProvider | None,
                 upstreams: dict[str, Upstream], secrets: list[str],
                 environ: Mapping[str, str]) -> None:
        self._tracer_provider, self._meters = tracer_provider, meters
        self.tracer: Tracer = (tracer_provider.get_tracer("claude_proxy", _version())
                               if tracer_provider is not None else NoOpTracer())
        latest = LATEST in _opt_ins(environ)
        self.metrics = GenAIMetrics(meters, latest) if meters is not None else None
        self.cache_write = ("gen_ai.usage.cache_write.input_tokens" if latest
                            else "gen_ai.usage.cache_creation.input_tokens")
        """The latest generation renamed the cache-creation count."""
        self.upstreams = upstreams
        self.secrets = secrets
        self.content = environ.get(CONTENT_VARIABLE, "").strip().lower() == "true"

    def started(self, record: RequestRecord, scope: Scope) -> None:
        if not record.path.startswith(TRACED_PREFIX):
            return
        try:
            record.trace = RequestSpans(self, record, scope)
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


class GenAIMetrics:
    """The GenAI client metrics, per provider and model, in the generation
    OTEL_SEMCONV_STABILITY_OPT_IN selects: by default the one instrumentations have emitted
    (`gen_ai.client.operation.*`, `gen_ai.client.token.usage`); with
    `gen_ai_latest_experimental`, the latest (`gen_ai.client.inference.*`) instead, as the
    conventions ask ("emit the latest … and do not emit the old one")."""

    def __init__(self, meters: MeterProvider, latest: bool) -> None:
        meter = meters.get_meter("claude_proxy", _version())
        operation = "gen_ai.client.inference" if latest else "gen_ai.client.operation"
        self.duration = meter.create_histogram(
            "gen_ai.client.inference.duration" if latest else "gen_ai.client.operation.duration",
            unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.first_chunk = meter.create_histogram(
            f"{operation}.time_to_first_chunk", unit="s",
            description="Time to receive the first chunk in a streaming operation.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.latest = latest
        if not latest:
            self.tokens = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
            return
        self.per_operation = {kind: meter.create_histogram(
            f"gen_ai.client.inference.operation.{kind}_tokens", unit="{token}",
            description=f"The number of {kind} tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS) for kind in ("input", "output")}
        self.counters = {kind: meter.create_counter(
            f"gen_ai.client.inference.usage.{name}", unit="{token}")
            for kind, name in USAGE_COUNTERS.items()}

    def usage(self, tokens: dict[str, int], attributes: dict[str, AttributeValue]) -> None:
        """One operation's tokens (the record's Anthropic usage: input without the cache)."""
        counts = {**tokens, "input": input_tokens(tokens)}
        if not self.latest:
            for kind in ("input", "output"):
                self.tokens.record(counts.get(kind, 0),
                                   {**attributes, "gen_ai.token.type": kind})
            return
        for kind, histogram in self.per_operation.items():
            histogram.record(counts.get(kind, 0), attributes)
        # The upstreams' usage does not say which tokens were text and which images.
        by_modality = {**attributes, "gen_ai.token.modality": "unknown"}
        for kind, counter in self.counters.items():
            counter.add(counts.get(kind, 0), by_modality)


def input_tokens(tokens: dict[str, int]) -> int:
    """The conventions' input tokens include the cached ones; Anthropic's usage does not."""
    return tokens.get("input", 0) + tokens.get("cache_read", 0) + tokens.get("cache_write", 0)


class _Attempt:
    """One upstream attempt's span, until it fails, the next begins or the request ends."""

    __slots__ = ("answered", "attributes", "span", "started")

    def __init__(self, span: Span, started: float, attributes: dict[str, AttributeValue]):
        self.span, self.started, self.attributes = span, started, attributes
        self.answered: float | None = None


class RequestSpans:
    """One request's trace (`record.RequestTrace`): its SERVER span, and a CLIENT span per
    upstream attempt opened and ended as the record's moments are marked."""

    def __init__(self, telemetry: ProxyTelemetry, record: RequestRecord, scope: Scope) -> None:
        # The record is not kept (it keeps this trace: no cycle); the moments are marked while
        # it is the current one (`current_record`), and `finish` is handed it.
        self._telemetry = telemetry
        # perf_counter (the record's clock) to the epoch nanoseconds spans are stamped with.
        self._epoch = time.time_ns() - int(time.perf_counter() * 1e9)
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope.get("headers", ())}
        self._server = telemetry.tracer.start_span(
            f"{record.method} {_route(record.path)}", context=propagate.extract(carrier),
            kind=SpanKind.SERVER, start_time=self._ns(record.started), attributes={
                "http.request.method": record.method, "url.path": record.path,
                "http.route": _route(record.path), "url.scheme": scope.get("scheme", "http"),
                "claude_proxy.request_id": record.request_id})
        self.trace_id = format(self._server.get_span_context().trace_id, "032x")
        self._attempt: _Attempt | None = None
        self._attempts = 0
        self._retrying = False
        """The upstream client is about to send the failed attempt again."""

    # ------------------------------------------------------------ the record's moments

    def marked(self, event: str, detail: str, at: float) -> None:
        try:
            if event == "upstream request":
                self._open_attempt(at)
            elif event == "upstream failed":
                self._fail_attempt(detail, at)
            elif event == "first upstream byte":
                self._answered(at)
            elif event == "retry":  # the client sends it again: a span of its own (inject)
                self._fail_attempt(detail, at)
                self._retrying = True
            elif event == "failover":
                self._server.add_event("failover", {"detail": detail}, self._ns(at))
        except Exception:  # telemetry never fails a request
            logger.debug("could not trace %r", event, exc_info=True)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """The attempt's `traceparent` (and `tracestate`), nothing of the client's baggage.
        Called as each upstream request is sent: a retry's opens its span here."""
        try:
            if self._retrying and self._attempt is None:
                self._retrying = False
                self._open_attempt(time.perf_counter())
            if self._attempt is not None:
                _TRACE_CONTEXT.inject(headers, set_span_in_context(self._attempt.span))
        except Exception:  # telemetry never fails a request
            logger.debug("could not propagate the trace", exc_info=True)

    def responded(self, model: Any, response_id: Any) -> None:
        if self._attempt is None:
            return
        if isinstance(model, str) and model:
            self._attempt.span.set_attribute("gen_ai.response.model", model)
        if isinstance(response_id, str) and response_id:
            self._attempt.span.set_attribute("gen_ai.response.id", response_id)

    def tool_call(self, tool: str, source: str, outcome: str, seconds: float) -> None:
        end = time.perf_counter()
        span = self._telemetry.tracer.start_span(
            f"execute_tool {tool}", context=set_span_in_context(self._server),
            kind=SpanKind.INTERNAL, start_time=self._ns(end - seconds), attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                "gen_ai.tool.type": "extension", "claude_proxy.search.source": source,
                "claude_proxy.search.outcome": outcome})
        if outcome not in ("ok", "empty"):
            span.set_attribute("error.type", outcome)
            span.set_status(Status(StatusCode.ERROR))
        span.end(self._ns(end))

    # ------------------------------------------------------------ attempts

    def _open_attempt(self, at: float) -> None:
        self._end_answered(at)
        record = current_record()
        self._attempts += 1
        upstream = self._telemetry.upstreams.get(record.provider)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": upstream.provider if upstream else record.provider,
            "gen_ai.request.model": record.upstream_model,
        }
        extra: dict[str, AttributeValue] = {"claude_proxy.attempt": self._attempts,
                                            **_request_settings(record.upstream_body)}
        if record.stream:
            extra["gen_ai.request.stream"] = True
        if upstream is not None and upstream.address:
            attributes["server.address"] = upstream.address
            if upstream.port is not None:
                attributes["server.port"] = upstream.port
        span = self._telemetry.tracer.start_span(
            f"chat {record.upstream_model}", context=set_span_in_context(self._server),
            kind=SpanKind.CLIENT, start_time=self._ns(at),
            attributes={**attributes, **_conversation(record), **_own_facts(record), **extra})
        self._attempt = _Attempt(span, at, attributes)

    def _fail_attempt(self, detail: str, at: float) -> None:
        """`detail` is service.py's `provider: status error_type`, or the upstream client's
        `status error_type, again in …` for a retry."""
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        status, _, error_type = detail.rpartition(": ")[2].partition(",")[0].partition(" ")
        error = error_type or "upstream_error"
        attempt.span.set_attribute("error.type", error)
        if status.isdigit():
            attempt.span.set_attribute("http.response.status_code", int(status))
        attempt.span.set_status(Status(StatusCode.ERROR, detail))
        attempt.span.end(self._ns(at))
        if self._telemetry.metrics is not None:
            self._telemetry.metrics.duration.record(
                at - attempt.started, {**attempt.attributes, "error.type": error})

    def _answered(self, at: float) -> None:
        attempt = self._attempt
        if attempt is None:
            return
        attempt.answered = at
        if not current_record().stream:
            return
        attempt.span.set_attribute("gen_ai.response.time_to_first_chunk", at - attempt.started)
        if self._telemetry.metrics is not None:
            self._telemetry.metrics.first_chunk.record(at - attempt.started, attempt.attributes)

    def _end_answered(self, at: float) -> None:
        """An answered attempt ends where the next begins (a web search's next turn)."""
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            self._end_attempt(attempt, at, current_record())

    def _end_attempt(self, attempt: _Attempt, at: float, record: RequestRecord,
                     tokens: dict[str, int] | None = None) -> None:
        span = attempt.span
        if attempt.answered is None:  # the request ended (the client left) before an answer
            error = "cancelled" if record.status in (0, 499) else "incomplete"
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
            attributes = {**attempt.attributes, "error.type": error}
        else:
            attributes = attempt.attributes
        metrics = self._telemetry.metrics
        if metrics is not None:
            metrics.duration.record(at - attempt.started, attributes)
            if tokens:
                metrics.usage(tokens, attempt.attributes)
        span.end(self._ns(at))

    # ------------------------------------------------------------ the end

    def finish(self, record: RequestRecord, finished: float) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            self._describe_answer(attempt.span, record)
            end = (attempt.answered if attempt.answered is not None and not record.stream
                   else finished)
            self._end_attempt(attempt, end, record, record.tokens)
        server = self._server
        server.set_attributes({"http.response.status_code": record.status,
                               **_conversation(record), **_own_facts(record)})
        if record.client_model != "-":
            server.set_attribute("claude_proxy.client_model", record.client_model)
        if record.failover:
            server.set_attribute("claude_proxy.failover", [*record.failover, record.provider])
        if record.cost is not None:
            server.set_attribute("claude_proxy.cost_usd", record.cost)
        if record.status >= 500 or record.status == 0:
            server.set_attribute("error.type", str(record.status or "incomplete"))
            server.set_status(Status(StatusCode.ERROR))
        server.end(self._ns(finished))

    def _describe_answer(self, span: Span, record: RequestRecord) -> None:
        """Usage, stop reason and cost of the attempt that answered; the bodies only when
        opted in (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true), redacted."""
        tokens = record.tokens
        if tokens:
            span.set_attributes({
                "gen_ai.usage.input_tokens": input_tokens(tokens),
                "gen_ai.usage.output_tokens": tokens.get("output", 0),
                "gen_ai.usage.cache_read.input_tokens": tokens.get("cache_read", 0),
                self._telemetry.cache_write: tokens.get("cache_write", 0),
                "gen_ai.usage.reasoning.output_tokens": tokens.get("reasoning", 0)})
        stop = stop_reason_of(record)
        if stop and stop != "None":
            span.set_attribute("gen_ai.response.finish_reasons", [stop])
        if record.cost is not None:
            span.set_attribute("claude_proxy.cost_usd", record.cost)
        if self._telemetry.content:
            span.set_attributes(_content(record, self._telemetry.secrets))

    def _ns(self, at: float) -> int:
        return int(at * 1e9) + self._epoch


_TRACE_CONTEXT = TraceContextTextMapPropagator()


def _route(path: str) -> str:
    return "/v1/models/{model_id}" if path.startswith("/v1/models/") else path


REQUEST_SETTINGS = (("max_tokens", "gen_ai.request.max_tokens"),
                    ("max_completion_tokens", "gen_ai.request.max_tokens"),
                    ("max_output_tokens", "gen_ai.request.max_tokens"),
                    ("temperature", "gen_ai.request.temperature"),
                    ("top_p", "gen_ai.request.top_p"), ("top_k", "gen_ai.request.top_k"))
"""The upstream request's fields (Chat Completions, Responses) the conventions name."""


def _request_settings(body: dict[str, Any] | None) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {}
    for field, name in REQUEST_SETTINGS:
        value = (body or {}).get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[name] = value
    return found


def _conversation(record: RequestRecord) -> dict[str, AttributeValue]:
    """Claude Code's session id joins its own `chat` spans (its traces send no traceparent)."""
    return {"gen_ai.conversation.id": record.session} if record.session not in "-?" else {}


def _own_facts(record: RequestRecord) -> dict[str, AttributeValue]:
    """The proxy's own facts: the route, the key's name (never the key), the subagent, the
    request class when the record has one."""
    facts: dict[str, AttributeValue] = {"claude_proxy.route": record.route}
    if record.key != "-":
        facts["claude_proxy.key"] = record.key
    if record.agent != "-":
        facts["claude_proxy.agent_id"] = record.agent
    request_class = getattr(record, "request_class", None)
    if isinstance(request_class, str) and request_class not in ("", "-"):
        facts["claude_proxy.request_class"] = request_class
    return facts


def _content(record: RequestRecord, secrets: list[str]) -> dict[str, AttributeValue]:
    """The conversation as the GenAI conventions' JSON attributes, secrets redacted as the
    dashboard redacts its bodies (logs.redact)."""
    body = record.client_body or {}
    found: dict[str, AttributeValue] = {}
    system = body.get("system")
    if system:
        found["gen_ai.system_instructions"] = _json(_parts(system), secrets)
    messages = body.get("messages")
    if isinstance(messages, list):
        found["gen_ai.input.messages"] = _json(
            [{"role": message.get("role"), "parts": _parts(message.get("content"))}
             for message in messages if isinstance(message, dict)], secrets)
    answer = record.message
    if answer is not None:
        found["gen_ai.output.messages"] = _json(
            [{"role": "assistant", "parts": _parts(answer.get("content")),
              "finish_reason": answer.get("stop_reason")}], secrets)
    return found


def _parts(content: Any) -> list[dict[str, Any]]:
    """Anthropic content blocks as the conventions' message parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking", "")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"),
                          "response": block.get("content")})
        else:
            parts.append({"type": str(kind)})
    return parts


def _json(value: Any, secrets: list[str]) -> str:
    return redact(orjson.dumps(value, default=str).decode(), secrets)


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
    attributes: dict[str, Any] = {"service.version": _version()}
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


def _version() -> str:
    try:
        return version("claude-proxy")
    except PackageNotFoundError:
        return "0"
