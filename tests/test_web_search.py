"""Web search: the `web_search_*` server tool runs through a search backend (or the provider's
own search) and comes back as Anthropic's blocks; never an answer from memory.

A real proxy, the scripted upstream and the scripted search backend, all on loopback; the
client is the anthropic SDK (or httpx for the raw bytes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    ServerToolUseBlock,
    TextBlock,
    WebSearchToolResultBlock,
    WebSearchToolResultError,
)

from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.websearch.backends import Hit, Query, filter_hits, host_matches
from claude_proxy.websearch.search_blocks import decode_token, encode_token
from tests.conftest import ProxyServer, eventually, serving
from tests.scripted_upstream import Reply, ScriptedUpstream, completion, error_reply
from tests.search_backend import HITS, SearchBackendServer

SECRET = "web-search-test-secret"
SIGNER = ThinkingSigner(SECRET)
QUERY = "rust 1.91 release notes"
SIDE_SYSTEM = ("You run a web search for another Claude model, which is waiting on the result "
               "and can search again. Search once, then reply with a brief summary of the "
               "results.")
SUMMARY = ("Rust 1.91.0 came out on 2026-10-30 "
           "([Announcing Rust 1.91.0](https://blog.rust-lang.org/2026/10/30/Rust-1.91.0/)).")
WARNING_TEXT = "web search requested but"


def side_query(query: str = QUERY, *, stream: bool = True,
               **tool: Any) -> dict[str, Any]:
    """Claude Code 2.1.33x's WebSearch side query."""
    return {"model": "claude-haiku-4-5", "max_tokens": 4096, "stream": stream,
            "system": SIDE_SYSTEM,
            "messages": [{"role": "user",
                          "content": f"Perform a web search for the query: {query}"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8,
                       **tool}],
            "tool_choice": {"type": "tool", "name": "web_search"},
            "thinking": {"type": "disabled"}}


def sdk(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0)


def stream_message(proxy: ProxyServer, body: dict[str, Any]) -> anthropic.types.Message:
    fields = {k: v for k, v in body.items() if k != "stream"}
    with sdk(proxy).messages.stream(**fields) as stream:
        return stream.get_final_message()


def create_message(proxy: ProxyServer, body: dict[str, Any]) -> anthropic.types.Message:
    fields = {k: v for k, v in body.items() if k != "stream"}
    return sdk(proxy).messages.create(**fields)


def search_proxy(factory: Callable[..., ProxyServer], backend: SearchBackendServer,
                 kind: str = "searxng", **overrides: Any) -> ProxyServer:
    values: dict[str, Any] = {"web_search_backend": kind, "web_search_url": backend.url,
                              "thinking_signature_secret": SECRET, "max_retries": 0}
    if kind != "searxng":
        values["web_search_api_key"] = "search-key-0123456789"
    values.update(overrides)
    return factory(**values)


def assert_clean_upstream(requests: list[dict[str, Any]]) -> None:
    """No upstream request carries a server tool, a schema-less function, a tool_choice
    naming a tool it does not have, or anything opaque from a search block."""
    for sent in requests:
        names = set()
        for tool in sent.get("tools") or []:
            if tool.get("type") != "function":
                assert tool["type"] in ("openrouter:web_search", "web_search"), tool
                continue
            function = tool["function"]
            assert function["parameters"]["type"] == "object", tool
            assert isinstance(function["parameters"]["properties"], dict), tool
            names.add(function["name"])
        if "web_search" in names:
            web = next(t["function"] for t in sent["tools"] if t.get("type") == "function"
                       and t["function"]["name"] == "web_search")
            assert web["parameters"]["properties"]["query"]["type"] == "string"
            assert web["parameters"]["required"] == ["query"]
        choice = sent.get("tool_choice")
        if isinstance(choice, dict):
            assert choice["function"]["name"] in names, choice
        elif choice is not None:
            assert names, choice
        text = json.dumps(sent)
        assert "web_search_2" not in text and "encrypted_content" not in text
        assert "srvtoolu_" not in text


def expected_pairs(hits: list[Any] = HITS) -> list[tuple[str, str]]:
    return [(hit.url, hit.title) for hit in hits]


def result_pairs(block: WebSearchToolResultBlock) -> list[tuple[str, str]]:
    assert isinstance(block.content, list)
    return [(item.url, item.title) for item in block.content]


# ---------------------------------------------------------------- the side query


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily", "exa"])
def test_side_query_streams_the_search_blocks(
        kind: str, proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, kind)
    upstream.queue(completion({"content": SUMMARY}, usage={
        "prompt_tokens": 700, "completion_tokens": 40, "total_tokens": 740}))
    message = stream_message(proxy, side_query())
    tool_use, result, text = message.content
    assert isinstance(tool_use, ServerToolUseBlock)
    assert tool_use.name == "web_search" and tool_use.input == {"query": QUERY}
    assert tool_use.id.startswith("srvtoolu_")
    assert isinstance(result, WebSearchToolResultBlock) and result.tool_use_id == tool_use.id
    assert result_pairs(result) == expected_pairs()
    assert isinstance(text, TextBlock) and text.text == SUMMARY
    assert message.stop_reason == "end_turn" and message.model == "claude-haiku-4-5"
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert message.usage.output_tokens == 40
    # The backend got the query, once; the upstream only wrote the summary.
    assert [seen.query for seen in search_backend.requests] == [QUERY]
    assert len(upstream.requests) == 1
    assert_clean_upstream(upstream.requests)
    sent = upstream.requests[0]
    assert "tool_choice" not in sent or sent["tool_choice"] == "auto"
    call, answer = sent["messages"][-2:]
    assert call["tool_calls"][0]["function"] == {
        "name": "web_search", "arguments": json.dumps({"query": QUERY}, separators=(",", ":"))}
    assert answer["role"] == "tool" and answer["tool_call_id"] == call["tool_calls"][0]["id"]
    for number, hit in enumerate(HITS, 1):
        assert f"[{number}] {hit.title}\nURL: {hit.url}\n{hit.snippet}" in answer["content"]


def test_backend_request_shapes(proxy_factory: Callable[..., ProxyServer],
                                upstream: ScriptedUpstream,
                                search_backend: SearchBackendServer) -> None:
    """Each backend's documented request: path, parameters, key header."""
    seen = {}
    for kind in ("searxng", "brave", "tavily", "exa"):
        proxy = search_proxy(proxy_factory, search_backend, kind, web_search_max_results=3)
        search_backend.requests.clear()
        create_message(proxy, side_query())
        seen[kind] = search_backend.requests[0]
    assert (seen["searxng"].method, seen["searxng"].path, seen["searxng"].params) == (
        "GET", "/search", {"q": QUERY, "format": "json"})
    assert (seen["brave"].path, seen["brave"].params) == ("/web/search",
                                                          {"q": QUERY, "count": "3"})
    assert seen["brave"].headers["x-subscription-token"] == "search-key-0123456789"
    assert seen["tavily"].body == {"query": QUERY, "max_results": 3, "search_depth": "basic"}
    assert seen["tavily"].headers["authorization"] == "Bearer search-key-0123456789"
    assert seen["exa"].body["query"] == QUERY and seen["exa"].body["numResults"] == 3
    assert seen["exa"].headers["x-api-key"] == "search-key-0123456789"


def test_max_results_caps_the_hits(proxy_factory: Callable[..., ProxyServer],
                                   upstream: ScriptedUpstream,
                                   search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, web_search_max_results=2)
    message = create_message(proxy, side_query())
    assert result_pairs(message.content[1]) == expected_pairs(HITS[:2])  # type: ignore[arg-type]


def test_side_query_not_streamed(proxy_factory: Callable[..., ProxyServer],
                                 upstream: ScriptedUpstream,
                                 search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": SUMMARY}))
    message = create_message(proxy, side_query(stream=False))
    assert [block.type for block in message.content] == [
        "server_tool_use", "web_search_tool_result", "text"]
    tool_use, result, text = message.content
    assert isinstance(tool_use, ServerToolUseBlock) and tool_use.input == {"query": QUERY}
    assert isinstance(result, WebSearchToolResultBlock)
    assert result_pairs(result) == expected_pairs()
    assert isinstance(text, TextBlock) and text.text == SUMMARY
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert_clean_upstream(upstream.requests)


def test_stream_events_in_anthropic_order(proxy_factory: Callable[..., ProxyServer],
                                          upstream: ScriptedUpstream,
                                          search_backend: SearchBackendServer) -> None:
    """The exact events Claude Code's accumulator reads: the query only in an
    input_json_delta, the results whole in their start event, text only through deltas."""
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": SUMMARY}))
    response = httpx.post(f"{proxy.url}/v1/messages", json=side_query(), timeout=30)
    assert response.status_code == 200
    events = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ")]
    kinds = [(e["type"], e.get("index"), (e.get("content_block") or e.get("delta") or {}).get(
        "type")) for e in events]
    assert kinds == [
        ("message_start", None, None),
        ("content_block_start", 0, "server_tool_use"),
        ("content_block_delta", 0, "input_json_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "web_search_tool_result"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "text"),
        ("content_block_delta", 2, "text_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None)]
    assert events[1]["content_block"]["input"] == {}
    assert json.loads(events[2]["delta"]["partial_json"]) == {"query": QUERY}
    assert events[6]["content_block"] == {"type": "text", "text": ""}
    results = events[4]["content_block"]["content"]
    assert [set(item) for item in results] == [
        {"type", "url", "title", "encrypted_content", "page_age"}] * len(HITS)
    assert results[0]["page_age"] == "2026-10-30" and results[1]["page_age"] is None
    for item, hit in zip(results, HITS, strict=True):
        token = item["encrypted_content"]
        assert all(c.isalnum() or c in "_-" for c in token)
        assert hit.snippet not in token
        assert decode_token(token, hit.url, SIGNER) == hit.snippet
    assert events[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2]["usage"]["server_tool_use"] == {"web_search_requests": 1,
                                                      "web_fetch_requests": 0}


def test_ping_while_the_search_runs(proxy_factory: Callable[..., ProxyServer],
                                    upstream: ScriptedUpstream,
                                    search_backend: SearchBackendServer) -> None:
    """message_start goes out at once; pings keep the stream alive until the backend's
    timeout ends the search."""
    proxy = search_proxy(proxy_factory, search_backend, web_search_timeout=1)
    assert eventually(lambda: serving(proxy.url))  # the flow exists once the app started
    proxy.app.state.wiring.search.ping_seconds = 0.05
    search_backend.mode = "hang"
    response = httpx.post(f"{proxy.url}/v1/messages", json=side_query(), timeout=30)
    types = [json.loads(line[6:])["type"] for line in response.text.splitlines()
             if line.startswith("data: ")]
    assert types[0] == "message_start" and types[1] == "ping"
    first_block = types.index("content_block_start")
    assert set(types[1:first_block]) == {"ping"}
    assert "error_code" in response.text and '"unavailable"' in response.text


# ---------------------------------------------------------------- errors


def search_error(message: anthropic.types.Message) -> str:
    result = message.content[1]
    assert isinstance(result, WebSearchToolResultBlock)
    assert isinstance(result.content, WebSearchToolResultError)
    return result.content.error_code


@pytest.mark.parametrize(("mode", "code"), [
    ("429", "too_many_requests"), ("500", "unavailable"), ("hang", "unavailable"),
    ("json_off", "unavailable")])
def test_backend_failures_are_search_errors(
        mode: str, code: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream, search_backend: SearchBackendServer,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = search_proxy(proxy_factory, search_backend, web_search_timeout=0.5)
    search_backend.mode = mode
    upstream.queue(completion({"content": "The search failed, so I cannot say."}))
    with caplog.at_level(logging.INFO, logger="claude_proxy.websearch"):
        message = stream_message(proxy, side_query())
    assert search_error(message) == code
    assert message.stop_reason == "end_turn"
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 0
    tool_message = upstream.requests[0]["messages"][-1]
    assert tool_message["content"] == f"Web search error: {code}"
    if mode == "json_off":
        assert "search.formats" in caplog.text
    assert f"outcome={code}" in caplog.text


def test_no_hits_is_an_empty_result(proxy_factory: Callable[..., ProxyServer],
                                    upstream: ScriptedUpstream,
                                    search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    search_backend.mode = "empty"
    upstream.queue(completion({"content": "Nothing was found."}))
    message = stream_message(proxy, side_query())
    result = message.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and result.content == []
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert upstream.requests[0]["messages"][-1]["content"] == (
        f'The web search for "{QUERY}" found no results.')


@pytest.mark.parametrize(("query", "code"), [("x" * 401, "query_too_long"),
                                              ("   ", "invalid_tool_input")])
def test_bad_queries_never_reach_the_backend(
        query: str, code: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream, search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    message = stream_message(proxy, side_query(query))
    assert search_error(message) == code
    assert search_backend.requests == []


def test_a_query_too_long_is_shown_whole(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream,
                                        search_backend: SearchBackendServer) -> None:
    """The server_tool_use block shows the 401-character query the client sent, not one cut
    to 400 that would not have been too long; streamed and not."""
    proxy = search_proxy(proxy_factory, search_backend)
    query = "long query " * 36 + "x" * 5
    assert len(query) == 401
    for reply in (stream_message(proxy, side_query(query)),
                  create_message(proxy, side_query(query, stream=False))):
        tool_use = reply.content[0]
        assert isinstance(tool_use, ServerToolUseBlock) and tool_use.input == {"query": query}
        assert search_error(reply) == "query_too_long"
    assert search_backend.requests == []


def test_without_a_backend_the_answer_is_unavailable(
        proxy: ProxyServer, upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    """Never an answer from memory: no upstream call, the error blocks, HTTP 200, and one
    WARNING saying how to turn search on."""
    with caplog.at_level(logging.WARNING):
        message = stream_message(proxy, side_query())
        plain = create_message(proxy, side_query(stream=False))
    for reply in (message, plain):
        tool_use = reply.content[0]
        assert isinstance(tool_use, ServerToolUseBlock) and tool_use.input == {"query": QUERY}
        assert search_error(reply) == "unavailable"
        assert len(reply.content) == 2 and reply.stop_reason == "end_turn"
    assert upstream.requests == []
    warnings = [r for r in caplog.records if WARNING_TEXT in r.getMessage()]
    assert len(warnings) == 2 and all(r.levelno == logging.WARNING for r in warnings)
    assert "WEB_SEARCH_BACKEND" in warnings[0].getMessage()


def test_web_search_off_for_a_provider(proxy_factory: Callable[..., ProxyServer],
                                       upstream: ScriptedUpstream,
                                       search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, web_search="off")
    assert search_error(stream_message(proxy, side_query())) == "unavailable"
    assert search_backend.requests == [] and upstream.requests == []


def test_summary_failure_gives_a_digest(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream,
                                        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(error_reply(503, "overloaded"))
    message = stream_message(proxy, side_query())
    text = message.content[2]
    assert isinstance(text, TextBlock)
    assert text.text == "\n".join(
        [f'Web search results for "{QUERY}" (untrusted web content):'] +
        [f"- [{hit.title}]({hit.url}): {hit.snippet}" for hit in HITS])
    assert message.stop_reason == "end_turn"


# ---------------------------------------------------------------- domains, max_uses


def test_allowed_domains_filter_by_host(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream,
                                        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    message = stream_message(proxy, side_query(allowed_domains=["rust-lang.org"]))
    assert result_pairs(message.content[1]) == expected_pairs(HITS[:2])  # type: ignore[arg-type]
    assert search_backend.requests[0].params["q"] == f"{QUERY} site:rust-lang.org"


def test_blocked_domains_go_to_tavily_natively(proxy_factory: Callable[..., ProxyServer],
                                               upstream: ScriptedUpstream,
                                               search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, "tavily")
    message = stream_message(proxy, side_query(blocked_domains=["reddit.com", "github.com"]))
    assert result_pairs(message.content[1]) == expected_pairs(HITS[:2])  # type: ignore[arg-type]
    assert search_backend.requests[0].body["exclude_domains"] == ["reddit.com", "github.com"]
    assert search_backend.requests[0].body["query"] == QUERY


def test_both_domain_lists_are_a_400(proxy_factory: Callable[..., ProxyServer],
                                     upstream: ScriptedUpstream,
                                     search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    with pytest.raises(anthropic.BadRequestError) as caught:
        stream_message(proxy, side_query(allowed_domains=["a.com"], blocked_domains=["b.com"]))
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert search_backend.requests == [] and upstream.requests == []


def test_host_filter_units() -> None:
    assert host_matches("https://sub.docs.rs/x", ("docs.rs",))
    assert host_matches("https://DOCS.rs./x", ("https://docs.rs/path",))
    assert not host_matches("https://notdocs.rs/x", ("docs.rs",))
    hits = [Hit("https://a.example.com/1", "a"), Hit("https://b.org/2", "b"),
            Hit("https://a.example.com/1", "dup")]
    assert filter_hits(hits, Query("q", blocked_domains=("b.org",))) == [hits[0]]
    assert filter_hits(hits, Query("q", allowed_domains=("example.com",), max_results=1)) == [
        hits[0]]


def test_token_is_ours_only_when_signed_by_us() -> None:
    hit = Hit("https://example.com/", "Example", "snippet ünïcode")
    token = encode_token(hit, SIGNER)
    assert decode_token(token, hit.url, SIGNER) == hit.snippet
    assert decode_token(token, "https://other.example/", SIGNER) is None
    assert decode_token(token, hit.url, ThinkingSigner("another-secret")) is None
    assert decode_token("Er0DCioICBgC-real-anthropic-blob", hit.url, SIGNER) is None


def model_search_call(query: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "web_search", "arguments": json.dumps({"query": query})}}


def test_model_driven_search_with_max_uses(proxy_factory: Callable[..., ProxyServer],
                                           upstream: ScriptedUpstream,
                                           search_backend: SearchBackendServer) -> None:
    """An SDK client that lets the model search (web_search among its own tools): the model
    calls the function, the proxy searches; past max_uses the call gets the error."""
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(
        completion({"content": "Let me search.", "tool_calls": [
            model_search_call("rust 1.91", "call_1")]}, "tool_calls"),
        completion({"content": None, "tool_calls": [
            model_search_call("rust 1.92", "call_2")]}, "tool_calls"),
        completion({"content": SUMMARY}))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 1024,
            "messages": [{"role": "user", "content": "What changed in the latest Rust?"}],
            "tools": [{"name": "get_time", "description": "time", "input_schema": {
                "type": "object", "properties": {}}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
            "tool_choice": {"type": "tool", "name": "web_search"}}
    message = stream_message(proxy, body)
    assert [block.type for block in message.content] == [
        "text", "server_tool_use", "web_search_tool_result", "server_tool_use",
        "web_search_tool_result", "text"]
    assert message.content[1].input == {"query": "rust 1.91"}  # type: ignore[union-attr]
    assert result_pairs(message.content[2]) == expected_pairs()  # type: ignore[arg-type]
    assert message.content[3].input == {"query": "rust 1.92"}  # type: ignore[union-attr]
    result = message.content[4]
    assert isinstance(result, WebSearchToolResultBlock)
    assert isinstance(result.content, WebSearchToolResultError)
    assert result.content.error_code == "max_uses_exceeded"
    assert message.content[5].text == SUMMARY  # type: ignore[union-attr]
    assert [seen.query for seen in search_backend.requests] == ["rust 1.91"]
    assert_clean_upstream(upstream.requests)
    first, second, third = upstream.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "web_search"}}
    assert {t["function"]["name"] for t in first["tools"]} == {"get_time", "web_search"}
    assert second["tool_choice"] == "auto"
    assert third["messages"][-1] == {"role": "tool", "tool_call_id": "call_2",
                                     "content": "Web search error: max_uses_exceeded"}


def test_a_search_call_that_is_no_json_is_an_invalid_input(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    """The model's web_search call whose arguments are no JSON object (its input is their
    text: docs/tool-calls.md) is an `invalid_tool_input`, never searched."""
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "web_search", "arguments": '{"query": "rust 1.9'}}]},
        "tool_calls"), completion({"content": SUMMARY}))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 1024,
            "messages": [{"role": "user", "content": "What changed in the latest Rust?"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    message = create_message(proxy, body)
    assert search_error(message) == "invalid_tool_input"
    assert search_backend.requests == []
    assert upstream.requests[1]["messages"][-1]["content"] == (
        "Web search error: invalid_tool_input")


def test_client_tool_calls_end_the_turn(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream,
                                        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": None, "tool_calls": [
        {"id": "call_t", "type": "function", "function": {"name": "get_time",
                                                          "arguments": "{}"}}]}, "tool_calls"))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 1024,
            "messages": [{"role": "user", "content": "time?"}],
            "tools": [{"name": "get_time", "input_schema": {"type": "object",
                                                            "properties": {}}},
                      {"type": "web_search_20250305", "name": "web_search"}]}
    message = create_message(proxy, body)
    assert [(b.type, getattr(b, "name", None)) for b in message.content] == [
        ("tool_use", "get_time")]
    assert message.stop_reason == "tool_use" and search_backend.requests == []
    assert "tool_choice" not in upstream.requests[0]


# ---------------------------------------------------------------- replay


def test_replayed_blocks_give_the_upstream_the_snippets(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    """A later turn sends the blocks back: our tokens become their snippets as text, a
    foreign blob only its URL and title; nothing opaque goes upstream."""
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": SUMMARY}))
    first = create_message(proxy, side_query(stream=False))
    foreign = {"type": "web_search_result", "url": "https://anthropic.example/news",
               "title": "Foreign result", "encrypted_content": "Er0DCioICBgCopaqueBlob",
               "page_age": None}
    assistant = [block.model_dump(exclude_none=True) for block in first.content]
    assistant.insert(2, {"type": "server_tool_use", "id": "srvtoolu_01Foreign",
                         "name": "web_search", "input": {"query": "elsewhere"}})
    assistant.insert(3, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01Foreign",
                         "content": [foreign]})
    later = {"model": "claude-sonnet-4-6", "max_tokens": 256,
             "messages": [{"role": "user", "content": "What is new in Rust?"},
                          {"role": "assistant", "content": assistant},
                          {"role": "user", "content": "And the date?"}]}
    upstream.queue(completion({"content": "2026-10-30"}))
    reply = create_message(proxy, later)
    assert reply.content[0].text == "2026-10-30"  # type: ignore[union-attr]
    sent = upstream.requests[-1]
    text = sent["messages"][-2]["content"]
    assert sent["messages"][-2]["role"] == "assistant"
    assert f'Searched the web for "{QUERY}".' in text
    for number, hit in enumerate(HITS, 1):
        assert f"[{number}] {hit.title}\nURL: {hit.url}\n{hit.snippet}" in text
    assert "[1] Foreign result\nURL: https://anthropic.example/news" in text
    assert "Er0DCioICBgCopaqueBlob" not in json.dumps(sent)
    assert text.endswith(SUMMARY)
    assert_clean_upstream(upstream.requests)


# ---------------------------------------------------------------- native search


OPENROUTER_ANSWER = {
    "id": "gen-1", "object": "chat.completion", "created": 1, "model": "openai/gpt-4o",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant",
        "content": "Rust 1.91.0 was released ([blog.rust-lang.org](https://blog.rust-lang.org/"
                   "2026/10/30/Rust-1.91.0/)).",
        "annotations": [
            {"type": "url_citation", "url_citation": {
                "url": HITS[0].url, "title": HITS[0].title, "content": HITS[0].snippet,
                "start_index": 30, "end_index": 90}},
            {"type": "url_citation", "url_citation": {
                "url": HITS[1].url, "title": HITS[1].title, "start_index": 1,
                "end_index": 2}}]}}],
    "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930}}

GLM_ANSWER = {
    "id": "glm-1", "created": 1, "model": "glm-4.6", "request_id": "r",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "Rust 1.91.0 came out on 2026-10-30 [ref_1]."}}],
    "web_search": [
        {"refer": "ref_1", "title": HITS[0].title, "link": HITS[0].url, "media": "Rust Blog",
         "content": HITS[0].snippet, "icon": "", "publish_date": "2026-10-30"},
        {"refer": "ref_2", "title": HITS[2].title, "link": HITS[2].url, "media": "GitHub",
         "content": HITS[2].snippet, "icon": "", "publish_date": ""}],
    "usage": {"prompt_tokens": 500, "completion_tokens": 20, "total_tokens": 520}}


@pytest.mark.parametrize(("provider", "answer", "hits", "tool"), [
    ("openrouter", OPENROUTER_ANSWER, HITS[:2],
     {"type": "openrouter:web_search", "parameters": {"max_results": 8}}),
    ("glm", GLM_ANSWER, [HITS[0], HITS[2]],
     {"type": "web_search", "web_search": {"enable": True, "search_engine": "search_std",
                                           "search_result": True, "count": 8,
                                           "search_query": QUERY}})])
def test_native_search_sources_become_the_blocks(
        provider: str, answer: dict[str, Any], hits: list[Any], tool: dict[str, Any],
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, provider=provider,
                         small_model="native-model", web_search="native")
    upstream.queue(Reply(body=answer))
    message = stream_message(proxy, side_query())
    assert [block.type for block in message.content] == [
        "server_tool_use", "web_search_tool_result", "text"]
    assert message.content[0].input == {"query": QUERY}  # type: ignore[union-attr]
    assert result_pairs(message.content[1]) == expected_pairs(hits)  # type: ignore[arg-type]
    choice = answer["choices"][0]["message"]["content"]  # type: ignore[index]
    assert message.content[2].text == choice  # type: ignore[union-attr]
    assert search_backend.requests == []
    sent = upstream.requests[0]
    assert sent["tools"] == [tool] and "tool_choice" not in sent and "stream" not in sent
    assert_clean_upstream(upstream.requests)


def test_native_failure_falls_back_to_the_backend(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, provider="openrouter",
                         web_search="native")
    upstream.queue(error_reply(400, "tool type openrouter:web_search is not supported"),
                   completion({"content": SUMMARY}))
    message = stream_message(proxy, side_query())
    assert result_pairs(message.content[1]) == expected_pairs()  # type: ignore[arg-type]
    assert message.content[2].text == SUMMARY  # type: ignore[union-attr]
    assert [seen.query for seen in search_backend.requests] == [QUERY]
    assert upstream.requests[0]["tools"][0]["type"] == "openrouter:web_search"
    assert upstream.requests[1]["tools"][0]["function"]["name"] == "web_search"


# ---------------------------------------------------------------- visible


def test_metrics_and_access_log_count_searches(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer, caplog: pytest.LogCaptureFixture) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    with caplog.at_level(logging.INFO):
        create_message(proxy, side_query(stream=False))
        search_backend.mode = "429"
        create_message(proxy, side_query(stream=False))
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'claude_proxy_web_searches_total{backend="searxng",outcome="ok"} 1.0' in metrics
    assert ('claude_proxy_web_searches_total{backend="searxng",outcome="too_many_requests"} '
            '1.0') in metrics
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web_search ")]
    assert len(lines) == 2
    assert f"source=searxng query_chars={len(QUERY)} hits=4 outcome=ok" in lines[0]
    assert "hits=0 outcome=too_many_requests" in lines[1]
    assert QUERY not in " ".join(lines)


def test_a_failing_first_model_call_ends_the_stream_with_an_error(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    """Without a search to show, a failed model call is the client's error (an `error`
    event after message_start, overloaded_error for a 5xx, which Claude Code retries)."""
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(error_reply(503, "upstream overloaded"))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 256, "stream": True,
            "messages": [{"role": "user", "content": "search for rust news"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)
    events = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["message_start", "error"]
    assert events[1]["error"] == {"type": "overloaded_error", "message": "upstream overloaded"}
    assert search_backend.requests == []
    upstream.queue(error_reply(503, "upstream overloaded"))
    with pytest.raises(anthropic.APIStatusError) as caught:
        create_message(proxy, {**body, "stream": False})
    assert caught.value.status_code == 503


RESPONSES_ANSWER = {
    "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5",
    "output": [
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": QUERY, "sources": [
             {"type": "url", "url": HITS[0].url}, {"type": "url", "url": HITS[2].url}]}},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Rust 1.91.0 is out.", "annotations": [
             {"type": "url_citation", "url": HITS[0].url, "title": HITS[0].title,
              "start_index": 0, "end_index": 19}]}]}],
    "usage": {"input_tokens": 800, "output_tokens": 12, "total_tokens": 812}}


def test_native_search_on_the_responses_api(proxy_factory: Callable[..., ProxyServer],
                                            upstream: ScriptedUpstream,
                                            search_backend: SearchBackendServer) -> None:
    """An OpenAI reasoning model (sent to /responses) searches with its `web_search` tool;
    the cited sources come first, with titles, then the other sources it read."""
    proxy = search_proxy(proxy_factory, search_backend, provider="openai",
                         small_model="gpt-5", web_search="native")
    upstream.queue(Reply(body=RESPONSES_ANSWER))
    message = stream_message(proxy, side_query(allowed_domains=["rust-lang.org",
                                                                "github.com"]))
    assert result_pairs(message.content[1]) == [  # type: ignore[arg-type]
        (HITS[0].url, HITS[0].title), (HITS[2].url, HITS[2].url)]
    assert message.content[2].text == "Rust 1.91.0 is out."  # type: ignore[union-attr]
    assert upstream.paths == ["/v1/responses"] and search_backend.requests == []
    sent = upstream.requests[0]
    assert sent["tools"] == [{"type": "web_search", "filters": {
        "allowed_domains": ["rust-lang.org", "github.com"]}}]
    assert "web_search_call.action.sources" in sent["include"] and "stream" not in sent


def test_native_without_a_native_search_uses_the_backend(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend, provider="deepseek",
                         small_model="deepseek-chat", web_search="native")
    upstream.queue(completion({"content": SUMMARY}))
    message = stream_message(proxy, side_query())
    assert result_pairs(message.content[1]) == expected_pairs()  # type: ignore[arg-type]
    assert [s.query for s in search_backend.requests] == [QUERY]
    assert len(upstream.requests) == 1  # only the summary call
    assert_clean_upstream(upstream.requests)


def test_the_dashboard_inspector_lists_the_searches(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    proxy = search_proxy(proxy_factory, search_backend)
    upstream.queue(completion({"content": SUMMARY}))
    response = httpx.post(f"{proxy.url}/v1/messages", json=side_query(), timeout=30)
    view = httpx.get(f"{proxy.url}/ui/api/requests/{response.headers['request-id']}").json()
    events = [event for _, event, _ in view["row"]["timeline"]]
    assert "web search" in events
    detail = next(d for _, e, d in view["row"]["timeline"] if e == "web search")
    assert detail == f"searxng: ok, 4 hits, query {len(QUERY)} chars"
    assert view["row"]["stop"] == "end_turn" and view["row"]["stream"] is True
