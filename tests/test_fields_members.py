"""The member and header rows of the field table (`MEMBER_FIELDS`, `HEADERS` in
`conversion/fields.py`): one test per row against a real proxy and the scripted upstream, and
what Claude Code 2.1.332 was recorded sending (tests/data/fixtures/claude-code-2.1.332-*.json,
made by tests/record_claude_code_requests.py) is all in the tables."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from claude_proxy.conversion.caching import session_cache_key
from claude_proxy.conversion.fields import (
    BETA_VALUES,
    HEADERS,
    MEMBER_FIELDS,
    REQUEST_FIELDS,
    Treatment,
    member_tables,
)
from tests.claude_code_pin import default_claude_bin, pinned_version
from tests.conftest import ProxyServer, load_fixture
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion
from tests.test_fields import MINIMAL, TOOL, send

CLEAN_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
RECORDED = ["claude-code-2.1.332-first-request.json",
            "claude-code-2.1.332-tool-loop-second-request.json",
            "claude-code-2.1.332-subagent-request.json"]


@pytest.fixture(scope="module")
def by_profile(proxy: ProxyServer,
               proxy_factory: Callable[..., ProxyServer]) -> dict[str, ProxyServer]:
    return {"openai": proxy, "vllm": proxy_factory(provider="vllm"),
            "dashscope": proxy_factory(provider="dashscope"),
            "deepseek": proxy_factory(provider="deepseek", middle_model="deepseek-chat")}


def upstream_for(proxy: ProxyServer, upstream: ScriptedUpstream, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
    response, sent = send(proxy, upstream, body, headers)
    assert response.status_code == 200, response.text
    assert sent is not None
    return sent


def check_mid_conversation_system(proxies: dict[str, ProxyServer],
                                  upstream: ScriptedUpstream) -> None:
    messages = [{"role": "user", "content": "first"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "user", "content": "second"}]
    sent = upstream_for(proxies["openai"], upstream, {**MINIMAL, "messages": messages})
    assert sent["messages"] == [{"role": "user", "content": "first"},
                                {"role": "system", "content": "# Environment"},
                                {"role": "user", "content": "second"}]


def check_cache_scope(proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    """DashScope keeps breakpoints: the marker goes up without its scope (or TTL)."""
    marker = {"type": "ephemeral", "scope": "global", "ttl": "1h"}
    body = {**MINIMAL, "system": [{"type": "text", "text": "be brief", "cache_control": marker}]}
    sent = upstream_for(proxies["dashscope"], upstream, body)
    assert sent["messages"][0] == {"role": "system", "content": [
        {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]}


def check_defer_loading(proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    deferred = {**TOOL, "name": "get_tides", "defer_loading": True}
    sent = upstream_for(proxies["openai"], upstream, {**MINIMAL, "tools": [TOOL, deferred]})
    assert sent["tools"] == [CLEAN_TOOL]


def check_input_examples(proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    with_examples = {**TOOL, "input_examples": [{"city": "Paris"}]}
    sent = upstream_for(proxies["openai"], upstream, {**MINIMAL, "tools": [with_examples]})
    assert sent["tools"] == [CLEAN_TOOL]


def check_thinking_display(proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    thinking = {"type": "enabled", "budget_tokens": 2000}
    plain = upstream_for(proxies["vllm"], upstream, {**MINIMAL, "thinking": thinking})
    for display in ("updates", "summarized", "omitted"):
        shown = upstream_for(proxies["vllm"], upstream,
                             {**MINIMAL, "thinking": {**thinking, "display": display}})
        assert shown == plain
        assert shown["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}
    check_omitted_thinking_round_trip(proxies["deepseek"], upstream)


REASONING = "The user wants Paris; call get_weather."
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def check_omitted_thinking_round_trip(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """`display: "omitted"` (Claude Code 2.1.332's subagents): the thinking block comes
    empty, streamed and not, and its text still goes back to DeepSeek on the next turn."""
    ask = {**MINIMAL, "tools": [TOOL], "thinking": {"type": "adaptive", "display": "omitted"}}
    upstream.queue(
        Reply(events=[chunk({"role": "assistant", "reasoning_content": REASONING}),
                      chunk({"tool_calls": [{**CALL, "index": 0}]}), chunk({}, "tool_calls")]),
        completion({"reasoning_content": REASONING, "tool_calls": [CALL]}, "tool_calls"))
    streamed = httpx.post(f"{proxy.url}/v1/messages", json={**ask, "stream": True}, timeout=30)
    assert streamed.status_code == 200
    assert "thinking_delta" not in streamed.text and "Paris; call" not in streamed.text
    assert '"type":"signature_delta"' in streamed.text.replace(" ", "")
    answer = httpx.post(f"{proxy.url}/v1/messages", json=ask, timeout=30).json()
    thinking, tool_use = answer["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == ""
    assert thinking["signature"].startswith("cp2.") and REASONING not in thinking["signature"]
    assert tool_use["name"] == "get_weather"
    history = [*ask["messages"], {"role": "assistant", "content": answer["content"]},
               {"role": "user", "content": [{"type": "tool_result",
                                             "tool_use_id": tool_use["id"],
                                             "content": "sunny"}]}]
    sent = upstream_for(proxy, upstream, {**ask, "messages": history})
    assert sent["messages"][1] == {"role": "assistant", "content": None,
                                   "reasoning_content": REASONING,
                                   "tool_calls": [{**CALL, "id": tool_use["id"]}]}


MEMBER_CASES: dict[str, Callable[[dict[str, ProxyServer], ScriptedUpstream], None]] = {
    "messages[].role: system": check_mid_conversation_system,
    "cache_control.scope": check_cache_scope,
    "tools[].defer_loading": check_defer_loading,
    "tools[].input_examples": check_input_examples,
    "thinking.display": check_thinking_display,
}


def test_every_member_and_header_row_has_a_test() -> None:
    assert set(MEMBER_CASES) == set(MEMBER_FIELDS)
    assert set(HEADER_VALUES) == set(HEADERS)
    assert all(f"| `{name}` |" in member_tables() for name in [*MEMBER_FIELDS, *HEADERS])


@pytest.mark.parametrize("name", list(MEMBER_FIELDS))
def test_member_row(name: str, by_profile: dict[str, ProxyServer],
                    upstream: ScriptedUpstream) -> None:
    MEMBER_CASES[name](by_profile, upstream)


HEADER_VALUES = {"x-claude-code-session-id": "5911e594-9e0a-4546-96c8-c1e31a052524",
                 "x-claude-code-agent-id": "a1b2c3d4e5f6a7b8c",
                 "x-claude-code-parent-agent-id": "a0b1c2d3e4f5a6b7c"}


@pytest.mark.parametrize("name", list(HEADERS))
def test_header_row(name: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    baseline = upstream_for(proxy, upstream, MINIMAL)
    sent = upstream_for(proxy, upstream, MINIMAL, {name: HEADER_VALUES[name]})
    if HEADERS[name].treatment is Treatment.IGNORED:
        assert sent == baseline
        return
    assert {k: v for k, v in sent.items() if baseline.get(k) != v} == {
        "prompt_cache_key": session_cache_key(HEADER_VALUES[name], MINIMAL)}


@pytest.mark.parametrize("fixture", RECORDED)
def test_what_claude_code_2_1_332_sends_is_in_the_tables(
        fixture: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    recorded = load_fixture(fixture)
    assert recorded["provenance"]["claude_code"] == "2.1.332"
    body, headers = recorded["body"], recorded["headers"]
    assert set(body) - {"output_config"} <= set(REQUEST_FIELDS)
    assert {f"output_config.{key}" for key in body["output_config"]} <= set(REQUEST_FIELDS)
    assert set(headers["anthropic-beta"].split(",")) <= set(BETA_VALUES)
    assert {name for name in headers if name.startswith("x-claude-code-")} <= set(HEADERS)
    members = set(MEMBER_FIELDS)
    assert set(body["thinking"]) - {"type", "budget_tokens"} == {"display"}
    assert "thinking.display" in members
    assert {"defer_loading"} <= {key for tool in body["tools"] for key in tool}
    assert "system" in {message["role"] for message in body["messages"]}
    response, sent = send(proxy, upstream, {**body, "stream": False},
                          {"anthropic-beta": headers["anthropic-beta"],
                           "x-claude-code-session-id": headers["x-claude-code-session-id"]})
    assert response.status_code == 200 and sent is not None
    assert "DeferredToolPlaceholder" not in {tool["function"]["name"] for tool in sent["tools"]}
    assert [message["role"] for message in sent["messages"]][:3] == ["system", "user", "system"]
    assert response.json()["content"][-1]["text"] == "scripted default"


def test_the_pinned_claude_code_has_recorded_requests() -> None:
    """Bumping the Makefile's pin means recording what that release sends
    (tests/record_claude_code_requests.py), so these tables are checked against it."""
    version = pinned_version()
    assert default_claude_bin().parts[-5] == f"claude-code-{version}" or "CLAUDE_BIN" in os.environ
    for name in ("first-request", "tool-loop-second-request", "subagent-request"):
        recorded = load_fixture(f"claude-code-{version}-{name}.json")
        assert recorded["provenance"]["claude_code"] == version
        assert recorded["headers"]["user-agent"].startswith(f"claude-cli/{version} ")
    subagent = load_fixture(f"claude-code-{version}-subagent-request.json")
    assert "x-claude-code-agent-id" in subagent["headers"]
    assert subagent["body"]["thinking"]["display"] == "omitted"
