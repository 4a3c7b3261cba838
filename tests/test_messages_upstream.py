"""A Messages API upstream (`api = "messages"`) through a real proxy: the anthropic SDK (or
httpx and the SSE grammar) in front, the scripted upstream speaking Anthropic's wire format
behind. Each endpoint quirk has its test, its source in a comment (the research notes:
/tmp/research/messages-upstreams.md, read 2026-11-28).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.cli.command_line import http_protocol
from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import Settings, load_settings
from claude_proxy.conversion.signatures import Origin, ThinkingSigner
from claude_proxy.server.app import create_app
from claude_proxy.upstream.api import MESSAGES, api_for
from tests.conftest import (
    UPSTREAM_KEY,
    ProxyServer,
    RecordingApp,
    clean_env,
    eventually,
    serving,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    anthropic_error,
    bind_loopback,
    chunk,
    message_reply,
    message_stream,
    serve_in_thread,
    stop_server,
)
from tests.search_backend import SearchBackendServer
from tests.sse_grammar import check_grammar, parse_sse

SECRET = "messages-upstream-secret"
SIGNER = ThinkingSigner(SECRET)
CALCULATOR = {"name": "calculator", "description": "A minimal calculator.",
              "input_schema": {"type": "object", "properties": {
                  "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,advanced-tool-use-2025-11-20"


def messages_proxy(factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
                   provider: str = "generic", **overrides: Any) -> ProxyServer:
    return factory(upstream_api="messages", openai_base_url=upstream.root_url,
                   provider=provider, thinking_signature_secret=SECRET, **overrides)


def sdk(proxy: ProxyServer, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0,
                               default_headers=headers or None)


def stream(proxy: ProxyServer, **request: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": "claude-opus-4-7", "max_tokens": 4096,
                              "messages": [{"role": "user", "content": "hi"}]}
    fields.update(request)
    with sdk(proxy).messages.stream(**fields) as answer:
        return answer.get_final_message().model_dump(exclude_none=True)


def raw_events(proxy: ProxyServer, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers or {},
                          timeout=30)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    check_grammar(events)
    return [event.data for event in events]


# ---------------------------------------------------------------- the basic path


def test_text_goes_to_v1_messages_with_the_routes_model_and_the_key(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(message_stream([{"type": "text", "text": "Hello from upstream"}],
                                  model="big-upstream"))
    message = stream(proxy)
    assert [block["text"] for block in message["content"]] == ["Hello from upstream"]
    assert message["stop_reason"] == "end_turn"
    assert message["model"] == "claude-opus-4-7"
    assert message["usage"]["input_tokens"] == 12 and message["usage"]["output_tokens"] == 5
    assert upstream.paths == ["/v1/messages"]
    sent, headers = upstream.requests[0], upstream.headers[0]
    assert sent["model"] == "big-upstream"  # the route's model, never the client's name
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    assert headers["x-api-key"] == UPSTREAM_KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers  # generic: as the Anthropic SDK sends a key


def test_a_whole_message_for_a_client_that_does_not_stream(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(message_reply([
        {"type": "text", "text": "Let me add."},
        {"type": "tool_use", "id": "toolu_01", "name": "calculator",
         "input": {"a": 2, "b": 3}}], stop_reason="tool_use"))
    message = sdk(proxy).messages.create(
        model="claude-opus-4-7", max_tokens=100, tools=[CALCULATOR],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "2+3?"}]).model_dump(exclude_none=True)
    assert message["content"] == [
        {"type": "text", "text": "Let me add."},
        {"type": "tool_use", "id": "toolu_01", "name": "calculator", "input": {"a": 2, "b": 3},
         "caller": {"type": "direct"}} if "caller" in message["content"][1] else
        {"type": "tool_use", "id": "toolu_01", "name": "calculator", "input": {"a": 2, "b": 3}}]
    assert message["stop_reason"] == "tool_use"
    assert "stream" not in upstream.requests[0]


def test_tool_use_streams_as_the_upstream_sent_it(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(message_stream([
        {"type": "text", "text": "Adding."},
        {"type": "tool_use", "id": "toolu_02", "name": "calculator", "input": {"a": 1, "b": 2}}],
        stop_reason="tool_use"))
    message = stream(proxy, tools=[CALCULATOR])
    assert message["content"][1]["input"] == {"a": 1, "b": 2}
    assert message["content"][1]["id"] == "toolu_02"
    assert message["stop_reason"] == "tool_use"
    assert upstream.requests[0]["tools"] == [CALCULATOR]


def test_an_upstream_error_is_relayed_in_anthropic_wording(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    # Z.AI's overflow text (zai-org/zai-coding-plugins#12): Claude Code compacts only on
    # "prompt is too long: N tokens > M maximum".
    upstream.queue(anthropic_error(400, "The model has reached its context window limit."))
    response = httpx.post(f"{proxy.url}/v1/messages", json={
        "model": "claude-opus-4-7", "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")


def test_an_error_event_in_the_stream_has_its_status(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, max_retries=0)
    upstream.queue(Reply(events=[
        {"type": "message_start", "message": {
            "id": "m", "type": "message", "role": "assistant", "model": "x",
            "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}],
                         named=True, done=False))
    response = httpx.post(f"{proxy.url}/v1/messages", json={
        "model": "claude-opus-4-7", "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert response.status_code == 529
    assert response.json()["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_bad_input_gets_the_proxys_400_before_anything_is_sent(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    response = httpx.post(f"{proxy.url}/v1/messages", json={
        "model": "claude-opus-4-7", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30)
    assert response.status_code == 400
    assert "max_tokens" in response.json()["error"]["message"]
    assert upstream.requests == []


# ---------------------------------------------------------------- thinking


def test_the_upstreams_signature_rides_in_the_envelope_and_goes_back_to_it(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(message_stream([
        {"type": "thinking", "thinking": "2 and 3 make 5.", "signature": "UPSTREAM-SIG-1"},
        {"type": "text", "text": "5"}], model="big-upstream"))
    message = stream(proxy, thinking={"type": "adaptive"})
    thinking = message["content"][0]
    assert thinking["thinking"] == "2 and 3 make 5."
    envelope = SIGNER.verify(thinking["thinking"], thinking["signature"])
    assert envelope is not None
    assert envelope.origin.provider == "generic" and envelope.origin.model == "big-upstream"
    assert envelope.opaque == [{"type": "anthropic_signature", "signature": "UPSTREAM-SIG-1"}]
    upstream.queue(message_stream([{"type": "text", "text": "ok"}]))
    stream(proxy, thinking={"type": "adaptive"}, messages=[
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": "thanks"}])
    assert upstream.requests[1]["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "2 and 3 make 5.", "signature": "UPSTREAM-SIG-1"},
        {"type": "text", "text": "5"}]


# ---------------------------------------------------------------- doctor


def run_doctor(tmp_path: Path, upstream: ScriptedUpstream,
               **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=upstream.root_url,
                    UPSTREAM_API="messages", PROVIDER="kimi", BIG_MODEL="kimi-k2.5",
                    MIDDLE_MODEL="kimi-k2.5", SMALL_MODEL="kimi-k2.5", **extra)
    return subprocess.run([sys.executable, "-m", "claude_proxy", "doctor"], env=env,
                          capture_output=True, text=True, timeout=60)


def answering_as(model: str | None) -> Callable[[dict[str, Any]], Reply]:
    def respond(body: dict[str, Any]) -> Reply:
        thinking = body.get("thinking", {}).get("type") == "adaptive"
        blocks = [{"type": "thinking", "thinking": "17*23 = 391", "signature": "s"}] * thinking
        if body.get("tools"):
            blocks.append({"type": "tool_use", "id": "toolu_1", "name": "get_time",
                           "input": {}})
        return message_reply([*blocks, {"type": "text", "text": "ok"}],
                             model=model or body["model"])
    return respond


def test_doctor_checks_the_model_that_answers(tmp_path: Path,
                                              upstream: ScriptedUpstream) -> None:
    upstream.responder = answering_as(None)
    result = run_doctor(tmp_path, upstream)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "reachable      ok    Messages API" in out
    assert "model          ok    answered as kimi-k2.5" in out
    assert "reasoning      ok    11 chars of thinking, signed" in out
    assert "tools          ok    accepted; the model called get_time" in out
    assert all(path == "/v1/messages" for path in upstream.paths)


def test_doctor_says_when_the_endpoint_substitutes_another_model(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    # Kimi Code answered a request for kimi-k2.5 as kimi-for-coding (laotaotie.com skill
    # page [unverified]); Z.AI maps names server-side (docs.z.ai devpack/tool/claude).
    upstream.responder = answering_as("kimi-for-coding")
    result = run_doctor(tmp_path, upstream)
    assert ("model          warn  asked for kimi-k2.5, answered as kimi-for-coding: the "
            "endpoint substitutes another model for this name") in result.stdout
    assert {body["model"] for body in upstream.requests} == {"kimi-k2.5"}


# ---------------------------------------------------------------- the env files

ROOT = Path(__file__).resolve().parents[1]
MESSAGES_ENV_FILES = sorted(path.name for path in ROOT.glob(".env.*-anthropic"))


def test_there_is_an_env_file_per_hosted_messages_endpoint() -> None:
    assert MESSAGES_ENV_FILES == [
        ".env.dashscope-anthropic", ".env.deepseek-anthropic", ".env.glm-anthropic",
        ".env.kimi-anthropic", ".env.kimi-coding-anthropic", ".env.minimax-anthropic"]


@pytest.mark.parametrize("name", MESSAGES_ENV_FILES)
def test_each_messages_env_file_loads_as_a_messages_upstream(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    for variable in list(os.environ):
        if variable.startswith(("OPENAI_", "REASONING_", "PROVIDER", "UPSTREAM_", "BIG_",
                                "MIDDLE_", "SMALL_")):
            monkeypatch.delenv(variable)
    settings = load_settings(ROOT / name)
    assert settings.upstream_api == "messages"
    assert settings.openai_base_url.startswith("https://")
    assert not settings.openai_base_url.endswith("/v1")  # the proxy appends /v1/messages
    assert api_for(settings.model_for_tier("big"), settings) is MESSAGES
    for line in (ROOT / name).read_text().splitlines():  # docker --env-file's rules
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key.isupper() and " #" not in value and not value.startswith(('"', "'"))


# ---------------------------------------------------------------- refusals, learned once

# Anthropic's own wording (via Vertex), QuantumNous/new-api#2975 (2026-02-20).
BETA_REFUSAL = ("Unexpected value(s) `advanced-tool-use-2025-11-20` for the `anthropic-beta` "
                "header. Please consult our documentation at docs.anthropic.com or try again "
                "without the header.")


def post(proxy: ProxyServer, body: dict[str, Any], **headers: str) -> httpx.Response:
    fields: dict[str, Any] = {"model": "claude-opus-4-7", "max_tokens": 1024,
                              "messages": [{"role": "user", "content": "hi"}]}
    fields.update(body)
    return httpx.post(f"{proxy.url}/v1/messages", json=fields, headers=headers, timeout=30)


def test_a_refused_beta_value_is_learned_once(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)  # generic: every beta passes at first
    upstream.queue(anthropic_error(400, BETA_REFUSAL))
    first = post(proxy, {}, **{"anthropic-beta": BETAS})
    assert first.status_code == 200, first.text
    assert first.json()["content"] == [{"type": "text", "text": "scripted default"}]
    second = post(proxy, {}, **{"anthropic-beta": BETAS})
    assert second.status_code == 200
    sent = [headers.get("anthropic-beta") for headers in upstream.headers]
    kept = "claude-code-20250219,interleaved-thinking-2025-05-14"
    assert sent == [BETAS, kept, kept]  # refused, retried without, never sent again


def test_a_refused_field_is_learned_once(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    # Anthropic-style validation wording for a field an endpoint does not know.
    upstream.queue(anthropic_error(400, "context_management: Extra inputs are not permitted"))
    edits = {"context_management": {"edits": [{"type": "clear_thinking_20251015"}]}}
    assert post(proxy, edits).status_code == 200
    assert post(proxy, edits).status_code == 200
    assert ["context_management" in body for body in upstream.requests] == [True, False, False]


def test_a_refused_nested_field_takes_only_itself_away(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(anthropic_error(
        400, "tools.0.custom.input_examples: Extra inputs are not permitted"))
    tool = {**CALCULATOR, "input_examples": [{"a": 1, "b": 2}]}
    assert post(proxy, {"tools": [tool]}).status_code == 200
    assert [body["tools"] for body in upstream.requests] == [[tool], [CALCULATOR]]


def test_kimis_bare_invalid_request_takes_the_newer_features_away_once(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # Kimi Code answers a tool_reference or a newer beta with a bare 400 "Invalid request
    # Error" (farion1231/cc-switch#2941; MoonshotAI/Kimi-K2.5#5); exact body from the former.
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(anthropic_error(400, "", body={
        "error": {"type": "invalid_request_error", "message": "Invalid request Error"},
        "type": "error"}))
    deferred = {**CALCULATOR, "name": "mcp__db__query", "defer_loading": True}
    body = {"tools": [CALCULATOR, deferred]}
    assert post(proxy, body, **{"anthropic-beta": BETAS}).status_code == 200
    retried = upstream.requests[1]
    assert retried["tools"] == [CALCULATOR]
    assert "anthropic-beta" not in upstream.headers[1]
    assert post(proxy, body, **{"anthropic-beta": BETAS}).status_code == 200
    assert len(upstream.requests) == 3 and upstream.requests[2]["tools"] == [CALCULATOR]


def test_kimi_gets_tool_references_as_text_and_no_tool_search_beta(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # api.moonshot.cn/anthropic: 400 "failed to convert tool result content: unsupported
    # content type in ContentBlockParamUnion: tool_reference" (MoonshotAI/Kimi-K2#118).
    proxy = messages_proxy(proxy_factory, upstream, provider="kimi")
    deferred = {**CALCULATOR, "name": "mcp__db__query", "defer_loading": True}
    history = [
        {"role": "user", "content": "find the db tool"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s",
                                           "name": "ToolSearch", "input": {"query": "db"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s",
                                      "content": [{"type": "tool_reference",
                                                   "tool_name": "mcp__db__query"}]}]}]
    assert post(proxy, {"tools": [CALCULATOR, deferred], "messages": history},
                **{"anthropic-beta": BETAS}).status_code == 200
    sent = upstream.requests[0]
    assert sent["messages"][2]["content"][0]["content"] == [
        {"type": "text", "text": "Tool mcp__db__query is now available."}]
    assert sent["tools"] == [CALCULATOR, {k: v for k, v in deferred.items()
                                          if k != "defer_loading"}]
    assert upstream.headers[0]["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert upstream.headers[0]["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_zai_under_the_tool_search_beta_sees_only_the_loaded_tools(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # With `advanced-tool-use-2025-11-20` Z.AI defers every tool, even those without
    # defer_loading (zai-org/feedback#172): the glm profile sends neither the beta nor
    # defer_loading, and leaves out the deferred tools nothing has loaded.
    proxy = messages_proxy(proxy_factory, upstream, provider="glm")
    deferred = {**CALCULATOR, "name": "mcp__db__query", "defer_loading": True}
    search_tool = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
    assert post(proxy, {"tools": [CALCULATOR, deferred, search_tool]},
                **{"anthropic-beta": BETAS}).status_code == 200
    # The proxy runs the server tool search itself (toolsearch/): the model gets the loaded
    # tool and the search function, never the deferred one.
    sent = upstream.requests[0]["tools"]
    assert sent[0] == CALCULATOR
    assert [tool["name"] for tool in sent] == ["calculator", "tool_search_tool_regex"]
    assert "advanced-tool-use" not in upstream.headers[0].get("anthropic-beta", "")


def test_claude_codes_billing_header_block_and_newer_fields_are_left_out(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="glm")
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=0;"},
              {"type": "text", "text": "You are Claude Code.",
               "cache_control": {"type": "ephemeral", "scope": "global"}}]
    assert post(proxy, {"system": system, "speed": "fast",
                        "context_management": {"edits": []},
                        "thinking": {"type": "adaptive", "display": "summarized"},
                        "output_config": {"effort": "high",
                                          "task_budget": {"type": "tokens", "total": 9}}},
                ).status_code == 200
    sent = upstream.requests[0]
    assert sent["system"] == [{"type": "text", "text": "You are Claude Code.",
                               "cache_control": {"type": "ephemeral"}}]
    assert sent["thinking"] == {"type": "adaptive"}
    assert sent["output_config"] == {"effort": "high"}
    assert "speed" not in sent and "context_management" not in sent


# ---------------------------------------------------------------- thinking across providers


def foreign_turn(signature: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Add them.", "signature": signature},
                {"type": "text", "text": "5"}]},
            {"role": "user", "content": "and 4+4?"}]


OTHER_ORIGIN = SIGNER.sign("Add them.", [{"type": "anthropic_signature", "signature": "OTHER"}],
                           origin=Origin("another", "other-model", "k"))
# A real Anthropic signature's shape (opaque base64), from a direct Claude session.
ANTHROPIC_SIGNATURE = "EqQBCkYIBxgCKkDf0lPqz1XkSWxNVcHLhJV1dtR0oZ7cwN2OA=="


@pytest.mark.parametrize("signature", [OTHER_ORIGIN, ANTHROPIC_SIGNATURE])
def test_a_foreign_signature_is_never_replayed(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        signature: str) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    assert post(proxy, {"messages": foreign_turn(signature)}).status_code == 200
    sent = upstream.requests[0]["messages"][1]["content"]
    assert sent == [{"type": "text", "text": "5"}]
    assert "OTHER" not in json.dumps(upstream.requests) and signature not in json.dumps(
        upstream.requests)


def test_kimi_gets_foreign_thinking_with_an_empty_signature(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # "some Anthropic-compatible APIs accept unsigned thinking only when it is sent with an
    # empty signature ... Kimi/Moonshot" (anomalyco/opencode#44713).
    proxy = messages_proxy(proxy_factory, upstream, provider="kimi")
    assert post(proxy, {"messages": foreign_turn(OTHER_ORIGIN)}).status_code == 200
    assert upstream.requests[0]["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Add them.", "signature": ""},
        {"type": "text", "text": "5"}]


def test_a_signature_400_is_retried_once_without_the_foreign_thinking_and_remembered(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # Anthropic's wording (anthropics/claude-code#10627): a validator that checks what Kimi
    # would take unsigned.
    proxy = messages_proxy(proxy_factory, upstream, provider="kimi")
    upstream.queue(anthropic_error(
        400, "messages.1.content.0: Invalid `signature` in `thinking` block"))
    first = post(proxy, {"messages": foreign_turn(OTHER_ORIGIN)})
    assert first.status_code == 200, first.text
    assert post(proxy, {"messages": foreign_turn(OTHER_ORIGIN)}).status_code == 200
    thinking = [[block["type"] for block in body["messages"][1]["content"]]
                for body in upstream.requests]
    assert thinking == [["thinking", "text"], ["text"], ["text"]]


def test_minimax_gets_its_own_thinking_back_on_every_turn(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # MiniMax returns signed thinking and takes it back verbatim (NousResearch/hermes-agent
    # #85251); it thinks only when asked (adaptive), and not at all after the first turn
    # (hermes-agent#75725): that answer comes through as the text it is.
    proxy = messages_proxy(proxy_factory, upstream, provider="minimax")
    upstream.queue(message_stream([
        {"type": "thinking", "thinking": "Two plus three.", "signature": "MINIMAX-SIG"},
        {"type": "text", "text": "5"}], model="big-upstream"))
    first = stream(proxy, thinking={"type": "adaptive"})
    upstream.queue(message_stream([{"type": "text", "text": "8"}], model="big-upstream"))
    second = stream(proxy, thinking={"type": "adaptive"}, messages=[
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "4+4?"}])
    assert [block["type"] for block in first["content"]] == ["thinking", "text"]
    assert second["content"] == [{"type": "text", "text": "8"}]
    sent = upstream.requests[1]
    assert sent["thinking"] == {"type": "adaptive"}
    assert sent["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": "Two plus three.", "signature": "MINIMAX-SIG"}


def test_deepseek_gets_thinking_in_its_own_values(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # thinking.type enabled|disabled, on by default (api-docs.deepseek.com/guides/
    # thinking_mode.md; NousResearch/hermes-agent#15700).
    proxy = messages_proxy(proxy_factory, upstream, provider="deepseek")
    assert post(proxy, {"thinking": {"type": "adaptive"}, "max_tokens": 8000}).status_code == 200
    assert post(proxy, {}).status_code == 200
    assert [body["thinking"] for body in upstream.requests] == [
        {"type": "enabled", "budget_tokens": 4000}, {"type": "disabled"}]


# ---------------------------------------------------------------- usage


def test_vllm_usage_without_cache_fields_is_filled_in(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # vLLM's /v1/messages usage has no cache keys at all (vllm-project/vllm#45079).
    proxy = messages_proxy(proxy_factory, upstream, provider="vllm")
    upstream.queue(message_stream([{"type": "text", "text": "ok"}],
                                  usage={"input_tokens": 30, "output_tokens": 7}))
    events = raw_events(proxy, {"model": "claude-opus-4-7", "max_tokens": 64, "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]})
    assert events[-2]["usage"] == {"input_tokens": 30, "output_tokens": 7,
                                   "cache_creation_input_tokens": 0,
                                   "cache_read_input_tokens": 0}


def test_an_input_count_of_zero_at_message_start_is_taken_from_message_delta(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # SGLang (sgl-project/sglang#20678) and MiniMax report input_tokens 0 at message_start,
    # the real count in message_delta.
    proxy = messages_proxy(proxy_factory, upstream, provider="vllm")
    upstream.queue(message_stream(
        [{"type": "text", "text": "ok"}],
        start_usage={"input_tokens": 0, "output_tokens": 0},
        usage={"input_tokens": 123, "output_tokens": 45, "cache_read_input_tokens": 100}))
    message = stream(proxy)
    assert message["usage"]["input_tokens"] == 123
    assert message["usage"]["cache_read_input_tokens"] == 100
    assert message["usage"]["output_tokens"] == 45


# ---------------------------------------------------------------- failover across APIs


@pytest.fixture
def two_apis(tmp_path: Path, upstream: ScriptedUpstream) -> Iterator[ProxyServer]:
    """A proxy whose default route is a Messages upstream (the kimi profile) with a Chat
    Completions one (deepseek) as its fallback, both played by the scripted upstream."""
    path = tmp_path / "proxy.toml"
    path.write_text(
        f'[providers.anth]\napi = "messages"\nprovider = "kimi"\n'
        f'openai_base_url = "{upstream.root_url}"\nopenai_api_key = "{UPSTREAM_KEY}"\n'
        'big_model = "kimi-k2.5"\nmiddle_model = "kimi-k2.5"\nsmall_model = "kimi-k2.5"\n'
        'max_retries = 0\n'
        f'[providers.chat]\nprovider = "deepseek"\nopenai_base_url = "{upstream.base_url}"\n'
        f'openai_api_key = "{UPSTREAM_KEY}"\nbig_model = "deepseek-v4-pro"\n'
        'middle_model = "deepseek-v4-pro"\nsmall_model = "deepseek-v4-pro"\nmax_retries = 0\n'
        '[router]\ndefault = ["anth,kimi-k2.5", "chat,deepseek-v4-pro"]\n')
    settings = Settings(log_file=str(tmp_path / "proxy.log"), thinking_signature_secret=SECRET)
    app = create_app(settings, config=load_config_file(path, settings))
    sock = bind_loopback()
    server, thread = serve_in_thread(RecordingApp(app), sock, http=http_protocol())
    proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                        thread)
    assert eventually(lambda: serving(proxy.url))
    yield proxy
    stop_server(server, thread)


def test_failover_from_messages_to_chat_completions_and_back_in_one_conversation(
        two_apis: ProxyServer, upstream: ScriptedUpstream) -> None:
    proxy = two_apis
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "2+3, then 4+4?"}]
    upstream.queue(message_stream([
        {"type": "thinking", "thinking": "Add 2 and 3.", "signature": "KIMI-SIG"},
        {"type": "tool_use", "id": "toolu_k1", "name": "calculator", "input": {"a": 2, "b": 3}}],
        stop_reason="tool_use", model="kimi-k2.5"))
    first = stream(proxy, messages=conversation, tools=[CALCULATOR],
                   thinking={"type": "adaptive"})
    conversation += [{"role": "assistant", "content": first["content"]},
                     {"role": "user", "content": [{"type": "tool_result",
                                                   "tool_use_id": "toolu_k1", "content": "5"}]}]
    # Turn 2: the Messages upstream is overloaded; the Chat Completions one answers.
    upstream.queue(anthropic_error(529, "Overloaded", "overloaded_error"),
                   Reply(events=[chunk({"reasoning_content": "Now 4 and 4."}),
                                 chunk({"content": "5, and 4+4 is 8."}), chunk({}, "stop")]))
    second = stream(proxy, messages=conversation, tools=[CALCULATOR],
                    thinking={"type": "adaptive"})
    assert [block["type"] for block in second["content"]] == ["thinking", "text"]
    assert upstream.paths[1:] == ["/v1/messages", "/v1/chat/completions"]
    chat = upstream.requests[2]
    assert chat["model"] == "deepseek-v4-pro"
    assistant, tool = chat["messages"][1], chat["messages"][2]
    assert assistant["tool_calls"] == [{"id": "toolu_k1", "type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"a": 2, "b": 3}, separators=(",", ":"))}}]
    assert assistant["reasoning_content"] == "Add 2 and 3."  # passed back, as for any thinking
    assert tool == {"role": "tool", "tool_call_id": "toolu_k1", "content": "5"}
    assert "KIMI-SIG" not in json.dumps(chat)  # the Messages signature stays with its origin
    # Turn 3: back on the Messages upstream, which gets its own signature back and the Chat
    # upstream's thinking as Kimi takes unsigned thinking.
    conversation += [{"role": "assistant", "content": second["content"]},
                     {"role": "user", "content": "thanks"}]
    upstream.queue(message_stream([{"type": "text", "text": "You're welcome."}]))
    third = stream(proxy, messages=conversation, tools=[CALCULATOR],
                   thinking={"type": "adaptive"})
    assert third["content"] == [{"type": "text", "text": "You're welcome."}]
    back = upstream.requests[3]["messages"]
    assert back[1]["content"][0] == {"type": "thinking", "thinking": "Add 2 and 3.",
                                     "signature": "KIMI-SIG"}
    assert back[3]["content"][0] == {"type": "thinking", "thinking": "Now 4 and 4.",
                                     "signature": ""}


# ---------------------------------------------------------------- as a direct connection


def test_the_sdks_stream_through_the_proxy_equals_a_direct_connection(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """Where the proxy changes nothing (the generic profile, no foreign thinking), the anthropic
    SDK's message is the one it gets from the endpoint itself, but for what the proxy owns:
    the message id, the client's model name, its signed envelope as the signature."""
    proxy = messages_proxy(proxy_factory, upstream)
    blocks = [{"type": "thinking", "thinking": "Multiply, then add.", "signature": "UP-SIG"},
              {"type": "text", "text": "Let me compute that: "},
              {"type": "tool_use", "id": "toolu_same", "name": "calculator",
               "input": {"a": 6, "b": 7}}]
    request: dict[str, Any] = {
        "model": "claude-opus-4-7", "max_tokens": 2048, "tools": [CALCULATOR],
        "thinking": {"type": "adaptive"}, "messages": [{"role": "user", "content": "6*7+1?"}]}
    answers = []
    for base_url in (upstream.root_url, proxy.url):
        upstream.queue(message_stream(blocks, model="claude-opus-4-7", stop_reason="tool_use",
                                      pieces=3))
        client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
        with client.messages.stream(**request) as answer:
            answers.append(answer.get_final_message().model_dump(exclude_none=True))
    direct, proxied = answers
    assert SIGNER.verify("Multiply, then add.", proxied["content"][0]["signature"]) is not None
    for message in answers:
        del message["id"]
        message["content"][0]["signature"] = "-"
    assert proxied == direct
    assert upstream.requests[0] == {**upstream.requests[1], "model": "claude-opus-4-7",
                                    "stream": True}


# ---------------------------------------------------------------- real Claude Code


def messages_bash_loop(body: dict[str, Any]) -> Reply:
    """Claude Code's tool loop in Messages form: thinking and a Bash call, then, once the
    tool result is back (with the thinking and its own signature), an answer quoting it."""
    last = body["messages"][-1]
    results = [block for block in last["content"] if isinstance(block, dict)
               and block.get("type") == "tool_result"] if isinstance(last["content"], list) else []
    if not results:
        return message_stream([
            {"type": "thinking", "thinking": "I need to run echo first.", "signature": "CC-SIG"},
            {"type": "tool_use", "id": "toolu_cc_1", "name": "Bash",
             "input": {"command": "echo hi-from-tool", "description": "Print a greeting"}}],
            stop_reason="tool_use", model=body["model"])
    replayed = body["messages"][-2]["content"][0]
    if replayed != {"type": "thinking", "thinking": "I need to run echo first.",
                    "signature": "CC-SIG"}:
        return anthropic_error(400, "messages.1.content.0: Invalid `signature` in `thinking` "
                               "block")
    output = results[0]["content"]
    text = output if isinstance(output, str) else output[0]["text"]
    return message_stream([{"type": "text", "text": "The command printed: "
                            + text.splitlines()[0]}], model=body["model"])


@pytest.mark.claude_code
def test_claude_code_runs_its_tool_loop_on_a_messages_upstream(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    from tests.test_claude_code import CLAUDE_BIN, blocks, run_claude
    if not CLAUDE_BIN.exists():
        pytest.skip("Claude Code not installed (make test installs it)")
    proxy = messages_proxy(proxy_factory, upstream, provider="kimi")
    upstream.responder = messages_bash_loop
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    assert [t["thinking"] for t in blocks(lines, "thinking")] == ["I need to run echo first."]
    assert [(t["id"], t["name"]) for t in blocks(lines, "tool_use")] == [("toolu_cc_1", "Bash")]
    assert lines[-1]["result"] == "The command printed: hi-from-tool"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2
    assert all(path == "/v1/messages" for path in upstream.paths)
    first = upstream.requests[0]
    assert first["model"] == "middle-upstream"
    assert "x-anthropic-billing-header" not in json.dumps(first["system"])
    betas = {value for headers in upstream.headers
             for value in headers.get("anthropic-beta", "").split(",") if value}
    assert betas <= {"interleaved-thinking-2025-05-14", "fine-grained-tool-streaming-2025-05-14"}


# ---------------------------------------------------------------- web search


def test_web_search_on_a_messages_upstream_uses_the_backend(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    """GLM's chat API has a native search switch; its Messages API gets the emulated search
    (the backend's results, then the upstream's summary), never the chat switch."""
    from tests.test_web_search import QUERY, SUMMARY, side_query
    proxy = messages_proxy(proxy_factory, upstream, provider="glm", web_search="native",
                           web_search_backend="searxng", web_search_url=search_backend.url,
                           max_retries=0)
    upstream.queue(message_reply([{"type": "text", "text": SUMMARY}]))
    response = httpx.post(f"{proxy.url}/v1/messages", json={**side_query(), "stream": False},
                          timeout=30)
    assert response.status_code == 200, response.text
    content = response.json()["content"]
    assert [block["type"] for block in content] == [
        "server_tool_use", "web_search_tool_result", "text"]
    assert content[2]["text"] == SUMMARY
    assert [seen.query for seen in search_backend.requests] == [QUERY]
    assert upstream.paths == ["/v1/messages"]
    sent = json.dumps(upstream.requests[0])
    assert "web_search_2" not in sent and '"search_result"' not in sent


def test_deepseeks_refusal_of_a_forced_tool_choice_while_thinking_is_learned(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # 400 "Thinking mode does not support this tool_choice" (maximhq/bifrost#5177).
    proxy = messages_proxy(proxy_factory, upstream, provider="deepseek")
    upstream.queue(anthropic_error(400, "Thinking mode does not support this tool_choice"))
    forced = {"tools": [CALCULATOR], "tool_choice": {"type": "tool", "name": "calculator"},
              "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert post(proxy, forced).status_code == 200
    assert ["tool_choice" in body for body in upstream.requests] == [True, False]
    assert all(body["tools"] == [CALCULATOR] for body in upstream.requests)


def test_claude_codes_user_id_is_hashed(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="minimax")
    user_id = "user_abc_account_123_session_456"
    assert post(proxy, {"metadata": {"user_id": user_id}}).status_code == 200
    sent = upstream.requests[0]["metadata"]["user_id"]
    assert sent.startswith("user-") and user_id not in json.dumps(upstream.requests)


def test_stop_sequences_go_upstream_and_its_stop_comes_back(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="vllm")
    upstream.queue(message_stream([{"type": "text", "text": "one two "}],
                                  stop_reason="stop_sequence", stop_sequence="THREE"))
    message = stream(proxy, stop_sequences=["THREE"])
    assert upstream.requests[0]["stop_sequences"] == ["THREE"]
    assert message["content"] == [{"type": "text", "text": "one two "}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "THREE")


def test_redacted_thinking_goes_back_to_its_endpoint_whole(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream)
    upstream.queue(Reply(events=[
        {"type": "message_start", "message": {
            "id": "m", "type": "message", "role": "assistant", "model": "big-upstream",
            "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {
            "type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "Visible part."}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "SIG-A"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {
            "type": "redacted_thinking", "data": "ENCRYPTED-B"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text",
                                                                      "text": "Done."}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 9}},
        {"type": "message_stop"}], named=True, done=False))
    first = stream(proxy, thinking={"type": "adaptive"})
    assert [block["type"] for block in first["content"]] == ["thinking", "text"]
    assert "ENCRYPTED-B" not in json.dumps(first)  # inside the signed envelope only
    stream(proxy, thinking={"type": "adaptive"}, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "more"}])
    assert upstream.requests[1]["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Visible part.", "signature": "SIG-A"},
        {"type": "redacted_thinking", "data": "ENCRYPTED-B"},
        {"type": "text", "text": "Done."}]


def test_prompt_cache_off_sends_no_breakpoints(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="vllm", prompt_cache="off")
    marked = {"type": "text", "text": "long prefix", "cache_control": {"type": "ephemeral"}}
    assert post(proxy, {"system": [marked], "messages": [
        {"role": "user", "content": [marked]}]}).status_code == 200
    assert "cache_control" not in json.dumps(upstream.requests[0])


def test_the_typescript_sdks_stream_through_the_proxy_equals_a_direct_connection(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    from tests.test_js_clients import CLIENTS, NODE, run_client
    if NODE is None or not (CLIENTS.parent / "node_modules" / "@anthropic-ai").is_dir():
        pytest.skip("JS clients not installed (make test installs them into .cache/js)")
    proxy = messages_proxy(proxy_factory, upstream)
    blocks = [{"type": "text", "text": "Looking it up."},
              {"type": "tool_use", "id": "toolu_ts", "name": "get_weather",
               "input": {"city": "Paris"}}]
    answers = []
    for url in (upstream.root_url, proxy.url):
        upstream.queue(message_stream(blocks, model="claude-sonnet-4-6", stop_reason="tool_use",
                                      pieces=3))
        answers.append(run_client(url, "ts-stream"))
    direct, proxied = answers
    for answer in answers:
        del answer["message"]["id"]
    assert proxied["message"] == direct["message"]
    kinds = [kind for kind in direct["events"] if kind != "ping"]
    tool = len(kinds) - 1 - kinds[::-1].index("content_block_start")
    deltas = kinds[tool + 1:].count("content_block_delta")
    assert deltas == 3
    # The tool-call guard sends the call's arguments whole, in one input_json_delta.
    del kinds[tool + 2:tool + 1 + deltas]
    assert proxied["events"] == kinds


def test_max_tokens_is_clamped_to_the_providers_limit_when_one_is_set(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="deepseek",
                           provider_max_output_tokens=8192)
    assert post(proxy, {"max_tokens": 64000,
                        "thinking": {"type": "enabled", "budget_tokens": 32000}}
                ).status_code == 200
    sent = upstream.requests[0]
    assert (sent["max_tokens"], sent["thinking"]) == (
        8192, {"type": "enabled", "budget_tokens": 4096})


def test_an_unsigned_thinking_block_goes_back_to_its_endpoint_unsigned(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # DeepSeek's streamed thinking blocks may come without a signature (QuantumNous/new-api
    # #4762); its thinking must come back on a tool-use turn or it answers 400 "The
    # `content[].thinking` in the thinking mode must be passed back to the API."
    # (OEvortex/aether#31). The glm profile would drop a foreign block: this one is its own.
    proxy = messages_proxy(proxy_factory, upstream, provider="glm")
    upstream.queue(message_stream([
        {"type": "thinking", "thinking": "Call the tool.", "signature": None},
        {"type": "tool_use", "id": "toolu_u", "name": "calculator", "input": {"a": 1, "b": 1}}],
        stop_reason="tool_use"))
    first = stream(proxy, thinking={"type": "adaptive"}, tools=[CALCULATOR])
    upstream.queue(message_stream([{"type": "text", "text": "2"}]))
    stream(proxy, thinking={"type": "adaptive"}, tools=[CALCULATOR], messages=[
        {"role": "user", "content": "1+1"}, {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_u",
                                      "content": "2"}]}])
    assert upstream.requests[1]["messages"][1]["content"][0] == {
        "type": "thinking", "thinking": "Call the tool.", "signature": ""}


def failing_over_loop(body: dict[str, Any]) -> Reply:
    """Claude Code's tool loop across two APIs: the Messages upstream asks for Bash, then is
    overloaded; the Chat Completions upstream answers from the tool's output."""
    if any(message["role"] == "tool" for message in body["messages"]):
        output = next(m["content"] for m in body["messages"] if m["role"] == "tool")
        return Reply(events=[chunk({"role": "assistant", "content": "It printed: "}),
                             chunk({"content": output.splitlines()[0]}), chunk({}, "stop")])
    last = body["messages"][-1]
    if isinstance(last["content"], list) and any(
            block.get("type") == "tool_result" for block in last["content"]):
        return anthropic_error(529, "Overloaded", "overloaded_error")
    return messages_bash_loop(body)


@pytest.mark.claude_code
def test_claude_code_fails_over_from_a_messages_upstream_to_chat_completions(
        tmp_path: Path, two_apis: ProxyServer, upstream: ScriptedUpstream) -> None:
    from tests.test_claude_code import CLAUDE_BIN, blocks, run_claude
    if not CLAUDE_BIN.exists():
        pytest.skip("Claude Code not installed (make test installs it)")
    upstream.responder = failing_over_loop
    lines = run_claude(tmp_path, two_apis, "run the echo", "--allowedTools", "Bash(echo:*)")
    assert [t["thinking"] for t in blocks(lines, "thinking")] == ["I need to run echo first."]
    assert lines[-1]["result"] == "It printed: hi-from-tool"
    assert lines[-1]["is_error"] is False
    assert upstream.paths == ["/v1/messages", "/v1/messages", "/v1/chat/completions"]
    chat = upstream.requests[2]
    assert chat["messages"][-2]["tool_calls"][0]["id"] == "toolu_cc_1"
    assert chat["messages"][-2]["reasoning_content"] == "I need to run echo first."
    assert "CC-SIG" not in json.dumps(chat)


def test_the_advisor_tool_and_its_beta_stay_with_anthropic(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # Claude Code's `advisor-tool-2026-03-01` beta is refused by other endpoints with a 400
    # (anthropics/claude-code#70563); the tool is `advisor_20260301` and its result block
    # `advisor_tool_result` (platform.claude.com/docs/en/agents-and-tools/tool-use/advisor-tool).
    proxy = messages_proxy(proxy_factory, upstream, provider="minimax")
    advisor = {"type": "advisor_20260301", "name": "advisor", "model": "claude-opus-4-7"}
    history = [
        {"role": "user", "content": "plan the refactor"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor", "input": {}},
            {"type": "advisor_tool_result", "tool_use_id": "srvtoolu_1",
             "content": {"type": "advisor_result", "text": "Split the module first."}},
            {"type": "text", "text": "I will split the module first."}]},
        {"role": "user", "content": "go on"}]
    assert post(proxy, {"tools": [CALCULATOR, advisor], "messages": history},
                **{"anthropic-beta": "advisor-tool-2026-03-01"}).status_code == 200
    sent = upstream.requests[0]
    assert sent["tools"] == [CALCULATOR]
    assert sent["messages"][1]["content"] == [
        {"type": "text", "text": "Split the module first."},
        {"type": "text", "text": "I will split the module first."}]
    assert "anthropic-beta" not in upstream.headers[0]


# ---------------------------------------------------------------- count_tokens


def count(proxy: ProxyServer) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/messages/count_tokens", timeout=30, json={
        "model": "claude-opus-4-7", "messages": [{"role": "user", "content": "count me"}],
        "tools": [CALCULATOR]})


def test_count_tokens_asks_an_endpoint_that_counts(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    # vLLM's answer (vllm-project/vllm#35588).
    proxy = messages_proxy(proxy_factory, upstream, provider="vllm")
    upstream.queue(Reply(body={"input_tokens": 11,
                               "context_management": {"original_input_tokens": 11}}))
    response = count(proxy)
    assert response.json() == {"input_tokens": 11}
    assert upstream.paths == ["/v1/messages/count_tokens"]
    sent = upstream.requests[0]
    assert sent["model"] == "big-upstream" and sent["tools"] == [CALCULATOR]
    assert "max_tokens" not in sent and "stream" not in sent


def test_count_tokens_falls_back_to_the_estimate_and_remembers_a_missing_endpoint(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="llamacpp", max_retries=0)
    upstream.queue(anthropic_error(404, "Not Found", "not_found_error"))
    first, second = count(proxy), count(proxy)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() and first.json()["input_tokens"] > 0
    assert upstream.paths == ["/v1/messages/count_tokens"]  # asked once


def test_count_tokens_of_an_endpoint_without_a_documented_count_is_the_proxys(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = messages_proxy(proxy_factory, upstream, provider="glm")
    assert count(proxy).json()["input_tokens"] > 0
    assert upstream.paths == []
