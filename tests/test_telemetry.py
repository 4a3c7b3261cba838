"""OpenTelemetry: the spans and GenAI metrics of real requests through a real proxy, read from
the SDK's in-memory exporters, and once from a real OTLP/HTTP receiver on loopback that
decodes the protobuf (opentelemetry-proto); the SDK absent from a process that configures
nothing; a collector down at start and mid-run never touching a request."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app
from claude_proxy.telemetry import Exporters, configured
from tests.conftest import (
    UPSTREAM_KEY,
    ProxyServer,
    clean_env,
    eventually,
    free_port,
    proxy_settings,
    serving,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    completion,
    error_reply,
    serve_in_thread,
    stop_server,
    text_stream,
)
from tests.search_backend import SearchBackendServer

SESSION = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
PROMPT = "the secret plan is 7-alpha-tango"
USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
         "prompt_tokens_details": {"cached_tokens": 100},
         "completion_tokens_details": {"reasoning_tokens": 12}}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Traced:
    """A proxy whose telemetry goes to in-memory exporters."""

    def __init__(self, proxy: ProxyServer, spans: InMemorySpanExporter,
                 metrics: InMemoryMetricReader) -> None:
        self.proxy, self.spans, self.metrics = proxy, spans, metrics

    def finished(self, count: int) -> list[ReadableSpan]:
        """The finished spans once `count` have ended (the SERVER span ends after the
        response's last byte, in the server's thread)."""
        assert eventually(lambda: len(self.spans.get_finished_spans()) >= count)
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [point for resource in data.resource_metrics for scope in resource.scope_metrics
                for metric in scope.metrics if metric.name == name
                for point in metric.data.data_points]


@pytest.fixture
def traced(tmp_path: Path, upstream: ScriptedUpstream) -> Iterator[Callable[..., Traced]]:
    started: list[ProxyServer] = []

    def start(config_text: str | None = None, **overrides: Any) -> Traced:
        spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
        settings = proxy_settings(upstream, tmp_path / "proxy.log", **overrides)
        config = None
        if config_text is not None:
            path = tmp_path / "proxy.toml"
            path.write_text(config_text)
            config = load_config_file(path, Settings(log_file=str(tmp_path / "proxy.log")))
        app = create_app(settings, config=config, telemetry_exporters=Exporters(spans, reader))
        sock = bind_loopback()
        server, thread = serve_in_thread(app, sock)
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                            thread)
        started.append(proxy)
        assert eventually(lambda: serving(proxy.url))
        return Traced(proxy, spans, reader)

    yield start
    for proxy in started:
        proxy.server.should_exit = True
        stop_server(proxy.server, proxy.thread)


def post(proxy: ProxyServer, stream: bool = False, headers: dict[str, str] | None = None,
         **fields: Any) -> httpx.Response:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}], **fields}
    return httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30,
                      headers={"x-claude-code-session-id": SESSION, **(headers or {})})


def by_kind(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return sorted((span for span in spans if span.kind == kind),
                  key=lambda span: span.start_time or 0)


def the_server_span(spans: list[ReadableSpan]) -> ReadableSpan:
    (server,) = by_kind(spans, SpanKind.SERVER)
    return server


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return {name: (list(value) if isinstance(value, tuple) else value)
            for name, value in (span.attributes or {}).items()}


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert span.parent is not None and parent.context is not None
    return (span.parent.span_id == parent.context.span_id
            and span.context is not None and span.context.trace_id == parent.context.trace_id)


def upstream_port(upstream: ScriptedUpstream) -> int:
    return int(upstream.base_url.rsplit(":", 1)[1].split("/")[0])


# ---------------------------------------------------------------- spans


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_is_a_server_span_over_a_chat_client_span(
        stream: bool, traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    reply = (text_stream(["Hello", " there"], usage=USAGE) if stream
             else completion({"content": "Hello there"}, usage=USAGE))
    upstream.queue(reply)
    response = post(proxy.proxy, stream=stream)
    assert response.status_code == 200
    spans = proxy.finished(2)
    server = the_server_span(spans)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    model = upstream.requests[0]["model"]
    assert server.name == "POST /v1/messages"
    assert client.name == f"chat {model}" and child_of(client, server)
    found = attributes(client)
    if stream:  # measured from the attempt's start: how long is not for a test to say
        assert found.pop("gen_ai.request.stream") is True
        assert found.pop("gen_ai.response.time_to_first_chunk") > 0
    assert found == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": 100,
        # What the upstream's answer says of itself (the scripted upstream's model and id).
        "gen_ai.response.model": "scripted",
        "gen_ai.response.id": "chatcmpl-scripted",
        "server.address": "127.0.0.1",
        "server.port": upstream_port(upstream),
        "gen_ai.conversation.id": SESSION,
        "claude_proxy.route": "default",
        "claude_proxy.attempt": 1,
        # The conventions' input counts the cached tokens (Anthropic's usage does not).
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.cache_creation.input_tokens": 0,
        "gen_ai.usage.reasoning.output_tokens": 12,
        "gen_ai.response.finish_reasons": ["end_turn"],
    }
    assert client.status.status_code == StatusCode.UNSET
    server_attributes = attributes(server)
    assert server_attributes["http.response.status_code"] == 200
    assert server_attributes["gen_ai.conversation.id"] == SESSION
    assert server_attributes["claude_proxy.request_id"] == response.headers["request-id"]
    assert server_attributes["claude_proxy.client_model"] == "claude-sonnet-4-6"


def test_claude_codes_request_class_and_prompt_id_are_on_the_attempt(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    """The gateway hint headers Claude Code sends with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1."""
    proxy = traced()
    upstream.queue(completion({"content": "ok"}, usage=USAGE))
    post(proxy.proxy, headers={"x-claude-code-request-class": "subagent",
                               "x-claude-code-prompt-id": "prompt-7f3a"})
    (client,) = by_kind(proxy.finished(2), SpanKind.CLIENT)
    found = attributes(client)
    assert (found["claude_proxy.request_class"], found["claude_proxy.prompt_id"]) == (
        "subagent", "prompt-7f3a")


def test_nothing_of_the_prompt_or_the_answer_is_recorded_by_default(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(completion({"content": "the answer is forty-two-zulu"}, usage=USAGE))
    assert post(proxy.proxy).status_code == 200
    recorded = json.dumps([{**attributes(span), "events": [
        dict(event.attributes or {}) for event in span.events]} for span in proxy.finished(2)])
    assert "7-alpha-tango" not in recorded
    assert "forty-two-zulu" not in recorded
    assert "gen_ai.input.messages" not in recorded


@pytest.mark.parametrize("stream", [False, True])
def test_the_conversation_is_recorded_redacted_when_opted_in(
        stream: bool, traced: Callable[..., Traced], upstream: ScriptedUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    proxy = traced()
    upstream.queue(text_stream(["the answer", " is 42"], usage=USAGE) if stream
                   else completion({"content": "the answer is 42"}, usage=USAGE))
    leaked = f"my key is {UPSTREAM_KEY}"
    assert post(proxy.proxy, stream=stream, system=leaked).status_code == 200
    (client,) = by_kind(proxy.finished(2), SpanKind.CLIENT)
    found = attributes(client)
    assert json.loads(found["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    assert json.loads(found["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "my key is [REDACTED]"}]
    assert json.loads(found["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "the answer is 42"}],
         "finish_reason": "end_turn"}]


FAILOVER = """
[providers.alpha]
openai_base_url = "{url}"
openai_api_key = "{key}"
provider = "deepseek"
big_model = "alpha-big"
middle_model = "alpha-middle"
small_model = "alpha-small"
max_retries = 0

[providers.beta]
openai_base_url = "{url}"
openai_api_key = "{key}"
provider = "openai"
big_model = "beta-big"
middle_model = "beta-middle"
small_model = "beta-small"
max_retries = 0

[router]
default = "alpha,alpha-main"
fallback = ["beta,beta-fallback"]
"""


@pytest.mark.parametrize("stream", [False, True])
def test_a_failover_is_a_second_client_span_after_one_with_its_error(
        stream: bool, traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced(FAILOVER.format(url=upstream.base_url, key=UPSTREAM_KEY))
    upstream.queue(error_reply(503, "down for maintenance"),
                   text_stream(["ok"], usage=USAGE) if stream
                   else completion({"content": "ok"}, usage=USAGE))
    assert post(proxy.proxy, stream=stream).status_code == 200
    spans = proxy.finished(3)
    server = the_server_span(spans)
    failed, answered = by_kind(spans, SpanKind.CLIENT)
    assert [failed.name, answered.name] == ["chat alpha-main", "chat beta-fallback"]
    assert child_of(failed, server) and child_of(answered, server)
    assert attributes(failed)["gen_ai.provider.name"] == "deepseek"
    assert attributes(failed)["error.type"] == "overloaded_error"
    assert attributes(failed)["http.response.status_code"] == 503
    assert failed.status.status_code == StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in attributes(failed)
    assert attributes(answered)["gen_ai.provider.name"] == "openai"
    assert attributes(answered)["claude_proxy.route"] == "fallback"
    assert attributes(answered)["claude_proxy.attempt"] == 2
    assert attributes(answered)["gen_ai.usage.output_tokens"] == 30
    assert "error.type" not in attributes(answered)
    assert attributes(server)["claude_proxy.failover"] == ["alpha", "beta"]
    assert [event.name for event in server.events] == ["failover"]


def test_a_refused_field_retry_is_a_second_client_span(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced(provider="vllm")
    upstream.queue(error_reply(400, "Unrecognized request argument supplied: top_k"),
                   completion({"content": "ok"}, usage=USAGE))
    assert post(proxy.proxy, model="telemetry-top-k", top_k=40).status_code == 200
    spans = proxy.finished(3)
    refused, answered = by_kind(spans, SpanKind.CLIENT)
    assert refused.name == answered.name == "chat telemetry-top-k"
    assert attributes(refused)["error.type"] == "invalid_request_error"
    assert attributes(refused)["http.response.status_code"] == 400
    assert attributes(answered)["claude_proxy.attempt"] == 2
    assert "error.type" not in attributes(answered)
    assert [request.get("top_k") for request in upstream.requests] == [40, None]


def test_each_retry_of_an_attempt_is_a_client_span_with_its_own_traceparent(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()  # max_retries=2, no pause
    upstream.queue(error_reply(429, "slow down"), completion({"content": "ok"}, usage=USAGE))
    assert post(proxy.proxy).status_code == 200
    spans = proxy.finished(3)
    server = the_server_span(spans)
    limited, answered = by_kind(spans, SpanKind.CLIENT)
    assert child_of(limited, server) and child_of(answered, server)
    assert limited.name == answered.name
    assert attributes(limited)["error.type"] == "rate_limit_error"
    assert attributes(limited)["http.response.status_code"] == 429
    assert [attributes(limited)["claude_proxy.attempt"],
            attributes(answered)["claude_proxy.attempt"]] == [1, 2]
    assert "error.type" not in attributes(answered)
    assert attributes(answered)["gen_ai.usage.output_tokens"] == 30
    sent = [headers["traceparent"].split("-")[2] for headers in upstream.headers]
    assert sent == [f"{span.context.span_id:016x}" for span in (limited, answered)
                    if span.context is not None]


def test_an_attempt_the_client_left_before_its_answer_is_cancelled(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(Reply(events=[], stall_at=0))  # headers, then nothing
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.proxy.url}/v1/messages", timeout=0.5, json={
            "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]})
    spans = proxy.finished(2)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert attributes(client)["error.type"] == "cancelled"
    assert client.status.status_code == StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in attributes(client)


def test_a_web_search_is_a_span_of_its_own(
        traced: Callable[..., Traced], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = traced(web_search_backend="searxng", web_search_url=search_backend.url,
                   thinking_signature_secret="s" * 32)
    upstream.queue(completion({"content": "Rust 1.91 is out."}, usage=USAGE))
    body = {"system": "You are an assistant for performing a web search tool use",
            "messages": [{"role": "user",
                          "content": "Perform a web search for the query: rust release"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
            "tool_choice": {"type": "tool", "name": "web_search"}}
    assert post(proxy.proxy, **body).status_code == 200
    spans = proxy.finished(3)
    server = the_server_span(spans)
    (search,) = by_kind(spans, SpanKind.INTERNAL)
    assert search.name == "execute_tool web_search" and child_of(search, server)
    assert attributes(search) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "web_search",
        "gen_ai.tool.type": "extension", "claude_proxy.search.source": "searxng",
        "claude_proxy.search.outcome": "ok"}
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert child_of(client, server)


def test_an_incoming_traceparent_is_continued_and_passed_upstream(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(completion({"content": "ok"}, usage=USAGE))
    response = post(proxy.proxy, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    assert response.status_code == 200
    spans = proxy.finished(2)
    server = the_server_span(spans)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert server.parent is not None and server.parent.is_remote
    assert format(server.parent.span_id, "016x") == PARENT_ID
    assert format(server.context.trace_id, "032x") == TRACE_ID  # type: ignore[union-attr]
    assert client.context is not None
    assert upstream.headers[0]["traceparent"] == (
        f"00-{TRACE_ID}-{client.context.span_id:016x}-01")


def test_without_a_traceparent_the_upstream_gets_the_attempts_and_the_dashboard_the_id(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(completion({"content": "ok"}, usage=USAGE))
    response = post(proxy.proxy)
    spans = proxy.finished(2)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert client.context is not None
    trace_id = format(client.context.trace_id, "032x")
    # Sampled, and (W3C Trace Context level 2) a random trace id: flags 03.
    assert upstream.headers[0]["traceparent"] == (
        f"00-{trace_id}-{client.context.span_id:016x}-03")
    row = httpx.get(f"{proxy.proxy.url}/ui/api/requests/{response.headers['request-id']}",
                    timeout=10).json()["row"]
    assert row["trace"] == trace_id


# ---------------------------------------------------------------- metrics


def test_token_usage_duration_and_first_chunk_metrics(
        traced: Callable[..., Traced], upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(text_stream(["Hi"], usage=USAGE))
    assert post(proxy.proxy, stream=True).status_code == 200
    proxy.finished(2)
    model = upstream.requests[0]["model"]
    facts = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
             "gen_ai.request.model": model, "server.address": "127.0.0.1",
             "server.port": upstream_port(upstream)}
    tokens = {point.attributes["gen_ai.token.type"]: (point.count, point.sum)
              for point in proxy.points("gen_ai.client.token.usage")}
    assert tokens == {"input": (1, 120), "output": (1, 30)}
    assert all(dict(point.attributes) == {**facts, "gen_ai.token.type": kind}
               for point, kind in zip(proxy.points("gen_ai.client.token.usage"),
                                      ("input", "output"), strict=True))
    (duration,) = proxy.points("gen_ai.client.operation.duration")
    assert dict(duration.attributes) == facts and duration.count == 1
    (first,) = proxy.points("gen_ai.client.operation.time_to_first_chunk")
    assert dict(first.attributes) == facts and first.count == 1
    assert proxy.points("gen_ai.client.inference.duration") == []


def test_the_latest_generation_instead_when_opted_in(
        traced: Callable[..., Traced], upstream: ScriptedUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http,gen_ai_latest_experimental")
    proxy = traced()
    upstream.queue(text_stream(["Hi"], usage=USAGE))
    assert post(proxy.proxy, stream=True).status_code == 200
    (client,) = by_kind(proxy.finished(2), SpanKind.CLIENT)
    assert attributes(client)["gen_ai.usage.cache_write.input_tokens"] == 0
    assert "gen_ai.usage.cache_creation.input_tokens" not in attributes(client)
    (inputs,) = proxy.points("gen_ai.client.inference.operation.input_tokens")
    (outputs,) = proxy.points("gen_ai.client.inference.operation.output_tokens")
    assert (inputs.sum, outputs.sum) == (120, 30)
    counted = {name: [(point.value, point.attributes["gen_ai.token.modality"]) for point in
                      proxy.points(f"gen_ai.client.inference.usage.{name}")]
               for name in ("input_tokens", "output_tokens", "cache_read.input_tokens",
                            "cache_write.input_tokens", "reasoning.output_tokens")}
    assert counted == {"input_tokens": [(120, "unknown")], "output_tokens": [(30, "unknown")],
                       "cache_read.input_tokens": [(100, "unknown")],
                       "cache_write.input_tokens": [(0, "unknown")],
                       "reasoning.output_tokens": [(12, "unknown")]}
    assert len(proxy.points("gen_ai.client.inference.duration")) == 1
    assert len(proxy.points("gen_ai.client.inference.time_to_first_chunk")) == 1
    # Not the older generation as well.
    assert proxy.points("gen_ai.client.token.usage") == []
    assert proxy.points("gen_ai.client.operation.duration") == []


# ---------------------------------------------------------------- off, and OTLP for real


def test_the_sdk_is_not_imported_when_nothing_configures_it(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from starlette.testclient import TestClient\n"
        "from claude_proxy.config.settings import Settings\n"
        "from claude_proxy.server.app import create_app\n"
        "app = create_app(Settings(openai_api_key='k', log_file='proxy.log'))\n"
        "with TestClient(app) as client:\n"
        "    assert client.get('/health').status_code == 200\n"
        "print(sorted(name for name in sys.modules if name.startswith('opentelemetry.sdk')))\n"
        "print(app.state.telemetry)\n")
    env = clean_env(tmp_path, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "None"]


@pytest.mark.parametrize(("environ", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "proxy"}, False),  # says nothing of where to send
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"},
     False),
])
def test_which_environments_turn_it_on(environ: dict[str, str], on: bool) -> None:
    assert configured(environ) is on


class Receiver:
    """An OTLP/HTTP receiver on loopback: the spans of every `/v1/traces` export, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.metric_posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    outer.spans.extend(span for resource in request.resource_spans
                                       for scope in resource.scope_spans for span in scope.spans)
                else:
                    outer.metric_posts += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def otlp_environment(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "proxy-under-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")


def otlp_proxy(tmp_path: Path, upstream: ScriptedUpstream
               ) -> tuple[ProxyServer, Callable[[], None]]:
    settings = proxy_settings(upstream, tmp_path / "proxy.log")
    app = create_app(settings)
    sock = bind_loopback()
    server, thread = serve_in_thread(app, sock)
    proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                        thread)
    assert eventually(lambda: serving(proxy.url))

    def stop() -> None:
        server.should_exit = True
        stop_server(server, thread)

    return proxy, stop


def test_spans_reach_a_real_otlp_receiver(tmp_path: Path, upstream: ScriptedUpstream,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver()
    otlp_environment(monkeypatch, receiver.url)
    proxy, stop = otlp_proxy(tmp_path, upstream)
    try:
        upstream.queue(completion({"content": "ok"}, usage=USAGE))
        assert post(proxy).status_code == 200
        assert eventually(lambda: len(receiver.spans) >= 2)
        assert eventually(lambda: receiver.metric_posts > 0)
    finally:
        stop()
        receiver.stop()
    names = {span.name: span for span in receiver.spans}
    model = upstream.requests[0]["model"]
    server, client = names["POST /v1/messages"], names[f"chat {model}"]
    assert client.parent_span_id == server.span_id and client.trace_id == server.trace_id
    found = {item.key: item.value for item in client.attributes}
    assert found["gen_ai.provider.name"].string_value == "openai"
    assert found["gen_ai.usage.output_tokens"].int_value == 30


def test_a_collector_down_at_start_and_mid_run_never_touches_a_request(
        tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    otlp_environment(monkeypatch, f"http://127.0.0.1:{free_port()}")
    caplog.set_level(logging.WARNING)
    proxy, stop = otlp_proxy(tmp_path, upstream)
    try:
        for _ in range(3):
            upstream.queue(completion({"content": "ok"}, usage=USAGE))
            response = post(proxy)
            assert response.status_code == 200
            assert response.json()["content"][0]["text"] == "ok"

        def unreachable() -> list[str]:
            return [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]

        assert eventually(lambda: bool(unreachable()))
        assert len(unreachable()) == 1
        assert unreachable()[0].startswith("OpenTelemetry collector at http://127.0.0.1:")
    finally:
        stop()
    # Mid-run: the receiver answers, then goes away; requests go on as before.
    receiver = Receiver()
    otlp_environment(monkeypatch, receiver.url)
    proxy, stop = otlp_proxy(tmp_path, upstream)
    try:
        upstream.queue(completion({"content": "ok"}, usage=USAGE))
        assert post(proxy).status_code == 200
        assert eventually(lambda: len(receiver.spans) >= 2)
        receiver.stop()
        for _ in range(3):
            upstream.queue(completion({"content": "still ok"}, usage=USAGE))
            response = post(proxy)
            assert response.status_code == 200
            assert response.json()["content"][0]["text"] == "still ok"
    finally:
        stop()


def test_an_unsupported_protocol_is_one_warning_and_no_telemetry(
        tmp_path: Path, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    otlp_environment(monkeypatch, "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    caplog.set_level(logging.WARNING)
    proxy, stop = otlp_proxy(tmp_path, upstream)
    try:
        upstream.queue(completion({"content": "ok"}, usage=USAGE))
        assert post(proxy).status_code == 200
        assert proxy.app.state.telemetry is None
    finally:
        stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "claude_proxy.telemetry"]
    assert warnings == ["OpenTelemetry is off: OTLP protocol 'grpc' is not supported "
                        "(claude-proxy exports http/protobuf)"]
