"""apply_reasoning_parameters and passback: the exact fields each dialect gets."""

from __future__ import annotations

from typing import Any

import pytest

from claude_proxy.config.settings import Settings
from claude_proxy.conversion.reasoning import level_for_budget, requested_reasoning
from claude_proxy.conversion.request_converter import UpstreamRequest, convert_request
from claude_proxy.conversion.signatures import ThinkingSigner

SIGNER = ThinkingSigner("passback-secret")
TOOLS = [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]


def settings(provider: str, **overrides: Any) -> Settings:
    return Settings(openai_api_key="k", provider=provider, **overrides)


def convert(config: Settings, model: str, **fields: Any) -> UpstreamRequest:
    request: dict[str, Any] = {"model": model, "max_tokens": 128000,
                               "messages": [{"role": "user", "content": "hi"}]}
    request.update(fields)

    def is_ours(block: dict[str, Any]) -> bool:
        signature = block.get("signature")
        return not signature or SIGNER.verify(block.get("thinking", ""), signature)

    return convert_request(request, config, is_ours=is_ours)


ADAPTIVE = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}
DISABLED = {"thinking": {"type": "disabled"}}


@pytest.mark.parametrize(("budget", "level"), [
    (1024, "minimal"), (2048, "minimal"), (2049, "low"), (4096, "low"), (8192, "medium"),
    (8193, "high"), (31999, "high")])
def test_budget_levels(budget: int, level: str) -> None:
    assert level_for_budget(budget) == level
    wanted = requested_reasoning({"thinking": {"type": "enabled", "budget_tokens": budget}},
                                 settings("openai"))
    assert (wanted.level, wanted.budget) == (level, budget)


@pytest.mark.parametrize(("fields", "level"), [
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, "low"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "xhigh"}}, "high"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
    ({"thinking": {"type": "adaptive", "display": "updates"}}, "medium"),  # REASONING_EFFORT
    ({"thinking": {"type": "disabled"}}, None),
    ({}, None),  # REASONING_DEFAULT_ENABLED is false by default
])
def test_level_from_client_intent(fields: dict[str, Any], level: str | None) -> None:
    assert requested_reasoning(fields, settings("openai")).level == level


def test_default_enabled_uses_configured_effort() -> None:
    config = settings("openai", reasoning_default_enabled=True, reasoning_effort="low")
    assert requested_reasoning({}, config).level == "low"


# ---------------------------------------------------------------- the five dialects


@pytest.mark.parametrize(("provider", "model", "fields", "expected"), [
    # enable_thinking (DashScope / Qwen), with the client's budget
    ("dashscope", "qwen3-max", {"thinking": {"type": "enabled", "budget_tokens": 5000}},
     {"enable_thinking": True, "thinking_budget": 5000}),
    ("dashscope", "qwen3-max", ADAPTIVE, {"enable_thinking": True}),
    ("dashscope", "qwen3-max", DISABLED, {"enable_thinking": False}),
    # thinking: {type} (GLM, DeepSeek, Kimi)
    ("glm", "glm-4.7", ADAPTIVE, {"thinking": {"type": "enabled"}}),
    # GLM-5.x keeps its earlier reasoning; 5.2+ always think, so "off" is left unsaid
    ("glm", "glm-5", ADAPTIVE, {"thinking": {"type": "enabled", "clear_thinking": False}}),
    ("glm", "glm-5.1", DISABLED, {"thinking": {"type": "disabled"}}),
    ("glm", "glm-5.3-flash", DISABLED, {}),
    # Kimi K3: top-level reasoning_effort, never the K2.x thinking object
    ("kimi", "kimi-k3", ADAPTIVE, {"reasoning_effort": "high"}),
    ("kimi", "kimi-k3", DISABLED, {"reasoning_effort": "low"}),
    # MiniMax: reasoning split out of the text; Gemini: OpenAI's reasoning_effort
    ("minimax", "MiniMax-M3", ADAPTIVE, {"reasoning_split": True}),
    ("gemini", "gemini-3.8-flash", ADAPTIVE, {"reasoning_effort": "high"}),
    ("gemini", "gemini-3.8-flash", DISABLED, {}),
    ("glm", "glm-4.7-flash", DISABLED, {"thinking": {"type": "disabled"}}),
    ("deepseek", "deepseek-chat", ADAPTIVE, {"thinking": {"type": "enabled"}}),
    ("kimi", "kimi-k2.6", DISABLED, {"thinking": {"type": "disabled"}}),
    # reasoning_effort (OpenAI-style chat models, Ollama with its explicit "none")
    ("ollama", "qwen3:8b", ADAPTIVE, {"reasoning_effort": "high"}),
    ("ollama", "qwen3:8b", {"thinking": {"type": "enabled", "budget_tokens": 1024}},
     {"reasoning_effort": "low"}),
    ("ollama", "qwen3:8b", DISABLED, {"reasoning_effort": "none"}),
    # OpenRouter: an effort or a budget, never both; explicit off
    ("openrouter", "moonshotai/kimi-k2.5", ADAPTIVE, {"reasoning": {"effort": "high"}}),
    ("openrouter", "anthropic/claude-sonnet-4.5",
     {"thinking": {"type": "enabled", "budget_tokens": 3000}}, {"reasoning": {"max_tokens": 3000}}),
    ("openrouter", "x/y", DISABLED, {"reasoning": {"enabled": False}}),
    # vLLM / SGLang chat template switches
    ("vllm", "Qwen/Qwen3-32B", ADAPTIVE,
     {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}}),
    ("vllm", "Qwen/Qwen3-32B", DISABLED,
     {"chat_template_kwargs": {"enable_thinking": False, "thinking": False}}),
])
def test_dialect_fields_reach_the_body(provider: str, model: str, fields: dict[str, Any],
                                       expected: dict[str, Any]) -> None:
    upstream = convert(settings(provider), model, **fields)
    assert upstream.extras == expected
    for key, value in expected.items():
        assert upstream.body[key] == value
    reasoning_keys = {"enable_thinking", "thinking_budget", "thinking", "reasoning_effort",
                      "reasoning", "chat_template_kwargs", "verbosity", "reasoning_split"}
    assert reasoning_keys & set(upstream.body) == set(expected)


def test_unmatched_models_and_azure_get_no_reasoning_fields() -> None:
    assert convert(settings("glm"), "some-other-model", **ADAPTIVE).extras == {}
    assert convert(settings("kimi"), "moonshot-v1-8k", **ADAPTIVE).extras == {}
    azure = Settings(openai_api_key="k", azure_api_version="2024-10-21",
                     openai_base_url="https://x.openai.azure.com/openai/deployments/gpt4o",
                     reasoning_dialect="thinking", reasoning_passback="reasoning_content")
    upstream = convert(azure, "gpt-4o", **ADAPTIVE, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "ok"}]}])
    assert upstream.extras == {}
    assert "reasoning_content" not in upstream.body["messages"][1]
    assert "max_tokens" in upstream.body


def test_openai_reasoning_models_use_max_completion_tokens_and_no_sampling() -> None:
    config = settings("openai", reasoning_verbosity="low", provider_max_output_tokens=100000,
                      reasoning_chat_max_output_tokens=32000)
    upstream = convert(config, "gpt-5-mini", temperature=1, top_p=0.5, **ADAPTIVE)
    body = upstream.body
    assert upstream.extras == {"reasoning_effort": "high", "verbosity": "low"}
    assert body["max_completion_tokens"] == 32000
    assert "max_tokens" not in body and "temperature" not in body and "top_p" not in body
    off = convert(config, "o4-mini", **DISABLED).body
    assert "reasoning_effort" not in off and off["max_completion_tokens"] == 100000
    plain = convert(config, "gpt-4o", temperature=0.2, **ADAPTIVE).body
    assert plain["max_tokens"] == 100000 and plain["temperature"] == 0.2
    assert "reasoning_effort" not in plain


def test_clamps_when_reasoning_is_on() -> None:
    config = settings("kimi", provider_max_output_tokens=65536,
                      reasoning_chat_max_output_tokens=16000)
    assert convert(config, "kimi-k2.6", **ADAPTIVE).body["max_tokens"] == 16000
    assert convert(config, "kimi-k2.6", **DISABLED).body["max_tokens"] == 65536
    assert convert(config, "kimi-k2.6", **ADAPTIVE, max_tokens=900).body["max_tokens"] == 900


def test_tools_turn_thinking_off_when_the_profile_or_setting_says_so() -> None:
    """GLM thinks with tools by default (as .env.glm says); REASONING_WITH_TOOLS=false and
    the generic profile turn it off."""
    off = convert(settings("glm", reasoning_with_tools=False), "glm-4.7", tools=TOOLS,
                  **ADAPTIVE)
    assert off.extras == {"thinking": {"type": "disabled"}} and off.thinking is False
    on = convert(settings("glm"), "glm-4.7", tools=TOOLS, **ADAPTIVE)
    assert on.extras == {"thinking": {"type": "enabled"}} and on.thinking is True
    generic = convert(settings("generic", reasoning_chat_prefixes=["*"]), "m", tools=TOOLS,
                      **ADAPTIVE)
    assert generic.extras == {} and generic.thinking is False


def test_claude_code_first_request_with_kimi_profile() -> None:
    from tests.conftest import load_fixture
    body = load_fixture("claude-code-2.1.328-first-request.json")["body"]
    config = settings("kimi", reasoning_with_tools=True, reasoning_chat_max_output_tokens=32768)
    upstream = convert_request(body, config)
    assert upstream.body["model"] == "kimi-k3"
    # adaptive, effort medium: K3's "high", and no K2.x thinking object
    assert upstream.body["reasoning_effort"] == "high" and "thinking" not in upstream.body
    assert upstream.body["max_tokens"] == 32768
    assert upstream.thinking is True


# ---------------------------------------------------------------- passback


def tool_loop(thinking_blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [*thinking_blocks, {
            "type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "a"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Done.", "signature": SIGNER.sign("Done.")},
            {"type": "text", "text": "Listed."}]},
        {"role": "user", "content": "thanks"},
    ]


@pytest.mark.parametrize(("provider", "field"), [
    ("deepseek", "reasoning_content"), ("kimi", "reasoning_content"),
    ("glm", "reasoning_content"), ("vllm", "reasoning"), ("ollama", "reasoning")])
def test_passback_of_our_thinking(provider: str, field: str) -> None:
    ours = SIGNER.sign("Let me look.")
    upstream = convert(settings(provider), "deepseek-chat", messages=tool_loop([
        {"type": "thinking", "thinking": "Let me ", "signature": SIGNER.sign("Let me ")},
        {"type": "thinking", "thinking": "Let me look.", "signature": ours},
        {"type": "redacted_thinking", "data": "EmwK"},
    ]))
    messages = upstream.body["messages"]
    assert messages[1][field] == "Let me Let me look."
    assert messages[3][field] == "Done."
    assert all(field not in m for m in messages if m["role"] != "assistant")
    assert upstream.extras[field] == "<history>"


def test_tool_call_turn_without_thinking_gets_empty_reasoning_content() -> None:
    upstream = convert(settings("deepseek"), "deepseek-reasoner", messages=tool_loop([]))
    assert upstream.body["messages"][1]["reasoning_content"] == ""


def test_foreign_signatures_are_dropped_and_empty_ones_kept() -> None:
    upstream = convert(settings("kimi"), "kimi-k2.6", messages=tool_loop([
        {"type": "thinking", "thinking": "from claude", "signature": "EqQBCgIYAhIMreal"},
        {"type": "thinking", "thinking": "unsigned", "signature": ""},
    ]))
    assert upstream.body["messages"][1]["reasoning_content"] == "unsigned"


def test_no_passback_for_providers_without_it() -> None:
    for provider in ("openai", "dashscope", "openrouter"):
        upstream = convert(settings(provider), "qwen3-max", messages=tool_loop([
            {"type": "thinking", "thinking": "x", "signature": ""}]))
        assert all("reasoning_content" not in m and "reasoning" not in m
                   for m in upstream.body["messages"])


def test_claude_code_tool_loop_fixture_passes_its_thinking_back() -> None:
    from tests.conftest import load_fixture
    body = load_fixture("claude-code-2.1.328-tool-loop-second-request.json")["body"]
    upstream = convert_request(body, settings("deepseek", reasoning_with_tools=True),
                               is_ours=lambda block: not block.get("signature"))
    assistant = upstream.body["messages"][3]
    assert assistant["reasoning_content"] == "Let me think about this."
    assert assistant["tool_calls"][0]["id"] == "call_abc123"
    assert upstream.body["thinking"] == {"type": "enabled"}


def test_without_reasoning_leaves_every_reasoning_field_out() -> None:
    body = {"model": "deepseek-chat", "max_tokens": 100, "messages": tool_loop([]),
            **ADAPTIVE}
    upstream = convert_request(body, settings("deepseek"), without_reasoning=True)
    assert upstream.extras == {}
    assert "thinking" not in upstream.body
    assert all("reasoning_content" not in m for m in upstream.body["messages"])
    assert upstream.thinking is True  # the client still wants to see reasoning
