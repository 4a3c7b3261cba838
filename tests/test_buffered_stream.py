"""Buffered upstream answers (one JSON body) replayed through the same state machine."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.conversion.signatures import ThinkingSigner
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, completion, load_transcript
from tests.sse_grammar import accumulate, check_grammar, parse_sse

SECRET = "buffered-secret"
SIGNER = ThinkingSigner(SECRET)
JSON_STEMS = ["deepseek-reasoner-json", "zai-glm47flash-reasoning-tool-json",
              "ollama-cloud-gpt-oss-20b-reasoning-tool-json", "ollama-qwen3-06b-reasoning-json"]


def expected_blocks(stem: str) -> list[tuple[str, Any]]:
    """[thinking, text, tool_use…] straight from the recorded JSON message."""
    message = load_transcript(stem)["body"]["choices"][0]["message"]
    blocks: list[tuple[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        blocks.append(("thinking", reasoning))
    if message.get("content"):
        blocks.append(("text", message["content"]))
    for call in message.get("tool_calls") or []:
        blocks.append(("tool_use", (call["function"]["name"],
                                    json.loads(call["function"]["arguments"]))))
    return blocks


def as_pairs(content: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for block in content:
        if block["type"] == "thinking":
            assert SIGNER.verify(block["thinking"], block["signature"])
            pairs.append(("thinking", block["thinking"]))
        elif block["type"] == "text":
            pairs.append(("text", block["text"]))
        else:
            pairs.append(("tool_use", (block["name"], block["input"])))
    return pairs


@pytest.fixture
def proxy(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    return proxy_factory(thinking_signature_secret=SECRET,
                         buffer_stream_model_prefixes="buffered-model,middle-upstream")


def ask(stem: str | None, stream: bool) -> dict[str, Any]:
    prompt = f"SCENARIO:replay:{stem}" if stem else "hello"
    return {"model": "claude-sonnet-4-6", "max_tokens": 1000, "stream": stream,
            "messages": [{"role": "user", "content": prompt}]}


@pytest.mark.parametrize("stem", JSON_STEMS)
def test_streaming_client_gets_events_from_a_json_answer(
        stem: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json=ask(stem, True), timeout=30)
    assert response.status_code == 200
    events = parse_sse(response.content)
    check_grammar(events)
    assert as_pairs(accumulate(events)["content"]) == expected_blocks(stem)
    # middle-upstream is in BUFFER_STREAM_MODEL_PREFIXES: fetched without streaming
    assert "stream" not in upstream.requests[-1]
    assert "stream_options" not in upstream.requests[-1]


@pytest.mark.parametrize("stem", JSON_STEMS)
def test_non_streaming_client_gets_thinking_text_tool_use(
        stem: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json=ask(stem, False), timeout=30)
    message = response.json()
    assert as_pairs(message["content"]) == expected_blocks(stem)
    usage = load_transcript(stem)["body"]["usage"]
    assert message["usage"]["output_tokens"] == usage["completion_tokens"]
    sdk_message = anthropic.Anthropic(base_url=proxy.url, api_key="x").messages.create(
        **{k: v for k, v in ask(stem, False).items() if k != "stream"})
    assert [b.type for b in sdk_message.content] == [kind for kind, _ in expected_blocks(stem)]


def test_upstream_that_ignores_stream_is_replayed(proxy_factory: Callable[..., ProxyServer],
                                                  upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(thinking_signature_secret=SECRET)
    upstream.queue(completion({"reasoning_content": "R", "content": "C"}))
    response = httpx.post(f"{proxy.url}/v1/messages", json=ask(None, True), timeout=30)
    events = parse_sse(response.content)
    check_grammar(events)
    assert upstream.requests[-1]["stream"] is True  # it asked for a stream and got JSON
    assert as_pairs(accumulate(events)["content"]) == [("thinking", "R"), ("text", "C")]


def test_buffered_upstream_error_keeps_its_status(proxy: ProxyServer,
                                                  upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(status=429, body={"error": {"message": "slow down"}},
                         headers={"retry-after": "0"}),
                   Reply(status=429, body={"error": {"message": "slow down"}},
                         headers={"retry-after": "0"}),
                   Reply(status=429, body={"error": {"message": "slow down"}},
                         headers={"retry-after": "0"}))
    response = httpx.post(f"{proxy.url}/v1/messages", json=ask(None, True), timeout=30)
    assert response.status_code == 429
    assert response.json()["error"] == {"type": "rate_limit_error", "message": "slow down"}
