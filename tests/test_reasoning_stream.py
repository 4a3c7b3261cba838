"""Reasoning end to end through the proxy: the parameters each provider receives, and the
thinking blocks the client gets back from that provider's recorded wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from claude_proxy.conversion.signatures import ThinkingSigner
from tests.conftest import ProxyServer
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    load_transcript,
    text_stream,
    transcript_chunks,
)
from tests.test_response_converter import expected_from_chunks

SECRET = "signature-secret-for-tests"
SIGNER = ThinkingSigner(SECRET)
BASH = {"name": "Bash", "description": "Run a command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def reasoning_proxy(factory: Callable[..., ProxyServer], provider: str, model: str,
                    **overrides: Any) -> ProxyServer:
    return factory(provider=provider, middle_model=model, thinking_signature_secret=SECRET,
                   reasoning_with_tools=True, **overrides)


def sdk(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)


def stream_message(proxy: ProxyServer, **fields: Any) -> Any:
    request: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 64000,
                               "messages": [{"role": "user", "content": "hi"}]}
    request.update(fields)
    with sdk(proxy).messages.stream(**request) as stream:
        return stream.get_final_message()


def replay(stem: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"SCENARIO:replay:{stem}"}]


def assert_matches_transcript(message: Any, stem: str) -> None:
    expected = expected_from_chunks(transcript_chunks(stem))
    thinking_blocks = [b for b in message.content if b.type == "thinking"]
    assert "".join(b.thinking for b in thinking_blocks) == expected["thinking"]
    assert expected["thinking"], "the transcript carries reasoning"
    for block in thinking_blocks:
        assert SIGNER.verify(block.thinking, block.signature)
    assert message.content[0].type == "thinking"
    assert "".join(b.text for b in message.content if b.type == "text") == expected["text"]
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == expected[
        "tools"]


ADAPTIVE_HIGH = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}


@pytest.mark.parametrize(("provider", "stem", "fields", "sent"), [
    ("deepseek", "deepseek-reasoner-tool", ADAPTIVE_HIGH,
     {"thinking": {"type": "enabled"}}),
    ("deepseek", "deepseek-reasoner", {"thinking": {"type": "enabled", "budget_tokens": 4000}},
     {"thinking": {"type": "enabled"}}),
    ("glm", "zai-glm47flash-reasoning-tool", ADAPTIVE_HIGH, {"thinking": {"type": "enabled"}}),
    ("glm", "zai-glm47flash-parallel-tools", ADAPTIVE_HIGH, {"thinking": {"type": "enabled"}}),
    ("kimi", "avian-kimi-k25-parallel-tools", ADAPTIVE_HIGH, {"thinking": {"type": "enabled"}}),
    ("dashscope", "dashscope-qwen3max-reasoning",
     {"thinking": {"type": "enabled", "budget_tokens": 6000}},
     {"enable_thinking": True, "thinking_budget": 6000}),
    ("openrouter", "openrouter-kimi-k25-reasoning-tool", ADAPTIVE_HIGH,
     {"reasoning": {"effort": "high"}}),
    ("openrouter", "openrouter-claude-sonnet45-reasoning",
     {"thinking": {"type": "enabled", "budget_tokens": 2000}}, {"reasoning": {"max_tokens": 2000}}),
    ("vllm", "llamacpp-gpt-oss-20b-reasoning-tool", ADAPTIVE_HIGH,
     {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}}),
])
def test_provider_parameters_and_thinking_blocks(
        provider: str, stem: str, fields: dict[str, Any], sent: dict[str, Any],
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    model = load_transcript(stem)["model"]
    proxy = reasoning_proxy(proxy_factory, provider, model, reasoning_chat_max_output_tokens=24000)
    message = stream_message(proxy, messages=replay(stem), tools=[BASH], **fields)
    assert_matches_transcript(message, stem)
    request = upstream.requests[-1]
    assert request["model"] == model
    for key, value in sent.items():
        assert request[key] == value
    assert request["max_tokens"] == 24000
    assert request["tools"][0]["function"]["name"] == "Bash"


def test_xai_reasoning_effort_for_a_configured_chat_prefix(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "openai", "grok-3-mini",
                            reasoning_chat_prefixes="grok-3-mini")
    stem = "xai-grok3mini-reasoning-tool"
    message = stream_message(proxy, messages=replay(stem), tools=[BASH],
                             thinking={"type": "enabled", "budget_tokens": 3000})
    assert_matches_transcript(message, stem)
    assert upstream.requests[-1]["reasoning_effort"] == "low"
    assert message.usage.output_tokens == 27 + 313  # reasoning counted apart by xAI


def test_azure_reasoning_model_gets_only_reasoning_effort(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # Issue 10: gpt-5 goes to /responses unless RESPONSES_API=false; this is the chat path.
    proxy = proxy_factory(provider="azure", azure_api_version="2024-12-01-preview",
                          middle_model="gpt-5-mini", reasoning_with_tools=True,
                          responses_api=False)
    message = stream_message(proxy, messages=replay("azure-gpt5mini-tool"), tools=[BASH],
                             **ADAPTIVE_HIGH)
    request = upstream.requests[-1]
    assert request["reasoning_effort"] == "high"
    # REASONING_CHAT_MAX_OUTPUT_TOKENS (profile: 32768) while reasoning is on
    assert "max_tokens" not in request and request["max_completion_tokens"] == 32768
    for field in ("thinking", "enable_thinking", "reasoning", "chat_template_kwargs"):
        assert field not in request
    assert upstream.headers[-1]["api-key"]
    assert [b.type for b in message.content] == ["tool_use"]


def test_think_tags_become_thinking_for_configured_models(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "openai", "deepseek-r1-distill-llama-70b")
    stem = "groq-r1distill-think-tags"
    message = stream_message(proxy, messages=replay(stem), **ADAPTIVE_HIGH)
    full = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                   for c in transcript_chunks(stem))
    thinking = full[full.index("<think>") + 7:full.index("</think>")]
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == thinking
    assert SIGNER.verify(thinking, message.content[0].signature)
    assert message.content[1].text == full[full.index("</think>") + 8:]
    # The same model with a parsed reasoning field: the answer stays text.
    parsed = stream_message(proxy, messages=replay("groq-r1distill-reasoning-field"),
                            **ADAPTIVE_HIGH)
    assert_matches_transcript(parsed, "groq-r1distill-reasoning-field")


def test_think_tags_removed_when_thinking_is_disabled(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "openai", "deepseek-ai/DeepSeek-R1")
    stem = "together-deepseek-r1-think-tags"
    message = stream_message(proxy, messages=replay(stem), thinking={"type": "disabled"})
    full = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                   for c in transcript_chunks(stem))
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == full[full.index("</think>") + 8:]
    assert "<think>" not in message.content[0].text


def test_encrypted_reasoning_never_becomes_thinking_text(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "openrouter", "google/gemini-3.1-flash-lite-preview")
    message = stream_message(proxy, messages=replay("openrouter-gemini-encrypted-reasoning-tools"),
                             tools=[BASH], **ADAPTIVE_HIGH)
    # Issue 10: the encrypted entry travels in an empty thinking block's signature.
    assert [b.type for b in message.content] == ["thinking", "tool_use", "tool_use"]
    assert message.content[0].thinking == ""
    envelope = SIGNER.verify("", message.content[0].signature)
    assert envelope is not None and envelope.opaque[0]["type"] == "reasoning.encrypted"


def test_mid_stream_failure_with_open_thinking_block(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    import httpx

    from tests.sse_grammar import check_grammar, parse_sse
    proxy = reasoning_proxy(proxy_factory, "deepseek", "deepseek-reasoner")
    upstream.queue(Reply(events=[chunk({"reasoning_content": "step one, "}),
                                 chunk({"reasoning_content": "step two"}),
                                 chunk({"content": "never"}), chunk({}, "stop")], cut_after=2))
    response = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True, **ADAPTIVE_HIGH,
        "messages": [{"role": "user", "content": "hi"}]})
    events = parse_sse(response.content)
    check_grammar(events)
    names = [(e.name, e.data.get("delta", {}).get("type")) for e in events]
    assert names[-3:] == [("content_block_delta", "signature_delta"),
                          ("content_block_stop", None), ("error", None)]
    assert SIGNER.verify("step one, step two", events[-3].data["delta"]["signature"])


# ---------------------------------------------------------------- passback and fallback


def deepseek_strict_responder(calls: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Reply]:
    """A DeepSeek-like upstream: 400 unless every assistant tool-call turn carries
    reasoning_content; otherwise the first turn calls a tool and the second answers."""
    def respond(body: dict[str, Any]) -> Reply:
        calls.append(body)
        for index, message in enumerate(body["messages"]):
            if message["role"] == "assistant" and message.get("tool_calls") and not isinstance(
                    message.get("reasoning_content"), str):
                return error_reply(400, "The reasoning_content in the thinking mode must be "
                                        f"passed back to the API. (message {index})")
        if body["messages"][-1]["role"] == "tool":
            return text_stream(["The directory has ", body["messages"][-1]["content"]])
        return Reply(events=[
            chunk({"role": "assistant", "reasoning_content": "I should list "}),
            chunk({"reasoning_content": "the files."}),
            chunk({"tool_calls": [{"index": 0, "id": "call_ds_1", "type": "function",
                                   "function": {"name": "Bash", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "ls"}'}}]}),
            chunk({}, "tool_calls")])
    return respond


def test_deepseek_tool_loop_passes_reasoning_back(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "deepseek", "deepseek-reasoner")
    calls: list[dict[str, Any]] = []
    upstream.responder = deepseek_strict_responder(calls)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list files"}]
    first = stream_message(proxy, messages=messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "I should list the files."
    assert first.content[1].input == {"command": "ls"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id,
                                      "content": "a.txt b.txt"}]}]
    second = stream_message(proxy, messages=messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [b.text for b in second.content if b.type == "text"] == [
        "The directory has a.txt b.txt"]
    assert [m["role"] for m in calls[1]["messages"]] == ["user", "assistant", "tool"]
    assert calls[1]["messages"][1]["reasoning_content"] == "I should list the files."
    assert calls[1]["thinking"] == {"type": "enabled"}


def test_refused_reasoning_parameter_falls_back_and_is_remembered(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = reasoning_proxy(proxy_factory, "dashscope", "qwen3-refuses-thinking")

    def respond(body: dict[str, Any]) -> Reply:
        if "enable_thinking" in body:
            return error_reply(400, "Unrecognized request argument supplied: enable_thinking")
        if not body.get("stream"):
            return completion({"content": "fine without it"})
        return text_stream(["fine without it"])

    upstream.responder = respond
    with caplog.at_level(logging.WARNING, logger="claude_proxy.service"):
        first = stream_message(proxy, **ADAPTIVE_HIGH)
    assert first.content[0].text == "fine without it"
    assert ["enable_thinking" in r for r in upstream.requests] == [True, False]
    assert any("refused the reasoning fields" in r.getMessage() for r in caplog.records)
    second = stream_message(proxy, **ADAPTIVE_HIGH)
    assert second.content[0].text == "fine without it"
    assert ["enable_thinking" in r for r in upstream.requests] == [True, False, False]
    # A non-streaming request to the same model skips the fields too.
    sdk(proxy).messages.create(model="claude-sonnet-4-6", max_tokens=10, messages=[
        {"role": "user", "content": "x"}], **ADAPTIVE_HIGH)
    assert "enable_thinking" not in upstream.requests[-1]


def test_unrelated_400_is_not_retried(proxy_factory: Callable[..., ProxyServer],
                                      upstream: ScriptedUpstream) -> None:
    proxy = reasoning_proxy(proxy_factory, "dashscope", "qwen3-max")
    upstream.queue(error_reply(400, "messages: content must not be empty"))
    with pytest.raises(anthropic.BadRequestError):
        stream_message(proxy, **ADAPTIVE_HIGH)
    assert len(upstream.requests) == 1


def test_debug_log_names_the_added_fields(proxy_factory: Callable[..., ProxyServer],
                                          upstream: ScriptedUpstream,
                                          caplog: pytest.LogCaptureFixture) -> None:
    proxy = reasoning_proxy(proxy_factory, "dashscope", "qwen3-max")
    upstream.queue(text_stream(["ok"]))
    with caplog.at_level(logging.DEBUG, logger="claude_proxy"):
        stream_message(proxy, **ADAPTIVE_HIGH)
    lines = [r.getMessage() for r in caplog.records if "extra_json" in r.getMessage()]
    assert lines == ["upstream request model=qwen3-max extra_json: {'enable_thinking': True}"]
    outbound = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
        "SSE outbound")]
    assert len(outbound) == 6 and json.loads(outbound[0][len("SSE outbound: "):])["type"] == (
        "message_start")
