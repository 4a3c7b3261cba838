"""A request's spans (`telemetry/`): its record becomes them as its moments are marked
(`record.mark`): the `upstream request` mark opens a CLIENT span `chat {model}` under the
request's SERVER span, `upstream failed` (or the upstream client's `retry`) ends it with
`error.type`, `first upstream byte` notes the time to the first chunk, and the record's end
ends the rest with the usage, the stop reason and the cost. The layers below call nothing of
this; the upstream client only asks for each request's `traceparent` (`record.current_trace`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Scope

from claude_proxy.record import RequestRecord, current_record, stop_reason_of
from claude_proxy.telemetry import ProxyFacts
from claude_proxy.telemetry.content import conversation
from claude_proxy.telemetry.genai_metrics import GenAIMetrics, input_tokens

logger = logging.getLogger("claude_proxy.telemetry")


@dataclass(frozen=True)
class Tracing:
    """What every request's spans share."""

    tracer: Tracer
    metrics: GenAIMetrics | None
    facts: ProxyFacts
    content: bool
    """Record the conversation (opted in)."""
    cache_write: str
    """The cache-creation count's name: the latest generation renamed it."""


class _Attempt:
    """One upstream attempt's span, until it fails, the next begins or the request ends."""

    __slots__ = ("answered", "attributes", "span", "started")

    def __init__(self, span: Span, started: float, attributes: dict[str, AttributeValue]):
        self.span, self.started, self.attributes = span, started, attributes
        self.answered: float | None = None


class RequestSpans:
    """One request's trace (`record.RequestTrace`): its SERVER span, and a CLIENT span per
    upstream attempt opened and ended as the record's moments are marked."""

    def __init__(self, telemetry: Tracing, record: RequestRecord, scope: Scope) -> None:
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
        try:
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
        except Exception:  # telemetry never fails a request
            logger.debug("could not trace the %s call", tool, exc_info=True)

    # ------------------------------------------------------------ attempts

    def _open_attempt(self, at: float) -> None:
        self._end_answered(at)
        record = current_record()
        self._attempts += 1
        upstream = self._telemetry.facts.upstreams.get(record.provider)
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
        for call in record.tool_calls:
            if call["outcome"] != "valid":
                span.add_event(f"gen_ai.tool_call.{call['outcome']}", _tool_call(call))
        if self._telemetry.content:
            facts = self._telemetry.facts
            span.set_attributes(conversation(record, facts.answer_of(record), facts.secrets))

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


def _tool_call(call: dict[str, Any]) -> dict[str, AttributeValue]:
    """What the tool-call guard did with one call that was not valid (the arguments, which
    may hold the conversation's content, stay out)."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.tool.name": call["tool"], "claude_proxy.tool_call.outcome": call["outcome"],
        "claude_proxy.tool_call.kinds": list(call["kinds"])}
    if call.get("name"):
        attributes["claude_proxy.tool_call.resolved_name"] = call["name"]
    if call.get("error"):
        attributes["claude_proxy.tool_call.error"] = str(call["error"])[:500]
    return attributes


def _conversation(record: RequestRecord) -> dict[str, AttributeValue]:
    """Claude Code's session id joins its own `chat` spans (its traces send no traceparent)."""
    return {"gen_ai.conversation.id": record.session} if record.session not in "-?" else {}


def _own_facts(record: RequestRecord) -> dict[str, AttributeValue]:
    """The proxy's own facts: the route, the key's name (never the key), the subagent, and
    Claude Code's request class and prompt id (its gateway hint headers)."""
    facts: dict[str, AttributeValue] = {"claude_proxy.route": record.route}
    if record.key != "-":
        facts["claude_proxy.key"] = record.key
    if record.agent != "-":
        facts["claude_proxy.agent_id"] = record.agent
    if record.request_class != "-":
        facts["claude_proxy.request_class"] = record.request_class
    if record.prompt_id != "-":
        facts["claude_proxy.prompt_id"] = record.prompt_id
    return facts
