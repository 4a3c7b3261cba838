"""Refusals: an upstream's `finish_reason: "content_filter"` reaches the client as Anthropic's
`stop_reason: "refusal"` with `stop_details`, streamed (inside `message_delta.delta`) and not,
through the real proxy, the anthropic SDK and the strict SSE grammar."""

from __future__ import annotations

import anthropic
import httpx

from tests.conftest import ProxyServer
from tests.scripted_upstream import ScriptedUpstream, completion, text_stream
from tests.sse_grammar import accumulate, check_grammar, parse_sse

DETAILS = {"type": "refusal", "category": None,
           "explanation": "The upstream provider's content filter stopped the answer."}
ASK = {"model": "claude-sonnet-4-6", "max_tokens": 256,
       "messages": [{"role": "user", "content": "tell me"}]}


def test_streamed_content_filter_is_a_refusal(proxy: ProxyServer,
                                              upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["I can", "not"], finish="content_filter"))
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "stream": True}, timeout=30)
    events = parse_sse(response.content)
    check_grammar(events)
    end = next(event.data for event in events if event.name == "message_delta")
    assert end["delta"] == {"stop_reason": "refusal", "stop_sequence": None,
                            "stop_details": DETAILS}
    message = accumulate(events)
    assert message["content"] == [{"type": "text", "text": "I cannot"}]
    assert message["stop_details"] == DETAILS


def test_non_streamed_content_filter_is_a_refusal(proxy: ProxyServer,
                                                  upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": ""}, finish="content_filter"))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    message = client.messages.create(**ASK)  # type: ignore[call-overload]
    assert message.stop_reason == "refusal"
    assert message.stop_details is not None
    assert message.stop_details.model_dump() == DETAILS


def test_sdk_stream_sees_the_refusal(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["no"], finish="content_filter"))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    with client.messages.stream(**ASK) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert message.stop_reason == "refusal"
    assert message.stop_details is not None and message.stop_details.type == "refusal"


def test_other_endings_carry_no_stop_details(proxy: ProxyServer,
                                            upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["fine"]))
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "stream": True}, timeout=30)
    events = parse_sse(response.content)
    check_grammar(events)
    end = next(event.data for event in events if event.name == "message_delta")
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
