"""Anthropic request → OpenAI request: golden conversions, field by field."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from claude_proxy.config.settings import Settings
from claude_proxy.conversion.ids import to_anthropic_id, to_upstream_id
from claude_proxy.conversion.request_converter import anonymous_user, convert_request, map_model
from tests.conftest import load_fixture


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"openai_api_key": "sk-test", "provider": "openai",
                              "big_model": "up-big", "middle_model": "up-middle",
                              "small_model": "up-small", "provider_max_output_tokens": 16384}
    values.update(overrides)
    return Settings(**values)


def convert(original: dict[str, Any], config: Settings) -> dict[str, Any]:
    return convert_request(original, config).body


def request(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 1024,
                            "messages": [{"role": "user", "content": "hi"}]}
    base.update(fields)
    return base


# ---------------------------------------------------------------- Claude Code fixtures


def test_claude_code_first_request_converts_field_by_field() -> None:
    original = load_fixture("claude-code-2.1.328-first-request.json")["body"]
    body = convert(original, settings())

    assert body["model"] == "up-big"  # claude-opus-5-5 → BIG_MODEL
    assert body["max_tokens"] == 16384  # 128000 clamped to PROVIDER_MAX_OUTPUT_TOKENS
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["user"] == anonymous_user(original["metadata"]["user_id"])
    assert body["user"].startswith("user-") and len(body["user"]) == 37
    for absent in ("thinking", "context_management", "output_config", "metadata", "system"):
        assert absent not in body

    system = body["messages"][0]
    assert system["role"] == "system"
    # The billing header block is gone; the other two system blocks are joined.
    assert "x-anthropic-billing-header" not in system["content"]
    assert system["content"] == (original["system"][1]["text"] + "\n\n"
                                 + original["system"][2]["text"])

    user = body["messages"][1]
    texts = [block["text"] for block in original["messages"][0]["content"]]
    assert user == {"role": "user", "content": "\n\n".join(texts)}
    assert user["content"].endswith("say pong")

    # The role:"system" message inside `messages` stays a system message, in place.
    inline_system = body["messages"][2]
    assert inline_system == {"role": "system",
                             "content": original["messages"][1]["content"][0]["text"]}
    assert len(body["messages"]) == 3

    names = [tool["function"]["name"] for tool in body["tools"]]
    expected = [tool["name"] for tool in original["tools"] if not tool.get("defer_loading")]
    assert names == expected and "DeferredToolPlaceholder" not in names
    for converted, source in zip(body["tools"], [t for t in original["tools"]
                                                 if not t.get("defer_loading")], strict=True):
        params = converted["function"]["parameters"]
        assert "$schema" not in params
        assert params == {k: v for k, v in source["input_schema"].items() if k != "$schema"}
        assert converted["function"]["description"] == source["description"]
        assert converted["type"] == "function"
    assert "tool_choice" not in body and "parallel_tool_calls" not in body
    assert "cache_control" not in json.dumps(body)


def test_claude_code_tool_loop_second_request() -> None:
    original = load_fixture("claude-code-2.1.328-tool-loop-second-request.json")["body"]
    body = convert(original, settings())
    roles = [message["role"] for message in body["messages"]]
    assert roles == ["system", "user", "system", "assistant", "tool"]

    assistant = body["messages"][3]
    # The thinking block (signature "") is dropped here; the tool call is kept exactly.
    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{
            "id": "call_abc123",
            "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps(
                {"command": "echo hi-from-tool", "description": "echo"},
                separators=(",", ":"))},
        }],
    }
    assert body["messages"][4] == {"role": "tool", "tool_call_id": "call_abc123",
                                   "content": "hi-from-tool"}
    assert body["messages"][2]["content"] == original["messages"][1]["content"]


# ---------------------------------------------------------------- models and limits


@pytest.mark.parametrize(("requested", "expected_model"), [
    ("claude-opus-4-1-20250805", "up-big"),
    ("claude-sonnet-4-5", "up-middle"),
    ("claude-3-5-haiku-latest", "up-small"),
    ("CLAUDE-HAIKU-4-5", "up-small"),
    ("kimi-k2.5", "kimi-k2.5"),
    ("deepseek-chat", "deepseek-chat"),
])
def test_model_mapping(requested: str, expected_model: str) -> None:
    assert map_model(requested, settings()) == expected_model


def test_model_mapping_falls_back_to_provider_profile() -> None:
    kimi = Settings(openai_api_key="k", openai_base_url="https://api.moonshot.ai/v1")
    assert kimi.provider_name == "kimi"
    assert map_model("claude-sonnet-4-5", kimi) == kimi.profile.middle_model


def test_max_tokens_is_clamped_and_kept_positive() -> None:
    assert convert(request(max_tokens=500), settings())["max_tokens"] == 500
    assert convert(request(max_tokens=10**6), settings())["max_tokens"] == 16384
    assert convert(request(max_tokens=0), settings())["max_tokens"] == 1


def test_sampling_stop_and_user_fields() -> None:
    body = convert(request(temperature=0.3, top_p=0.9, top_k=5,
                                   stop_sequences=["END", "STOP"],
                                   metadata={"user_id": "user-42"}), settings())
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9
    assert "stop" not in body  # matched by the proxy (conversion/stop_sequences.py)
    vllm = convert(request(stop_sequences=["END", "STOP"]), settings(provider="vllm"))
    assert vllm["stop"] == ["END", "STOP"]  # vLLM names the string it stopped at
    assert body["user"] == "user-" + hashlib.sha256(b"user-42").hexdigest()[:32]
    assert "top_k" not in body
    assert "stream" not in body and "stream_options" not in body


# ---------------------------------------------------------------- system


def test_system_string_and_blocks() -> None:
    assert convert(request(system="Be brief."), settings())["messages"][0] == {
        "role": "system", "content": "Be brief."}
    blocks = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.1.abc;"},
        {"type": "text", "text": "First.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Second."},
    ]
    assert convert(request(system=blocks), settings())["messages"][0] == {
        "role": "system", "content": "First.\n\nSecond."}


# ---------------------------------------------------------------- user content


def user_turn(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def test_images_base64_and_url() -> None:
    body = convert(request(messages=[user_turn(
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    )]), settings())
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
    ]


def test_documents_text_and_pdf() -> None:
    body = convert(request(messages=[user_turn(
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "plain body"}, "title": "Notes"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": "JVBERi0x"}, "title": "spec.pdf"},
        {"type": "document", "source": {"type": "content", "content": [
            {"type": "text", "text": "inner text"}]}},
    )]), settings())
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "Notes\n\nplain body"},
        {"type": "file", "file": {"filename": "spec.pdf",
                                  "file_data": "data:application/pdf;base64,JVBERi0x"}},
        {"type": "text", "text": "inner text"},
    ]


def test_tool_results_come_first_then_user_text() -> None:
    body = convert(request(messages=[
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Running."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {"path": "a"}},
        ]},
        user_turn(
            {"type": "text", "text": "here you go"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no such file"}]},
        ),
    ]), settings())
    messages = body["messages"]
    assert messages[1]["content"] == "Running."
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["toolu_1", "toolu_2"]
    assert messages[1]["tool_calls"][1]["function"]["arguments"] == '{"path":"a"}'
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "a\nb"}
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_2",
                           "content": "Error: no such file"}
    assert messages[4] == {"role": "user", "content": "here you go"}
    assert len(messages) == 5


def test_string_tool_results_and_assistant_texts_on_their_quick_paths() -> None:
    """The shapes a long conversation is made of take quick paths; each gives what the
    general path gives: an error's text prefixed, several texts joined, an empty text
    skipped."""
    body = convert(request(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "text", "text": ""},
            {"type": "text", "text": "First."},
            {"type": "text", "text": "Second."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "x"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "y"}},
        ]},
        user_turn(
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": "boom"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": ""},
        ),
        {"role": "assistant", "content": [{"type": "text", "text": ""},
                                          {"type": "text", "text": "Only."}]},
    ]), settings())
    messages = body["messages"]
    assert messages[1]["content"] == "First.\n\nSecond."
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["toolu_1", "toolu_2"]
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: boom"}
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error"}
    assert messages[4] == {"role": "assistant", "content": "Only."}
    assert len(messages) == 5


def test_tool_result_images_follow_the_tool_message() -> None:
    body = convert(request(messages=[user_turn({
        "type": "tool_result", "tool_use_id": "toolu_9", "content": [
            {"type": "text", "text": "screenshot taken"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": "/9j/"}},
        ]})]), settings())
    tool, user = body["messages"]
    assert tool == {"role": "tool", "tool_call_id": "toolu_9", "content": "screenshot taken"}
    assert user == {"role": "user", "content": [
        {"type": "text", "text": "Content returned by tool call toolu_9:"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
    ]}


def test_unknown_and_odd_blocks_never_fail() -> None:
    body = convert(request(messages=[
        user_turn({"type": "mystery_block", "text": "kept as text"},
                  {"type": "another_one", "payload": 1},
                  {"type": "search_result", "source": "https://s", "title": "T",
                   "content": [{"type": "text", "text": "found"}]}),
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "EmwK"},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                {"type": "web_search_result", "url": "https://r", "title": "R"}]},
            {"type": "text", "text": "answer"},
        ]},
        {"role": "user", "content": []},
    ]), settings())
    assert body["messages"][0]["content"] == (
        "kept as text\n\nSearch result: T (https://s)\nfound")
    assert body["messages"][1] == {"role": "assistant",
                                   "content": "Web search results:\n- R (https://r)\n\nanswer"}
    assert body["messages"][2] == {"role": "user", "content": ""}


def test_assistant_turn_with_only_thinking_stays_a_turn() -> None:
    """Dropping it would leave two user messages in a row (refused by strict templates);
    its reasoning goes back as the profile passes it back (llamacpp: reasoning_content)."""
    original = request(messages=[
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
                                           "signature": ""}]},
        {"role": "user", "content": "b"},
    ])
    body = convert(original, settings())
    assert body["messages"] == [{"role": "user", "content": "a"},
                                {"role": "assistant", "content": ""},
                                {"role": "user", "content": "b"}]
    local = convert_request(original, settings(provider="llamacpp"),
                            is_ours=lambda block: True).body
    assert local["messages"][1] == {"role": "assistant", "content": "",
                                    "reasoning_content": "t"}


# ---------------------------------------------------------------- tools


def test_tools_server_tools_and_tool_choice() -> None:
    tools = [
        {"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
         "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                          "type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"name": "no_schema"},
    ]
    body = convert(request(tools=tools, tool_choice={
        "type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}), settings())
    assert body["tools"] == [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "no_schema", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "web_search"}, "auto", None),  # a dropped server tool
])
def test_tool_choice_mapping(choice: dict[str, Any], expected: Any, parallel: Any) -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}},
             {"type": "web_search_20250305", "name": "web_search"}]
    body = convert(request(tools=tools, tool_choice=choice), settings())
    assert body["tool_choice"] == expected
    assert body.get("parallel_tool_calls") == parallel


def test_only_server_tools_means_no_tools_upstream() -> None:
    body = convert(request(
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "tool", "name": "web_search"}), settings())
    assert "tools" not in body and "tool_choice" not in body


def test_deferred_tool_is_sent_once_a_tool_reference_loads_it() -> None:
    tools = [{"name": "ToolSearch", "input_schema": {"type": "object"}},
             {"name": "mcp__db__query", "defer_loading": True,
              "input_schema": {"type": "object", "properties": {"sql": {"type": "string"}}}}]
    first = convert(request(tools=tools), settings())
    assert [t["function"]["name"] for t in first["tools"]] == ["ToolSearch"]
    loaded = convert(request(tools=tools, messages=[
        {"role": "user", "content": "query the db"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s",
                                           "name": "ToolSearch", "input": {"query": "db"}}]},
        user_turn({"type": "tool_result", "tool_use_id": "toolu_s", "content": [
            {"type": "tool_reference", "tool_name": "mcp__db__query"}]}),
    ]), settings())
    assert [t["function"]["name"] for t in loaded["tools"]] == ["ToolSearch", "mcp__db__query"]
    assert loaded["messages"][2] == {"role": "tool", "tool_call_id": "toolu_s", "content": (
        '<functions>\n<function>{"description": "", "name": "mcp__db__query", "parameters": '
        '{"type": "object", "properties": {"sql": {"type": "string"}}}}</function>\n'
        '</functions>')}


def test_found_tools_are_rendered_as_toolsearch_promises() -> None:
    """Claude Code 2.1.332's ToolSearch description: each matched tool is one
    `<function>{"description": …, "name": …, "parameters": …}</function>` line inside a
    `<functions>` block, the encoding of the tool list at the top of the prompt."""
    recorded = load_fixture("claude-code-2.1.332-tool-loop-second-request.json")["body"]
    promise = next(t["description"] for t in recorded["tools"] if t["name"] == "ToolSearch")
    assert ('one <function>{"description": "...", "name": "...", "parameters": {...}}'
            '</function> line inside the <functions> block') in promise
    read = next(t for t in recorded["tools"] if t["name"] == "Read")
    deferred = [{**read, "name": "mcp__fs__read", "defer_loading": True},
                {**read, "name": "mcp__fs__stat", "defer_loading": True}]
    body = {**recorded, "tools": recorded["tools"] + deferred, "messages": [
        *recorded["messages"],
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_ts",
                                           "name": "ToolSearch",
                                           "input": {"query": "select:mcp__fs__read,nope"}}]},
        user_turn({"type": "tool_result", "tool_use_id": "toolu_ts", "content": [
            {"type": "tool_reference", "tool_name": "mcp__fs__read"},
            {"type": "tool_reference", "tool_name": "nope"}]})]}
    converted = convert(body, settings())
    names = [t["function"]["name"] for t in converted["tools"]]
    assert names[-1] == "mcp__fs__read" and "mcp__fs__stat" not in names
    text = converted["messages"][-1]["content"]
    lines = text.split("\n")
    assert lines[0] == "<functions>" and lines[-1] == "</functions>"
    assert lines[2] == "<!-- no tool named nope is declared -->"
    definition = json.loads(lines[1].removeprefix("<function>").removesuffix("</function>"))
    assert definition == {"description": read["description"], "name": "mcp__fs__read",
                          "parameters": {k: v for k, v in read["input_schema"].items()
                                         if k != "$schema"}}
    assert list(definition) == ["description", "name", "parameters"]
    assert body["tools"][-1]["defer_loading"] is True  # the client's request is unchanged


# ---------------------------------------------------------------- ids


@pytest.mark.parametrize("upstream_id", ["call_abc123", "toolu_01ABC", "functions.add:0",
                                         "call 1/2", "ünï"])
def test_tool_ids_round_trip(upstream_id: str) -> None:
    anthropic_id = to_anthropic_id(upstream_id)
    assert all(c.isalnum() or c in "_-" for c in anthropic_id)
    assert to_upstream_id(anthropic_id) == upstream_id


def test_client_ids_that_look_encoded_are_left_alone() -> None:
    assert to_upstream_id("toolu_px6162") == "toolu_px6162"  # decodes to "ab": not encoded
    assert to_upstream_id("toolu_pxzz") == "toolu_pxzz"
    assert to_anthropic_id(None).startswith("toolu_") and len(to_anthropic_id("")) == 30
