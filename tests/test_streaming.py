"""Through the real proxy: the anthropic SDK and a strict SSE reader against scripted upstreams."""

from __future__ import annotations

import gc
import json
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import UPSTREAM_KEY, ProxyServer, eventually
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    text_stream,
    transcript_chunks,
)
from tests.sse_grammar import Event, accumulate, check_grammar, parse_sse
from tests.test_response_converter import STREAM_STEMS, expected_from_chunks

USAGE = {"prompt_tokens": 1200, "completion_tokens": 34, "total_tokens": 1234,
         "prompt_tokens_details": {"cached_tokens": 1000}}


def sdk(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)


def ask(**fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 512,
                               "messages": [{"role": "user", "content": "hello"}]}
    request.update(fields)
    return request


def stream_raw(proxy: ProxyServer, **fields: Any) -> tuple[httpx.Response, list[Event]]:
    response = httpx.post(f"{proxy.url}/v1/messages?beta=true", json=ask(stream=True, **fields),
                          timeout=30)
    events = parse_sse(response.content) if response.status_code == 200 else []
    return response, events


def stream_ok(proxy: ProxyServer, **fields: Any) -> list[Event]:
    """A 200 event stream whose grammar holds."""
    response, events = stream_raw(proxy, **fields)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    check_grammar(events)
    return events


def test_sdk_stream_text_and_usage(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["Hel", "lo, ", "wörld 👋"], usage=USAGE))
    with sdk(proxy).messages.stream(**ask()) as stream:
        message = stream.get_final_message()
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello, wörld 👋"  # type: ignore[union-attr]
    assert message.model == "claude-sonnet-4-6"
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 200
    assert message.usage.cache_read_input_tokens == 1000
    assert message.usage.output_tokens == 34
    sent = upstream.requests[0]
    assert sent["model"] == "middle-upstream"
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_sdk_create_non_streaming_with_tool_use(proxy: ProxyServer,
                                                upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "Checking.", "tool_calls": [
        {"id": "call_7", "type": "function",
         "function": {"name": "Bash", "arguments": '{"command": "ls -la"}'}}]},
        finish="tool_calls", usage=USAGE))
    message = sdk(proxy).messages.create(**ask(model="claude-opus-4-1"))
    assert [block.type for block in message.content] == ["text", "tool_use"]
    tool_use = message.content[1]
    assert tool_use.id == "call_7" and tool_use.name == "Bash"  # type: ignore[union-attr]
    assert tool_use.input == {"command": "ls -la"}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    assert message.model == "claude-opus-4-1"
    assert upstream.requests[0]["model"] == "big-upstream"
    assert "stream" not in upstream.requests[0]


def test_tool_arguments_in_many_fragments_stream_incrementally(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    arguments = json.dumps({"path": "/tmp/some file.txt", "limit": 20, "nested": {"a": [1, 2]}})
    pieces = [arguments[i:i + 3] for i in range(0, len(arguments), 3)]
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "tool_calls": [
        {"index": 0, "id": "call_frag", "type": "function",
         "function": {"name": "Read", "arguments": ""}}]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
               for p in pieces]
    events.append(chunk({}, "tool_calls"))
    upstream.queue(Reply(events=events))
    parsed = stream_ok(proxy)
    partials = [e.data["delta"]["partial_json"] for e in parsed
                if e.name == "content_block_delta"]
    assert partials == pieces  # one delta per upstream fragment, in order
    message = accumulate(parsed)
    assert message["content"][0]["input"] == json.loads(arguments)


def test_parallel_interleaved_tool_calls(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[
        chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "add", "arguments": '{"a": 1, '}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "mul", "arguments": '{"x": 3, '}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '"y": 4}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"b": 2}'}}]}),
        chunk({}, "tool_calls"),
    ]))
    with sdk(proxy).messages.stream(**ask()) as stream:
        message = stream.get_final_message()
    assert [(b.name, b.input) for b in message.content] == [  # type: ignore[union-attr]
        ("add", {"a": 1, "b": 2}), ("mul", {"x": 3, "y": 4})]
    assert message.stop_reason == "tool_use"


def test_no_usage_from_upstream_gives_integer_estimates(proxy: ProxyServer,
                                                        upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["a" * 80]))
    events = stream_ok(proxy)
    usage = events[-2].data["usage"]
    assert usage["output_tokens"] == 20
    assert isinstance(usage["input_tokens"], int) and usage["input_tokens"] > 0


def test_finish_length_is_max_tokens(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["cut"], finish="length"))
    with sdk(proxy).messages.stream(**ask()) as stream:
        assert stream.get_final_message().stop_reason == "max_tokens"


def test_upstream_json_instead_of_stream_is_replayed_as_events(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "buffered answer"}, usage=USAGE))
    events = stream_ok(proxy)
    assert accumulate(events)["content"] == [{"type": "text", "text": "buffered answer"}]


@pytest.mark.parametrize("stem", STREAM_STEMS)
def test_recorded_provider_streams_through_the_proxy(
        stem: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """Each recorded stream is served byte for byte; the SDK's accumulator is the judge."""
    client = sdk(proxy)
    with client.messages.stream(**ask(messages=[
            {"role": "user", "content": f"SCENARIO:replay:{stem}"}])) as stream:
        message = stream.get_final_message()
    expected = expected_from_chunks(transcript_chunks(stem))
    if expected["text"].lstrip().startswith("<think>"):
        # Issue 10: a leading <think> is split for every model; thinking is off here, so the
        # tagged text is removed.
        expected["text"] = expected["text"].split("</think>", 1)[1]
    thinking = "".join(b.thinking for b in message.content if b.type == "thinking")
    text = "".join(b.text for b in message.content if b.type == "text")
    tools = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert (thinking, text, tools) == (expected["thinking"], expected["text"], expected["tools"])
    assert message.stop_reason == ("tool_use" if tools else message.stop_reason)
    assert isinstance(message.usage.output_tokens, int) and message.usage.output_tokens > 0


# ---------------------------------------------------------------- upstream failures


def test_upstream_429_keeps_status_type_and_retry_after(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(error_reply(429, "Rate limit reached for requests",
                               headers={"retry-after": "7"}))
    response, _ = stream_raw(proxy)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json() == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "Rate limit reached for requests"}}


@pytest.mark.parametrize(("status", "error_type"), [
    (400, "invalid_request_error"), (401, "authentication_error"),
    (403, "permission_error"), (404, "not_found_error"),
    (503, "overloaded_error"), (529, "overloaded_error"), (500, "api_error"),
])
def test_upstream_errors_before_first_byte(
        status: int, error_type: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(error_reply(status, f"upstream says {status}"))
    for stream in (True, False):
        upstream.queue(error_reply(status, f"upstream says {status}"))
        response = httpx.post(f"{proxy.url}/v1/messages", json=ask(stream=stream), timeout=30)
        assert response.status_code == status
        assert response.json() == {"type": "error", "error": {
            "type": error_type, "message": f"upstream says {status}"}}


def test_sdk_raises_the_matching_exception(proxy_factory: Callable[..., ProxyServer],
                                           upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(error_reply(400, "model not found: nope"))
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(proxy).messages.create(**ask())
    assert "model not found: nope" in str(raised.value)


def test_retries_before_first_byte_then_succeeds(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(error_reply(503, "busy"), error_reply(429, "slow down",
                                                         headers={"retry-after": "0"}),
                   text_stream(["third time lucky"]))
    events = stream_ok(proxy)
    assert accumulate(events)["content"][0]["text"] == "third time lucky"
    assert len(upstream.requests) == 3


def test_retries_exhausted_keep_the_last_error(proxy: ProxyServer,
                                               upstream: ScriptedUpstream) -> None:
    upstream.queue(*[error_reply(500, f"boom {i}") for i in range(3)])
    response, _ = stream_raw(proxy)
    assert response.status_code == 500
    assert response.json()["error"] == {"type": "api_error", "message": "boom 2"}
    assert len(upstream.requests) == 3  # 1 + MAX_RETRIES


def test_error_in_first_chunk_is_a_real_http_error(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(Reply(events=[{"error": {"message": "quota exceeded", "code": 429}}]))
    response, _ = stream_raw(proxy)
    assert response.status_code == 429
    assert response.json()["error"] == {"type": "rate_limit_error", "message": "quota exceeded"}


def test_mid_stream_drop_closes_blocks_then_sends_error(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[
        chunk({"role": "assistant", "reasoning_content": "hmm"}),
        chunk({"content": "partial ans"}),
        chunk({"content": "wer"}),
        chunk({}, "stop"),
    ], cut_after=2))
    response, events = stream_raw(proxy)
    assert response.status_code == 200
    check_grammar(events)
    assert [e.name for e in events][-3:] == ["content_block_delta", "content_block_stop",
                                             "error"]
    assert events[-1].data["error"]["type"] == "overloaded_error"
    message = accumulate(events)
    assert message["content"][1]["text"] == "partial ans"


def test_stream_without_done_or_finish_reason_ends_in_error(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[chunk({"content": "never finished"})], done=False))
    events = stream_ok(proxy)
    assert events[-1].name == "error"
    assert events[-2].name == "content_block_stop"


def test_error_object_mid_stream(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[chunk({"content": "so far"}),
                                 {"error": {"message": "Internal error", "code": 500}}]))
    events = stream_ok(proxy)
    assert events[-1].data["error"] == {"type": "overloaded_error", "message": "Internal error"}
    with pytest.raises(anthropic.APIStatusError):
        upstream.queue(Reply(events=[chunk({"content": "so far"}),
                                     {"error": {"message": "Internal error", "code": 500}}]))
        with sdk(proxy).messages.stream(**ask()) as stream:
            stream.get_final_message()


def test_only_the_upstream_key_and_no_client_headers_go_upstream(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["ok"]))
    httpx.post(f"{proxy.url}/v1/messages", json=ask(stream=True), timeout=30, headers={
        "x-api-key": "client-key", "anthropic-beta": "interleaved-thinking-2025-05-14",
        "anthropic-version": "2023-06-01", "x-claude-code-session-id": "abc"})
    headers = upstream.headers[0]
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    for name in ("x-api-key", "anthropic-beta", "anthropic-version", "x-claude-code-session-id"):
        assert name not in headers


def test_an_open_stream_holds_its_conversation_as_bytes_only(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """A stream stays open for seconds to minutes, and a Claude Code conversation parsed and
    converted is about 1.5 times its JSON. Once the answer has begun, the request keeps the
    conversation only as the bytes it came in and went out as (the inspector's), which the
    inspector shows once the request is over."""
    marker = f"conversation-{uuid.uuid4().hex}"
    upstream.queue(Reply(events=[chunk({"role": "assistant", "content": "first"}),
                                 chunk({"content": " words"}, "stop")], stall_at=1))
    content = json.dumps(ask(stream=True, messages=[
        {"role": "user", "content": [{"type": "text", "text": marker}]}])).encode()
    with httpx.stream("POST", f"{proxy.url}/v1/messages", content=content,
                      headers={"content-type": "application/json"}, timeout=30) as response:
        chunks = response.iter_raw()  # kept: a dropped iterator closes the response
        assert b'"text":"first"' in next(chunks)
        (record,) = [flight.record for flight in proxy.app.state.recorder.in_flight.values()
                     if marker.encode() in (flight.record.client_json or b"")]
        assert eventually(lambda: (record.client_body, record.upstream_body) == (None, None))
        assert marker.encode() in record.client_json and marker.encode() in record.upstream_json
        assert record.client_request()["messages"][0]["content"][0]["text"] == marker
        assert held_by_the_proxy(marker, upstream) == []

    def inspected() -> Any:
        answer = httpx.get(f"{proxy.url}/ui/api/requests/{record.request_id}")
        return answer.json() if answer.status_code == 200 else None

    assert eventually(lambda: (inspected() or {}).get("kept") is True)
    view = inspected()
    assert marker in json.dumps(view["client"]) and marker in json.dumps(view["upstream"])


def held_by_the_proxy(text: str, upstream: ScriptedUpstream) -> list[dict[str, Any]]:
    """Every live dict holding `text` as a value, but the scripted upstream's copies of the
    requests it received (it runs in this process too). A dict of strings only is not
    tracked by the collector: it is found through the tracked list or dict holding it."""
    gc.collect()
    theirs = set()
    pending: list[Any] = list(upstream.requests)
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            theirs.add(id(item))
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    found: dict[int, dict[str, Any]] = {}
    for container in gc.get_objects():
        if isinstance(container, dict):
            candidates = [container, *container.values()]
        elif isinstance(container, list):
            candidates = list(container)
        else:
            continue
        for candidate in candidates:
            if (type(candidate) is dict and id(candidate) not in theirs
                    and any(type(value) is str and value == text
                            for value in list(candidate.values()))):
                found[id(candidate)] = candidate
    return list(found.values())
