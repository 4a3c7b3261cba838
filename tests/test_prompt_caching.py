"""Prompt caching across the translation, against scripted upstreams in the shapes of
OpenRouter (anthropic/*, qwen/*, google/*, other), DashScope, DeepSeek, Moonshot, OpenAI and
Azure: where the breakpoints go, the session key, the refusal fallback, byte-stable prefixes
over a recorded Claude Code session, and cache usage as each upstream reports it."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import ProviderSettings, Settings
from claude_proxy.conversion.caching import cache_mode, takes_cache_key
from claude_proxy.metrics import CacheStats
from tests.conftest import ProxyServer, eventually, load_fixture
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    text_stream,
)
from tests.sse_grammar import accumulate, check_grammar, parse_sse

FIRST = "claude-code-2.1.328-first-request.json"
SECOND = "claude-code-2.1.328-tool-loop-second-request.json"
SESSION = "claude-code-2.1.328-session-10-turns.json"

# Upstream shapes: (proxy settings, what is sent).
SHAPES: dict[str, dict[str, Any]] = {
    "openrouter-anthropic": {"provider": "openrouter", "model": "anthropic/claude-sonnet-4.6"},
    "openrouter-qwen": {"provider": "openrouter", "model": "qwen/qwen3-max"},
    "openrouter-google": {"provider": "openrouter", "model": "google/gemini-2.5-pro"},
    "openrouter-other": {"provider": "openrouter", "model": "openai/gpt-4o"},
    "dashscope": {"provider": "dashscope", "model": "qwen3-max"},
    "deepseek": {"provider": "deepseek", "model": "deepseek-chat"},
    "moonshot": {"provider": "kimi", "model": "kimi-k2.6"},
    "openai": {"provider": "openai", "model": "gpt-4o"},
    "azure": {"provider": "azure", "model": "gpt-4o", "azure_api_version": "2024-10-21"},
}
BREAKPOINTS = ("openrouter-anthropic", "openrouter-qwen", "dashscope")
AUTOMATIC = ("openrouter-other", "deepseek", "moonshot", "openai", "azure")
TAKES_KEY = ("openrouter-anthropic", "openrouter-qwen", "openrouter-google", "openrouter-other",
             "openai", "azure")

# The parts Claude Code marked in each fixture, as (message, role, part) and text start.
SYSTEM_MARKS = [((0, "system", 0), "You are a Claude agent"),
                ((0, "system", 1), "\nYou are an agent working")]
FIRST_MARKS = [*SYSTEM_MARKS, ((2, "system", 0), "# Environment")]
SECOND_MARKS = [*SYSTEM_MARKS, ((4, "tool", 0), "hi-from-tool")]
EPHEMERAL = {"type": "ephemeral"}


def shape_settings(shape: str) -> dict[str, Any]:
    values = dict(SHAPES[shape])
    model = values.pop("model")
    return {**values, "big_model": model, "middle_model": model, "small_model": model,
            "max_retries": 0}


@pytest.fixture(scope="module")
def proxies(proxy_factory: Callable[..., ProxyServer]) -> Iterator[dict[str, ProxyServer]]:
    """One proxy per upstream shape, started on first use."""
    started: dict[str, ProxyServer] = {}

    class Lazy(dict[str, ProxyServer]):
        def __missing__(self, shape: str) -> ProxyServer:
            started[shape] = proxy_factory(**shape_settings(shape))
            return started[shape]

    yield Lazy()


def fixture_request(name: str) -> tuple[dict[str, Any], str]:
    """The recorded body and its session header."""
    record = load_fixture(name)
    return record["body"], record["headers"]["X-Claude-Code-Session-Id"]


def send(proxy: ProxyServer, body: dict[str, Any], session: str | None = None) -> httpx.Response:
    headers = {"X-Claude-Code-Session-Id": session} if session else {}
    response = httpx.post(f"{proxy.url}/v1/messages?beta=true", json=body, headers=headers,
                          timeout=30)
    assert response.status_code == 200, response.text
    return response


def marks(body: dict[str, Any]) -> list[tuple[Any, str, dict[str, Any]]]:
    """Every breakpoint in an upstream body: where, the start of its text, the marker."""
    found: list[tuple[Any, str, dict[str, Any]]] = []
    for tool in body.get("tools") or []:
        if "cache_control" in tool:
            found.append((("tool", tool["function"]["name"]), "", tool["cache_control"]))
    for index, message in enumerate(body["messages"]):
        assert "cache_control" not in message, "never on a message object"
        content = message.get("content")
        for position, part in enumerate(content if isinstance(content, list) else []):
            if "cache_control" in part:
                found.append(((index, message["role"], position), part.get("text", ""),
                              part["cache_control"]))
    return found


def located(body: dict[str, Any]) -> list[tuple[Any, str]]:
    """`marks` as (where, text start) pairs, text cut to the expectation's length."""
    return [(where, text) for where, text, _ in marks(body)]


def starts(found: list[tuple[Any, str]], wanted: list[tuple[Any, str]]) -> bool:
    return len(found) == len(wanted) and all(
        where == want_where and text.startswith(want_text)
        for (where, text), (want_where, want_text) in zip(found, wanted, strict=True))


# ---------------------------------------------------------------- modes


@pytest.mark.parametrize(("shape", "mode"), [
    ("openrouter-anthropic", "breakpoints"), ("openrouter-qwen", "breakpoints"),
    ("dashscope", "breakpoints"), ("openrouter-google", "last_breakpoint"),
    ("openrouter-other", "automatic"), ("deepseek", "automatic"), ("moonshot", "automatic"),
    ("openai", "automatic"), ("azure", "automatic")])
def test_default_mode_by_profile_and_model(shape: str, mode: str) -> None:
    values = dict(SHAPES[shape])
    model = values.pop("model")
    assert cache_mode(ProviderSettings(**values), model) == mode
    assert cache_mode(ProviderSettings(**values, prompt_cache="off"), model) == "off"


def test_prompt_cache_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPT_CACHE", "Last_Breakpoint")
    assert Settings().prompt_cache == "last_breakpoint"
    monkeypatch.setenv("PROMPT_CACHE", "sometimes")
    with pytest.raises(ValueError, match="prompt_cache"):
        Settings()


def test_prompt_cache_in_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('[providers.router]\nprovider = "openrouter"\nopenai_api_key = "sk-x"\n'
                    'prompt_cache = "off"\n[providers.qwen]\nprovider = "dashscope"\n'
                    'openai_api_key = "sk-y"\n', encoding="utf-8")
    providers = load_config_file(path, Settings()).providers
    assert cache_mode(providers["router"], "anthropic/claude-sonnet-4.6") == "off"
    assert cache_mode(providers["qwen"], "qwen3-max") == "breakpoints"


@pytest.mark.parametrize(("url", "takes"), [
    ("https://api.openai.com/v1", True), ("https://openrouter.ai/api/v1", True),
    ("https://api.groq.com/openai/v1", False),
    ("https://generativelanguage.googleapis.com/v1beta/openai", False),
    ("https://api.deepseek.com/v1", False), ("https://api.moonshot.ai/v1", False)])
def test_cache_key_only_to_upstreams_that_take_it(url: str, takes: bool) -> None:
    assert takes_cache_key(ProviderSettings(openai_base_url=url)) is takes


# ---------------------------------------------------------------- placement


@pytest.mark.parametrize("shape", BREAKPOINTS)
@pytest.mark.parametrize(("fixture", "points"), [(FIRST, FIRST_MARKS), (SECOND, SECOND_MARKS)])
def test_breakpoints_on_the_parts_the_client_marked(
        shape: str, fixture: str, points: list[tuple[Any, str]],
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    body, session = fixture_request(fixture)
    send(proxies[shape], body, session)
    sent = upstream.requests[-1]
    assert starts(located(sent), points), located(sent)
    assert [marker for _, _, marker in marks(sent)] == [EPHEMERAL] * len(points)
    assert "x-anthropic-billing-header" not in json.dumps(sent)


@pytest.mark.parametrize(("fixture", "points"), [(FIRST, FIRST_MARKS), (SECOND, SECOND_MARKS)])
def test_google_gets_only_the_last_breakpoint(
        fixture: str, points: list[tuple[Any, str]], proxies: dict[str, ProxyServer],
        upstream: ScriptedUpstream) -> None:
    body, session = fixture_request(fixture)
    send(proxies["openrouter-google"], body, session)
    assert starts(located(upstream.requests[-1]), points[-1:])


@pytest.mark.parametrize("shape", AUTOMATIC)
@pytest.mark.parametrize("fixture", [FIRST, SECOND])
def test_no_breakpoints_for_automatic_caching(
        shape: str, fixture: str, proxies: dict[str, ProxyServer],
        upstream: ScriptedUpstream) -> None:
    body, session = fixture_request(fixture)
    send(proxies[shape], body, session)
    sent = upstream.requests[-1]
    assert "cache_control" not in json.dumps(sent)
    assert all(isinstance(message["content"], str | None) for message in sent["messages"])


def marked_variant() -> dict[str, Any]:
    """The second fixture with what newer Claude Code versions send: `ttl` and `scope` on the
    system blocks, an unknown key, and five breakpoints in all."""
    body, _ = fixture_request(SECOND)
    body = copy.deepcopy(body)
    for block in body["system"][1:]:
        block["cache_control"] = {"type": "ephemeral", "ttl": "1h", "scope": "global"}
    body["tools"][-1]["cache_control"] = {"type": "ephemeral"}
    body["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral", "x": 1}
    return body


def test_at_most_four_the_last_in_prompt_order_with_ttl_and_no_scope(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    send(proxies["openrouter-anthropic"], marked_variant())
    found = marks(upstream.requests[-1])
    # tools → system → messages: the tool's breakpoint is the first, so the one left out.
    assert [(where, marker) for where, _, marker in found] == [
        ((0, "system", 0), {"type": "ephemeral", "ttl": "1h"}),
        ((0, "system", 1), {"type": "ephemeral", "ttl": "1h"}),
        ((1, "user", 0), EPHEMERAL),
        ((4, "tool", 0), EPHEMERAL)]


def test_dashscope_takes_no_ttl_and_no_tool_breakpoint(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    send(proxies["dashscope"], marked_variant())
    found = marks(upstream.requests[-1])
    assert [(where, marker) for where, _, marker in found] == [
        ((0, "system", 0), EPHEMERAL), ((0, "system", 1), EPHEMERAL),
        ((1, "user", 0), EPHEMERAL), ((4, "tool", 0), EPHEMERAL)]


def test_openrouter_puts_the_tool_breakpoint_on_the_function_tool(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    body, session = fixture_request(FIRST)
    body = copy.deepcopy(body)
    body["tools"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "5m"}
    send(proxies["openrouter-anthropic"], body, session)
    sent = upstream.requests[-1]
    assert sent["tools"][-1] == {
        "type": "function", "function": sent["tools"][-1]["function"],
        "cache_control": {"type": "ephemeral", "ttl": "5m"}}
    assert sent["tools"][-1]["function"]["name"] == body["tools"][-1]["name"]
    assert len(marks(sent)) == 4


# ---------------------------------------------------------------- session key


def key_of(value: str) -> str:
    return "cc-" + hashlib.sha256(value.encode()).hexdigest()[:40]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_prompt_cache_key_is_a_hash_of_the_session_where_taken(
        shape: str, proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    body, session = fixture_request(FIRST)
    send(proxies[shape], body, session)
    sent = upstream.requests[-1]
    if shape in TAKES_KEY:
        assert sent["prompt_cache_key"] == key_of(session)
        assert session not in sent["prompt_cache_key"]
    else:
        assert "prompt_cache_key" not in sent


def test_without_the_header_the_key_hashes_metadata_user_id(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    body, _ = fixture_request(FIRST)
    send(proxies["openai"], body)
    assert upstream.requests[-1]["prompt_cache_key"] == key_of(body["metadata"]["user_id"])


# ---------------------------------------------------------------- refusals


def refusing(field_present: Callable[[dict[str, Any]], bool], message: str
             ) -> Callable[[dict[str, Any]], Reply]:
    def respond(body: dict[str, Any]) -> Reply:
        return error_reply(400, message) if field_present(body) else text_stream(["fine"])
    return respond


def answer_of(response: httpx.Response) -> str:
    events = parse_sse(response.content)
    check_grammar(events)
    return str(accumulate(events)["content"][0]["text"])


@pytest.mark.parametrize(("shape", "message"), [
    ("openrouter-anthropic", "messages.0.content.0.cache_control: Extra inputs are not "
                             "permitted"),
    ("dashscope", "Error from provider: Extra inputs are not permitted, field: "
                  "'messages[0].content[0].cache_control'"),
])
def test_refused_breakpoints_are_dropped_and_remembered(
        shape: str, message: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**shape_settings(shape))
    upstream.responder = refusing(lambda body: "cache_control" in json.dumps(body), message)
    body, session = fixture_request(SECOND)
    assert answer_of(send(proxy, body, session)) == "fine"
    assert answer_of(send(proxy, body, session)) == "fine"
    assert [len(marks(request)) for request in upstream.requests] == [3, 0, 0]
    # The rest of the request is what it was: the same messages, parts and all.
    without = [orjson.dumps(request).replace(b',"cache_control":{"type":"ephemeral"}', b"")
               for request in upstream.requests]
    assert without[0] == without[1] == without[2]


def test_refused_prompt_cache_key_is_dropped_and_remembered(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**shape_settings("openai"))
    upstream.responder = refusing(
        lambda body: "prompt_cache_key" in body,
        'Invalid JSON payload received. Unknown name "prompt_cache_key": Cannot find field.')
    body, session = fixture_request(FIRST)
    for _ in range(2):
        assert answer_of(send(proxy, body, session)) == "fine"
    assert ["prompt_cache_key" in request for request in upstream.requests] == [
        True, False, False]


def test_refused_later_system_message_goes_in_place_as_user(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**shape_settings("moonshot"))
    upstream.responder = refusing(
        lambda body: [m["role"] for m in body["messages"]].count("system") > 1,
        "System message must be at the beginning.")
    body, session = fixture_request(SECOND)
    for _ in range(2):
        assert answer_of(send(proxy, body, session)) == "fine"
    first, retried, later = upstream.requests
    assert [m["role"] for m in first["messages"]] == [
        "system", "user", "system", "assistant", "tool"]
    assert [m["role"] for m in retried["messages"]] == [
        "system", "user", "user", "assistant", "tool"]
    environment = first["messages"][2]["content"]
    assert retried["messages"][2]["content"] == (
        f"<system-reminder>\n{environment}\n</system-reminder>")
    assert retried["messages"][0] == first["messages"][0]
    assert later == retried


# ---------------------------------------------------------------- byte-stable prefixes


def session_turns() -> list[tuple[dict[str, Any], str]]:
    return [(turn["body"], turn["session_id"]) for turn in load_fixture(SESSION)["turns"]]


def fixture_turns() -> list[tuple[dict[str, Any], str]]:
    """The tool-loop fixture and the turn before it (its first two messages, the last one
    marked as Claude Code marks the last message)."""
    body, session = fixture_request(SECOND)
    before = copy.deepcopy(body)
    before["messages"] = before["messages"][:2]
    before["messages"][1]["content"] = [{"type": "text", "text": body["messages"][1]["content"],
                                         "cache_control": EPHEMERAL}]
    return [(before, session), (body, session)]


def rendered(body: dict[str, Any], part: str) -> bytes:
    """The bytes of `messages`, `tools` or the system text as sent. For breakpoint upstreams
    the markers are left out and a one-part text array counts as its string (the upstream
    renders them the same)."""
    value = copy.deepcopy(body.get(part) if part != "system" else body["messages"][0])
    if part == "messages":
        for message in value:
            content = message.get("content")
            if isinstance(content, list):
                for item in content:
                    item.pop("cache_control", None)
                if len(content) == 1 and content[0]["type"] == "text":
                    message["content"] = content[0]["text"]
    if part == "tools":
        for tool in value or []:
            tool.pop("cache_control", None)
    if part == "system" and isinstance(value["content"], list):
        for item in value["content"]:
            item.pop("cache_control", None)
    return orjson.dumps(value)


def assert_prefix_stable(bodies: list[dict[str, Any]]) -> None:
    for before, after in pairwise(bodies):
        old, new = rendered(before, "messages"), rendered(after, "messages")
        assert new.startswith(old[:-1]) and len(new) > len(old), (old[-300:], new[:len(old)][-300:])
        assert rendered(before, "tools") == rendered(after, "tools")
        assert rendered(before, "system") == rendered(after, "system")
        for key in ("model", "reasoning_effort", "thinking", "enable_thinking", "reasoning",
                    "max_tokens", "prompt_cache_key", "user"):
            assert before.get(key) == after.get(key), key


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("turns", [session_turns, fixture_turns], ids=["session", "fixtures"])
def test_each_upstream_body_begins_with_the_previous_ones_bytes(
        shape: str, turns: Callable[[], list[tuple[dict[str, Any], str]]],
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    for body, session in turns():
        send(proxies[shape], body, session)
    bodies = upstream.requests
    assert_prefix_stable(bodies)
    if shape not in BREAKPOINTS and shape != "openrouter-google":
        # Automatic caching needs the exact bytes: markers or not, nothing else moves.
        for before, after in pairwise(bodies):
            assert orjson.dumps(after["messages"]).startswith(
                orjson.dumps(before["messages"])[:-1])
    # The mid-conversation system message stays where Claude Code put it (DeepSeek: as a
    # user message, or its template would move it to the front).
    for body in bodies:
        assert [m["role"] for m in body["messages"][:2]] == ["system", "user"]
        role, text = body["messages"][2]["role"], body["messages"][2]["content"]
        text = text if isinstance(text, str) else text[0]["text"]
        if shape == "deepseek":
            assert role == "user" and text.startswith("<system-reminder>\n# Environment")
            assert text.endswith("\n</system-reminder>")
        else:
            assert role == "system" and text.startswith("# Environment")


# ---------------------------------------------------------------- usage


def replay_request(stem: str, stream: bool) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 1024, "stream": stream,
            "messages": [{"role": "user", "content": f"SCENARIO:replay:{stem}"}]}


def usage_of(proxy: ProxyServer, body: dict[str, Any]) -> dict[str, Any]:
    """The usage Claude Code reads: the final message_delta's, or the message's."""
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        usage: dict[str, Any] = response.json()["usage"]
        return usage
    events = parse_sse(response.content)
    check_grammar(events)
    deltas = [event.data["usage"] for event in events if event.name == "message_delta"]
    assert len(deltas) == 1
    return deltas[0]


def anthropic(input_: int, read: int, write: int, output: int) -> dict[str, int]:
    return {"input_tokens": input_, "output_tokens": output,
            "cache_creation_input_tokens": write, "cache_read_input_tokens": read}


@pytest.mark.parametrize(("stem", "stream", "expected"), [
    # DeepSeek: prompt_cache_hit_tokens (and cached_tokens) 320 of 339.
    ("deepseek-reasoner-tool", True, anthropic(19, 320, 0, 83)),
    ("deepseek-reasoner-json", False, anthropic(18, 0, 0, 345)),
    # Kimi behind an OpenRouter-style relay: cached_tokens 128, cache_write_tokens 0.
    ("avian-kimi-k25-parallel-tools", True, anthropic(26, 128, 0, 131)),
    # OpenRouter (Gemini): cached_tokens and cache_write_tokens, both 0.
    ("openrouter-gemini-encrypted-reasoning-tools", True, anthropic(157, 0, 0, 32)),
    # Z.AI: prompt_tokens_details.cached_tokens, streamed and not.
    ("zai-glm47flash-reasoning-tool", True, anthropic(1, 172, 0, 87)),
    ("zai-glm47flash-reasoning-tool-json", False, anthropic(4, 169, 0, 89)),
    # xAI: cached_tokens 287 of 288; reasoning counted apart from completion.
    ("xai-grok3mini-reasoning-tool", True, anthropic(1, 287, 0, 340)),
    # OpenAI and Azure: cached_tokens 0.
    ("openai-gpt4o-parallel-tools", True, anthropic(106, 0, 0, 50)),
    ("azure-gpt5mini-tool", True, anthropic(145, 0, 0, 154)),
    # DashScope: cached_tokens 0.
    ("dashscope-qwen3max-tool", True, anthropic(295, 0, 0, 22)),
])
def test_recorded_cache_usage(stem: str, stream: bool, expected: dict[str, int],
                              proxy: ProxyServer) -> None:
    assert usage_of(proxy, replay_request(stem, stream)) == expected


# The documented shapes no recording carries with non-zero numbers (reference A.2).
USAGE_SHAPES: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "openrouter-read": ({"prompt_tokens": 10339, "completion_tokens": 60, "total_tokens": 10399,
                         "prompt_tokens_details": {"cached_tokens": 10318,
                                                   "cache_write_tokens": 0}},
                        anthropic(21, 10318, 0, 60)),
    "openrouter-write": ({"prompt_tokens": 194, "completion_tokens": 5, "total_tokens": 199,
                          "prompt_tokens_details": {"cached_tokens": 0,
                                                    "cache_write_tokens": 100}},
                         anthropic(94, 0, 100, 5)),
    "dashscope-write": ({"prompt_tokens": 29719, "completion_tokens": 435, "total_tokens": 30154,
                         "prompt_tokens_details": {
                             "text_tokens": 29719, "cached_tokens": 0,
                             "cache_creation_input_tokens": 29713,
                             "cache_creation": {"ephemeral_5m_input_tokens": 29713},
                             "cache_type": "ephemeral"}},
                        anthropic(6, 0, 29713, 435)),
    "deepseek-hit": ({"prompt_tokens": 5000, "completion_tokens": 10, "total_tokens": 5010,
                      "prompt_cache_hit_tokens": 4864, "prompt_cache_miss_tokens": 136},
                     anthropic(136, 4864, 0, 10)),
    "moonshot-top-level": ({"prompt_tokens": 2989, "completion_tokens": 7, "total_tokens": 2996,
                            "cached_tokens": 2560},
                           anthropic(429, 2560, 0, 7)),
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("shape", list(USAGE_SHAPES))
def test_documented_cache_usage_shapes(shape: str, stream: bool, proxy: ProxyServer,
                                       upstream: ScriptedUpstream) -> None:
    usage, wanted = USAGE_SHAPES[shape]
    reply = text_stream(["ok"], usage=usage) if stream else completion({"content": "ok"},
                                                                       usage=usage)
    upstream.queue(reply)
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}
    assert usage_of(proxy, body) == wanted


def test_moonshot_streamed_usage_inside_the_choice(proxy: ProxyServer,
                                                   upstream: ScriptedUpstream) -> None:
    """Moonshot streams its usage in `choices[0].usage` of the last chunk."""
    last = chunk({}, "stop")
    last["choices"][0]["usage"] = {"prompt_tokens": 2989, "completion_tokens": 7,
                                   "total_tokens": 2996, "cached_tokens": 2989}
    upstream.queue(Reply(events=[chunk({"role": "assistant", "content": "ok"}), last]))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    assert usage_of(proxy, body) == anthropic(0, 2989, 0, 7)


# ---------------------------------------------------------------- visible


def test_cache_reads_and_writes_in_the_access_line_and_metrics(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = proxy_factory()
    usage, _ = USAGE_SHAPES["openrouter-write"]
    upstream.queue(text_stream(["ok"], usage=usage),
                   text_stream(["ok"], usage=USAGE_SHAPES["openrouter-read"][0]))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level("INFO", logger="claude_proxy.access"):
        ids = [httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30).headers[
            "request-id"] for _ in range(2)]

        def line(request_id: str) -> str | None:
            return next((r.getMessage() for r in caplog.records
                         if r.name == "claude_proxy.access"
                         and r.getMessage().startswith(f"request_id={request_id} ")), None)

        assert eventually(lambda: all(line(request_id) for request_id in ids))
    assert str(line(ids[0])).endswith(
        "cache_read=0 cache_write=100 input=94 output=5 reasoning=0 cached=0")
    assert str(line(ids[1])).endswith(
        "cache_read=10318 cache_write=0 input=21 output=60 reasoning=0 cached=10318")

    def metrics_counted() -> bool:
        return 'claude_proxy_tokens_total{kind="cache_read"} 10318.0' in httpx.get(
            f"{proxy.url}/metrics").text

    assert eventually(metrics_counted)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'claude_proxy_tokens_total{kind="cache_write"} 100.0' in text
    assert 'claude_proxy_tokens_total{kind="cached"} 10318.0' in text
    detail = httpx.get(f"{proxy.url}/health?detail=1").json()["providers"]["openai"]
    assert detail["prompt_cache"] == {"prompt_tokens": 10533, "cache_read_tokens": 10318,
                                      "cache_hit_ratio": round(10318 / 10533, 4)}


def test_cache_hit_ratio_per_provider() -> None:
    stats = CacheStats()
    stats.observe("openrouter", {"input": 94, "cache_read": 0, "cache_write": 100})
    stats.observe("openrouter", {"input": 21, "cache_read": 10318, "cache_write": 0})
    stats.observe("deepseek", {"input": 0, "cache_read": 0, "cache_write": 0})
    assert stats.ratios() == {
        "openrouter": {"prompt_tokens": 10533, "cache_read_tokens": 10318,
                       "cache_hit_ratio": round(10318 / 10533, 4)},
        "deepseek": {"prompt_tokens": 0, "cache_read_tokens": 0, "cache_hit_ratio": 0.0}}
