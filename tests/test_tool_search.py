"""Anthropic's server tool search, run by the proxy (toolsearch/), with the Python SDK and the
strict SSE grammar against a scripted upstream: a hit, a miss, a bad pattern, `limit`, the
search budget, bm25, and the conversation coming back (replay)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.toolsearch.matching import bm25_search, compile_pattern, regex_search
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, completion
from tests.sse_grammar import accumulate, check_grammar, parse_sse

SEARCH_TOOL = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
BM25_TOOL = {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"}


def deferred(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {"name": name, "description": description, "defer_loading": True,
            "input_schema": {"type": "object", "properties": {
                key: {"type": "string", "description": text}
                for key, text in properties.items()}}}


TOOLS = [
    {"name": "get_time", "description": "The current time",
     "input_schema": {"type": "object", "properties": {}}},
    deferred("mcp__db__query", "Run a SQL query against the database", sql="The query"),
    deferred("mcp__db__schema", "Describe the database tables", table="A table"),
    deferred("mcp__mail__send", "Send an email", to="Recipient address"),
    deferred("mcp__weather__forecast", "Weather forecast for a city", city="The city"),
]
ASK = {"model": "claude-sonnet-4-6", "max_tokens": 512,
       "messages": [{"role": "user", "content": "How many users are in the database?"}],
       "tools": [TOOLS[0], SEARCH_TOOL, *TOOLS[1:]]}


def call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Reply:
    return completion({"content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]},
        finish="tool_calls")


def model(search: dict[str, Any], then: Reply) -> Any:
    """The upstream model: searches with `search` first, then answers `then`."""
    def reply(body: dict[str, Any]) -> Reply:
        searched = any(m["role"] == "tool" for m in body["messages"])
        return then if searched else call("tool_search_tool_regex", search, "call_s")
    return reply


def tool_names(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


def sdk(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)


def create(proxy: ProxyServer, **fields: Any) -> Any:
    return sdk(proxy).beta.messages.create(**{**ASK, **fields},  # type: ignore[arg-type]
                                           betas=["advanced-tool-use-2025-11-20"])


def test_hit(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "database"},
                               call("mcp__db__query", {"sql": "select count(*) from users"}))
    message = create(proxy)
    assert [b.type for b in message.content] == [
        "server_tool_use", "tool_search_tool_result", "tool_use"]
    search, result, use = message.content
    assert search.name == "tool_search_tool_regex" and search.input == {"pattern": "database"}
    assert search.id.startswith("srvtoolu_") and result.tool_use_id == search.id
    assert [r.tool_name for r in result.content.tool_references] == [
        "mcp__db__query", "mcp__db__schema"]
    assert use.name == "mcp__db__query" and use.input == {"sql": "select count(*) from users"}
    assert message.stop_reason == "tool_use"
    assert message.usage.server_tool_use.tool_search_requests == 1  # type: ignore[union-attr]
    first, second = upstream.requests
    assert tool_names(first) == ["get_time", "tool_search_tool_regex"]  # deferred held back
    assert tool_names(second) == ["get_time", "mcp__db__query", "mcp__db__schema",
                                  "tool_search_tool_regex"]
    found = second["messages"][-1]
    assert found["role"] == "tool" and found["content"].startswith("<functions>\n<function>{")
    assert '"name": "mcp__db__schema"' in found["content"]


def test_miss(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "kubernetes"}, completion({"content": "No tool."}))
    message = create(proxy)
    assert [b.type for b in message.content] == [
        "server_tool_use", "tool_search_tool_result", "text"]
    assert message.content[1].content.tool_references == []
    assert message.content[2].text == "No tool."
    assert message.stop_reason == "end_turn"
    assert upstream.requests[1]["messages"][-1]["content"] == "No tools matched."


def test_bad_pattern_is_an_error_block(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "(db"}, completion({"content": "Sorry."}))
    message = create(proxy)
    result = message.content[1].content
    assert result.type == "tool_search_tool_result_error"
    assert result.error_code == "invalid_tool_input"
    assert result.error_message.startswith("invalid regular expression: missing ), ")
    assert upstream.requests[1]["messages"][-1]["content"].startswith(
        "Tool search error: invalid_tool_input: invalid regular expression")
    too_long = model({"pattern": "a" * 201}, completion({"content": "Sorry."}))
    upstream.requests.clear()
    upstream.responder = too_long
    assert create(proxy).content[1].content.error_message == (
        "pattern is longer than 200 characters")


def test_limit(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "mcp__", "limit": 3}, completion({"content": "ok"}))
    message = create(proxy)
    assert [r.tool_name for r in message.content[1].content.tool_references] == [
        "mcp__db__query", "mcp__db__schema", "mcp__mail__send"]
    upstream.requests.clear()
    upstream.responder = model({"pattern": "mcp__", "limit": 0}, completion({"content": "ok"}))
    assert create(proxy).content[1].content.error_code == "invalid_tool_input"


def test_searches_per_request_are_bounded(proxy: ProxyServer,
                                          upstream: ScriptedUpstream) -> None:
    upstream.responder = lambda body: call("tool_search_tool_regex", {"pattern": "x"},
                                           f"call_{len(body['messages'])}")
    message = create(proxy)
    results = [b.content for b in message.content if b.type == "tool_search_tool_result"]
    assert [r.type for r in results] == ["tool_search_tool_search_result"] * 5 + [
        "tool_search_tool_result_error"] * 2
    assert results[-1].error_code == "too_many_requests"
    assert message.usage.server_tool_use.tool_search_requests == 5  # type: ignore[union-attr]


def test_streamed(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "weather"}, completion({"content": "Sunny."}))
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "stream": True},
                          timeout=30)
    events = parse_sse(response.content)
    check_grammar(events)
    message = accumulate(events)
    assert [b["type"] for b in message["content"]] == [
        "server_tool_use", "tool_search_tool_result", "text"]
    assert message["content"][0]["input"] == {"pattern": "weather"}
    assert message["content"][1]["content"]["tool_references"] == [
        {"type": "tool_reference", "tool_name": "mcp__weather__forecast"}]
    assert message["usage"]["server_tool_use"]["tool_search_requests"] == 1
    assert events[0].data["message"]["usage"]["input_tokens"] > 0


def test_sdk_stream(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.responder = model({"pattern": "mail"}, call("mcp__mail__send", {"to": "a@b.c"}))
    with sdk(proxy).beta.messages.stream(**ASK) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert [b.type for b in message.content] == [
        "server_tool_use", "tool_search_tool_result", "tool_use"]
    assert message.content[2].input == {"to": "a@b.c"}


def test_replay(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """The conversation comes back: the search blocks are flattened, the found tool stays
    loaded, and no server block reaches the upstream."""
    upstream.responder = model({"pattern": "database"},
                               call("mcp__db__query", {"sql": "select 1"}))
    first = create(proxy)
    upstream.requests.clear()
    upstream.responder = None
    upstream.queue(completion({"content": "There are 42 users."}))
    turns = [*ASK["messages"],
             {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                               for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result",
                                           "tool_use_id": first.content[2].id,
                                           "content": "42"}]}]
    message = create(proxy, messages=turns)
    assert message.content[0].text == "There are 42 users."
    [sent] = upstream.requests
    assert tool_names(sent) == ["get_time", "mcp__db__query", "mcp__db__schema",
                                "tool_search_tool_regex"]
    assistant = sent["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"].startswith("Searched the tools for 'database'.")
    assert "<functions>\n<function>{" in assistant["content"]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["mcp__db__query"]
    assert "srvtoolu_" not in json.dumps(sent)


def test_bm25(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    def reply(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return completion({"content": "ok"})
        return call("tool_search_tool_bm25", {"query": "forecast for a city"}, "call_s")
    upstream.responder = reply
    message = create(proxy, tools=[TOOLS[0], BM25_TOOL, *TOOLS[1:]])
    assert message.content[0].name == "tool_search_tool_bm25"
    assert message.content[1].content.tool_references[0].tool_name == "mcp__weather__forecast"


@pytest.mark.parametrize(("tools", "error"), [
    ([SEARCH_TOOL, BM25_TOOL], "tools: only one tool search tool may be given"),
    ([{**SEARCH_TOOL, "defer_loading": True}],
     "tools.0.defer_loading: the tool search tool itself cannot be deferred"),
])
def test_malformed_tool_search_gets_a_400(tools: list[dict[str, Any]], error: str,
                                          proxy: ProxyServer,
                                          upstream: ScriptedUpstream) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "tools": tools}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == {"type": "invalid_request_error", "message": error}
    assert upstream.requests == []


def test_matching_reads_names_descriptions_and_arguments() -> None:
    tools = [t for t in TOOLS if t.get("defer_loading")]
    assert regex_search(compile_pattern("recipient"), tools, 5) == ["mcp__mail__send"]
    assert regex_search(compile_pattern("^mcp__DB"), tools, 5) == [
        "mcp__db__query", "mcp__db__schema"]
    assert bm25_search("database tables", tools, 5)[0] == "mcp__db__schema"
    assert bm25_search("zebra", tools, 5) == []


@pytest.mark.parametrize("stream", [False, True])
def test_its_own_calls_are_not_judged_and_edits_are_told(stream: bool, proxy_factory: Any,
                                      upstream: ScriptedUpstream) -> None:
    """With a safeguards judge configured, the flow's search calls go to nobody's judgement,
    and the reply says its calls were not judged (`unsupported`); `applied_edits` is told."""
    judged = proxy_factory(safeguards_route="openai,judge-model")
    upstream.responder = model({"pattern": "mail"}, call("mcp__mail__send", {"to": "a@b.c"}))
    body = {**ASK, "stream": stream,
            "safeguards": [{"type": "dangerous_tool_use", "classifier_context": "rules"}],
            "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                              "keep": "all"}]}}
    response = httpx.post(f"{judged.url}/v1/messages", json=body, timeout=30)
    if stream:
        events = parse_sse(response.content)
        check_grammar(events)
        message = accumulate(events)
    else:
        message = response.json()
    assert message["safeguard_results"] == [
        {"type": "dangerous_tool_use", "status": {"type": "unsupported"}}]
    assert message["context_management"] == {"applied_edits": []}
    assert [b["model"] for b in upstream.requests] == ["middle-upstream"] * 2
    assert not any("safeguards" in b for b in upstream.requests)
