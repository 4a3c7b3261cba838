"""A Messages API upstream (`api = "messages"`) through a real proxy: the anthropic SDK (or
httpx and the SSE grammar) in front, the scripted upstream speaking Anthropic's wire format
behind. Each endpoint quirk has its test, its source in a comment (the research notes:
/tmp/research/messages-upstreams.md, read 2026-11-28).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.config.settings import load_settings
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.upstream.api import MESSAGES, api_for
from tests.conftest import UPSTREAM_KEY, ProxyServer, clean_env
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    anthropic_error,
    message_reply,
    message_stream,
)
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
