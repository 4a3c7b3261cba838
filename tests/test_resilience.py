"""Upstream faults and client faults: each ends in a correct Anthropic answer, nothing hangs,
and nothing stays open."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import respx

from claude_proxy.config.settings import Settings
from claude_proxy.errors import ProxyError
from claude_proxy.upstream.client import OpenAIClient
from claude_proxy.upstream.retry import MAX_RETRY_AFTER_SECONDS, RetryPolicy
from tests.conftest import ProxyServer, eventually, free_port
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    text_stream,
)
from tests.sse_grammar import Event, accumulate, check_grammar, parse_sse


def post(proxy: ProxyServer, stream: bool = True, **fields: Any) -> httpx.Response:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}], **fields}
    return httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=60)


def events_of(response: httpx.Response) -> list[Event]:
    assert response.status_code == 200
    events = parse_sse(response.content)
    check_grammar(events)
    return events


# ---------------------------------------------------------------- timeouts


def test_idle_timeout_before_first_byte_is_504(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(request_timeout=0.3, max_retries=0)
    upstream.queue(Reply(events=[chunk({"content": "x"})], stall_at=0))
    response = post(proxy)
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout_error"
    assert upstream.wait_until_idle()


def test_idle_timeout_mid_stream_closes_blocks_then_errors(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(request_timeout=0.3, max_retries=0)
    upstream.queue(Reply(events=[chunk({"reasoning_content": "r"}), chunk({"content": "partial"}),
                                 chunk({"content": " more"}), chunk({}, "stop")], stall_at=2))
    events = events_of(post(proxy))
    assert [e.name for e in events][-2:] == ["content_block_stop", "error"]
    assert events[-1].data["error"]["type"] == "overloaded_error"
    assert accumulate(events)["content"][1]["text"] == "partial"
    assert upstream.wait_until_idle()


def test_total_timeout_caps_a_stream_that_never_idles(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(total_timeout=0.5, request_timeout=5)
    upstream.queue(Reply(events=[chunk({"content": "slow"})], keepalive_forever=True))
    events = events_of(post(proxy))
    assert events[-1].data["error"] == {
        "type": "overloaded_error", "message": "the upstream did not finish within TOTAL_TIMEOUT"}
    assert upstream.wait_until_idle()


def test_total_timeout_before_first_byte(proxy_factory: Callable[..., ProxyServer],
                                         upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(total_timeout=0.3, request_timeout=30)
    upstream.queue(Reply(body={}, stall_at=0))
    response = post(proxy, stream=False)
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout_error"
    assert upstream.wait_until_idle()


# ---------------------------------------------------------------- connection failures


def test_connection_refused_is_retried_then_overloaded(
        proxy_factory: Callable[..., ProxyServer]) -> None:
    port = free_port()
    proxy = proxy_factory(openai_base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    response = post(proxy)
    assert response.status_code == 502
    assert response.json()["error"] == {
        "type": "overloaded_error", "message": "upstream connection failed (ConnectError)"}
    assert str(port) not in response.text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(("failure", "status", "error_type"), [
    (httpx.ConnectTimeout("connect timed out"), 504, "timeout_error"),
    (httpx.ConnectError("refused"), 502, "overloaded_error"),
    (httpx.ReadTimeout("read timed out"), 504, "timeout_error"),
    (httpx.RemoteProtocolError("peer closed"), 502, "overloaded_error"),
])
@respx.mock(using="httpx")  # respx mocks the client, whatever its transport
async def test_client_layer_retries_network_failures(failure: Exception, status: int,
                                                     error_type: str,
                                                     respx_mock: respx.MockRouter) -> None:
    settings = Settings(openai_api_key="k", openai_base_url="https://upstream.test/v1",
                        max_retries=3, retry_base_delay=0)
    route = respx_mock.post("https://upstream.test/v1/chat/completions").mock(side_effect=failure)
    client = OpenAIClient(settings)
    with pytest.raises(ProxyError) as raised:
        await client.complete({"model": "m", "messages": []})
    await client.aclose()
    assert (raised.value.status, raised.value.error_type) == (status, error_type)
    assert route.call_count == 4  # 1 + MAX_RETRIES


@pytest.mark.anyio
@respx.mock(using="httpx")  # respx mocks the client, whatever its transport
async def test_client_layer_recovers_after_a_retry(respx_mock: respx.MockRouter) -> None:
    settings = Settings(openai_api_key="k", openai_base_url="https://upstream.test/v1",
                        max_retries=2, retry_base_delay=0)
    route = respx_mock.post("https://upstream.test/v1/chat/completions").mock(side_effect=[
        httpx.ConnectError("refused"),
        httpx.Response(529, json={"error": {"message": "overloaded"}},
                       headers={"retry-after": "0"}),
        httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})])
    client = OpenAIClient(settings)
    result = await client.complete({"model": "m", "messages": []})
    await client.aclose()
    assert result["choices"][0]["message"]["content"] == "ok"
    assert route.call_count == 3


def test_retry_policy_backoff_and_retry_after() -> None:
    policy = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=8)
    assert policy.delay(0, "2") == 2.0
    assert policy.delay(0, "120") == MAX_RETRY_AFTER_SECONDS
    for attempt, ceiling in ((0, 0.5), (1, 1.0), (2, 2.0), (6, 8.0)):
        delay = policy.delay(attempt)
        assert 0.75 * ceiling <= delay <= ceiling
    assert policy.delay(0, "soon") <= 0.5
    assert policy.should_retry(0, 429) and policy.should_retry(2, None)
    assert not policy.should_retry(3, 503) and not policy.should_retry(0, 400)


def test_final_failure_keeps_status_message_and_retry_after(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(*[error_reply(429, "Too many requests", headers={"retry-after": "0"})
                     for _ in range(3)])
    response = post(proxy)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "0"
    assert response.json()["error"] == {"type": "rate_limit_error",
                                        "message": "Too many requests"}


# ---------------------------------------------------------------- broken streams


def test_malformed_line_and_data_without_space_and_comments(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    good = json.dumps(chunk({"content": "one "}))
    upstream.queue(Reply(raw_pieces=[
        b": keep-alive\n\n",
        f"data: {good}\n\n".encode(),
        b"data: {not json at all\n\n",
        f"data:{json.dumps(chunk({'content': 'two'}))}\n\n".encode(),
        b": OPENROUTER PROCESSING\n\n",
        f"data: {json.dumps(chunk({}, 'stop'))}\r\n\r\n".encode(),
        b"data: [DONE]\n\n"]))
    message = accumulate(events_of(post(proxy)))
    assert message["content"] == [{"type": "text", "text": "one two"}]
    assert message["stop_reason"] == "end_turn"


def test_utf8_split_across_network_reads(proxy: ProxyServer,
                                         upstream: ScriptedUpstream) -> None:
    text = "Grüße 👋🏽 — 漢字"
    frame = f"data: {json.dumps(chunk({'content': text}), ensure_ascii=False)}\n\n".encode()
    # cut inside "ü", inside the emoji, and inside "漢"
    cuts = [frame.index("ü".encode()) + 1, frame.index("👋".encode()) + 2,
            frame.index("漢".encode()) + 1]
    pieces = [frame[a:b] for a, b in zip([0, *cuts], [*cuts, len(frame)], strict=True)]
    finish = f"data: {json.dumps(chunk({}, 'stop'))}\n\n".encode()
    upstream.queue(Reply(raw_pieces=[*pieces, finish, b"data: [DONE]\n\n"]))
    message = accumulate(events_of(post(proxy)))
    assert message["content"] == [{"type": "text", "text": text}]
    assert "\ufffd" not in json.dumps(message, ensure_ascii=False)


def test_missing_done_after_finish_reason_ends_normally(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[chunk({"content": "complete"}), chunk({}, "stop")],
                         done=False))
    events = events_of(post(proxy))
    assert [e.name for e in events][-2:] == ["message_delta", "message_stop"]


@pytest.mark.parametrize(("message", "expected"), [
    ("This model's maximum context length is 65536 tokens. However, you requested 70123 "
     "tokens (62123 in the messages, 8000 in the completion).",
     "prompt is too long: 70123 tokens > 65536 maximum"),
    ("Invalid request: Your request exceeded model token limit: 262144", None),
    ("Range of input length should be [1, 129024]", None),
])
def test_context_overflow_is_reworded(message: str, expected: str | None,
                                      proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(error_reply(400, message))
    response = post(proxy)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if expected:
        assert error["message"] == expected
    else:
        limit = [int(n) for n in message.replace("]", " ").replace(",", " ").split()
                 if n.isdigit()][-1]
        assert error["message"].startswith("prompt is too long: ")
        assert error["message"].endswith(f" tokens > {limit} maximum")


# ---------------------------------------------------------------- client faults


def test_thousand_client_disconnects_leave_nothing_open(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """Clients that leave mid-stream cancel the upstream request at once."""
    upstream.responder = lambda body: Reply(events=[
        chunk({"role": "assistant", "content": "first"}), chunk({"content": "never sent"})],
        stall_at=1)

    async def leave_after_first_event(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{proxy.url}/v1/messages", json={
                "model": "claude-sonnet-4-6", "max_tokens": 10, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as response:
            assert response.status_code == 200
            async for _ in response.aiter_raw():
                break  # got message_start: hang up

    async def run_all() -> None:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            for _ in range(20):
                await asyncio.gather(*(leave_after_first_event(client) for _ in range(50)))

    asyncio.run(run_all())
    assert len(upstream.requests) == 1000
    assert upstream.wait_until_idle(), f"{upstream.open_streams} upstream streams still open"
    assert_pool_settles(proxy)


def test_a_stream_ends_without_an_anyio_cancel_scope(
        proxy: ProxyServer, upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that ends, and one whose client leaves, close their upstream with no anyio
    cancel scope: its first use loads anyio's asyncio backend into the server, 0.9 MiB
    resident that nothing else a request does needs (the relay's cancellation is asyncio's
    own, delivered once: server/relay.py)."""
    scopes: list[dict[str, Any]] = []
    monkeypatch.setattr(anyio, "CancelScope", lambda **options: scopes.append(options))
    upstream.responder = lambda body: Reply(events=[
        chunk({"role": "assistant", "content": "first"}), chunk({"content": "never sent"})],
        stall_at=1)
    request = {"model": "claude-sonnet-4-6", "max_tokens": 10, "stream": True,
               "messages": [{"role": "user", "content": "hi"}]}
    sock = raw_request(proxy, request)
    assert b"message_start" in sock.recv(65536)
    sock.close()  # the client leaves: the relay is cancelled
    assert upstream.wait_until_idle(), f"{upstream.open_streams} upstream streams still open"
    upstream.responder = lambda body: Reply(events=[chunk({"content": "all"}),
                                                    chunk({}, finish="stop")])
    with httpx.Client(timeout=30) as client:
        answer = client.post(f"{proxy.url}/v1/messages", json=request)
    assert b"event: message_stop" in answer.content
    assert_pool_settles(proxy)
    assert scopes == []


def assert_pool_settles(proxy: ProxyServer) -> None:
    client = proxy.app.state.wiring.service.client
    assert eventually(lambda: client.connection_counts()["active"] == 0), (
        client.connection_counts())


def raw_request(proxy: ProxyServer, body: dict[str, Any]) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_before_first_byte_cancels_upstream(
        stream: bool, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    reached = threading.Event()

    def stall(body: dict[str, Any]) -> Reply:
        reached.set()
        if stream:
            return Reply(events=[chunk({"content": "x"})], stall_at=0)
        return Reply(body={}, stall_at=0)

    upstream.responder = stall
    for _ in range(20):
        reached.clear()
        sock = raw_request(proxy, {"model": "claude-sonnet-4-6", "max_tokens": 10,
                                   "stream": stream,
                                   "messages": [{"role": "user", "content": "hi"}]})
        assert reached.wait(30)
        sock.close()
        assert upstream.wait_until_idle()
    assert_pool_settles(proxy)


def test_finished_streams_leave_their_upstream_connection_for_the_next(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """A stream read to its `[DONE]` is read to its body's end too, so its connection goes
    back to the pool: three streams in a row use one upstream connection."""
    for n in range(3):
        upstream.queue(text_stream([f"answer {n}"]))
        assert accumulate(events_of(post(proxy)))["content"][0]["text"] == f"answer {n}"
        assert_pool_settles(proxy)
        assert proxy.app.state.wiring.service.client.connection_counts() == {"active": 0, "idle": 1}


def test_proxy_keeps_working_after_faults(proxy: ProxyServer,
                                          upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["still ", "fine"]), completion({"content": "also fine"}))
    assert accumulate(events_of(post(proxy)))["content"][0]["text"] == "still fine"
    assert post(proxy, stream=False).json()["content"][0]["text"] == "also fine"


@pytest.mark.parametrize(("message", "field"), [
    ("Unrecognized request argument supplied: stream_options", "stream_options"),
    ("body.user: Extra inputs are not permitted", "user"),
    ("Unsupported parameter: 'parallel_tool_calls'", "parallel_tool_calls"),
])
def test_refused_optional_field_is_left_out_from_then_on(
        message: str, field: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)

    def respond(body: dict[str, Any]) -> Reply:
        if field in body:
            return error_reply(400, message)
        return text_stream(["fine"])

    upstream.responder = respond
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    fields = {"metadata": {"user_id": "u-1"}, "tools": tools,
              "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    for _ in range(2):
        message_ = accumulate(events_of(post(proxy, **fields)))
        assert message_["content"] == [{"type": "text", "text": "fine"}]
    assert [field in request for request in upstream.requests] == [True, False, False]


def test_a_400_about_messages_is_not_mistaken_for_a_refused_field(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(error_reply(400, "messages: the first message must have role user"))
    response = post(proxy, metadata={"user_id": "u-1"})
    assert response.status_code == 400 and len(upstream.requests) == 1
