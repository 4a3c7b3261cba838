"""Claude Code's Auto-mode classifier (`safeguards` → `safeguard_results`), through the real
proxy against scripted upstreams: the default `unsupported`, a scripted judge route's verdicts,
a judge that fails or times out, streamed (on `message_delta.delta`) and not, and the 400 for a
malformed field. Never a verdict nobody made."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from claude_proxy.conversion import safeguards
from tests.conftest import ProxyServer
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
)
from tests.sse_grammar import accumulate, check_grammar, parse_sse

JUDGE = "judge-model"
SAFEGUARDS = [{"type": "dangerous_tool_use",
               "classifier_context": "Never delete anything outside the project."}]
ASK: dict[str, Any] = {
    "model": "claude-sonnet-4-6", "max_tokens": 512, "safeguards": SAFEGUARDS,
    "messages": [{"role": "user", "content": "clean up the build"}],
    "tools": [{"name": "Bash", "description": "Run a command",
               "input_schema": {"type": "object",
                                "properties": {"command": {"type": "string"}}}}]}
HEADERS = {"anthropic-beta": "claude-code-20250219,dangerous-tool-use-2026-09-03"}
CALLS = [("call_1", "rm -rf build"), ("call_2", "rm -rf ~")]
UNSUPPORTED = [{"type": "dangerous_tool_use", "status": {"type": "unsupported"}}]


def two_bash_calls(stream: bool) -> Reply:
    """The main answer: two Bash calls."""
    if not stream:
        return completion({"content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "Bash", "arguments": json.dumps({"command": command})}}
            for call_id, command in CALLS]}, finish="tool_calls")
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "content": None})]
    for index, (call_id, command) in enumerate(CALLS):
        events.append(chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                             "function": {"name": "Bash", "arguments": ""}}]}))
        events.append(chunk({"tool_calls": [{"index": index, "function": {
            "arguments": json.dumps({"command": command})}}]}))
    events.append(chunk({}, "tool_calls"))
    return Reply(events=events)


def judge_by_command(body: dict[str, Any]) -> Reply | None:
    """The judge route: flags the call on the home directory, passes the other."""
    if body["model"] != JUDGE:
        return None
    prompt = body["messages"][-1]["content"]
    if "rm -rf ~" in prompt:
        return completion({"content": '{"outcome": "flagged", "explanation": "deletes the '
                                      'home directory"}'})
    return completion({"content": 'Verdict: {"outcome": "not_flagged", "explanation": '
                                  '"removes the build output"}'})


def post(proxy: ProxyServer, stream: bool, **fields: Any) -> dict[str, Any]:
    """The message the client gets (streamed: accumulated, after the grammar check)."""
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "stream": stream, **fields},
                          headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    if not stream:
        message: dict[str, Any] = response.json()
        return message
    events = parse_sse(response.content)
    check_grammar(events)
    end = next(event.data for event in events if event.name == "message_delta")
    assert "safeguard_results" not in end  # inside `delta`, where Claude Code reads it
    return accumulate(events)


def tool_ids(message: dict[str, Any]) -> list[str]:
    return [block["id"] for block in message["content"] if block["type"] == "tool_use"]


@pytest.fixture(scope="module")
def judged(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    return proxy_factory(safeguards_route=f"openai,{JUDGE}")


@pytest.mark.parametrize("stream", [False, True])
def test_default_answer_is_unsupported(stream: bool, proxy: ProxyServer,
                                       upstream: ScriptedUpstream) -> None:
    upstream.queue(two_bash_calls(stream))
    message = post(proxy, stream)
    assert message["safeguard_results"] == UNSUPPORTED
    assert message["stop_reason"] == "tool_use"
    assert len(upstream.requests) == 1  # nobody was asked to judge
    assert "safeguards" not in upstream.requests[0]


def test_no_safeguards_no_results(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(two_bash_calls(False))
    body = {key: value for key, value in ASK.items() if key != "safeguards"}
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)
    assert "safeguard_results" not in response.json()


@pytest.mark.parametrize("stream", [False, True])
def test_judged_answer(stream: bool, judged: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(two_bash_calls(stream))
    upstream.responder = judge_by_command
    message = post(judged, stream)
    first, second = tool_ids(message)
    assert message["safeguard_results"] == [{"type": "dangerous_tool_use", "status": {
        "type": "available", "tool_uses": {
            first: {"type": "evaluated", "outcome": "not_flagged",
                    "explanation": "removes the build output"},
            second: {"type": "evaluated", "outcome": "flagged",
                     "explanation": "deletes the home directory"}}}}]
    asked = [body for body in upstream.requests if body["model"] == JUDGE]
    assert len(asked) == 2 and not any(body.get("stream") for body in asked)
    prompt = asked[0]["messages"][-1]["content"]
    assert "<rules>\nNever delete anything outside the project.\n</rules>" in prompt
    assert "<task>\nclean up the build\n</task>" in prompt
    assert asked[0]["messages"][0] == {"role": "system", "content": safeguards.JUDGE_SYSTEM}


def test_a_reply_without_tool_calls_asks_no_judge(judged: ProxyServer,
                                                  upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "Nothing to run."}))
    upstream.responder = judge_by_command
    message = post(judged, False)
    assert message["safeguard_results"] == [{"type": "dangerous_tool_use", "status": {
        "type": "available", "tool_uses": {}}}]
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_judge_failure_is_unavailable(stream: bool, judged: ProxyServer,
                                      upstream: ScriptedUpstream) -> None:
    upstream.queue(two_bash_calls(stream))
    upstream.responder = lambda body: (error_reply(400, "model judge-model does not exist")
                                       if body["model"] == JUDGE else None)
    message = post(judged, stream)
    assert message["safeguard_results"] == [{"type": "dangerous_tool_use", "status": {
        "type": "available", "tool_uses": {
            call_id: {"type": "unavailable", "reason": "error"}
            for call_id in tool_ids(message)}}}]


def test_unreadable_judge_answer_is_unavailable(judged: ProxyServer,
                                                upstream: ScriptedUpstream) -> None:
    upstream.queue(two_bash_calls(False))
    upstream.responder = lambda body: (completion({"content": "It looks fine to me."})
                                       if body["model"] == JUDGE else None)
    message = post(judged, False)
    statuses = message["safeguard_results"][0]["status"]["tool_uses"]
    assert list(statuses.values()) == [{"type": "unavailable", "reason": "input_unparsed"}] * 2


def test_judge_timeout_is_unavailable(proxy_factory: Callable[..., ProxyServer],
                                      upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(safeguards_route=f"openai,{JUDGE}", safeguards_timeout=0.5)
    upstream.queue(two_bash_calls(True))
    upstream.responder = lambda body: (Reply(body={}, stall_at=0)
                                       if body["model"] == JUDGE else None)
    message = post(proxy, True)
    statuses = message["safeguard_results"][0]["status"]["tool_uses"]
    assert list(statuses.values()) == [{"type": "unavailable", "reason": "timeout"}] * 2


@pytest.mark.parametrize(("value", "message"), [
    ("yes", "safeguards: Input should be a valid list"),
    ([{"classifier_context": "x"}],
     "safeguards.0: each safeguard is an object with a string `type`"),
])
def test_malformed_safeguards_get_a_400(value: Any, message: str, proxy: ProxyServer,
                                        upstream: ScriptedUpstream) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "safeguards": value},
                          timeout=30)
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": message}}
    assert upstream.requests == []


@pytest.mark.parametrize("route", ["judge-model", "nobody,judge-model", "openai,"])
def test_a_judge_route_naming_no_provider_stops_the_start(route: str) -> None:
    from claude_proxy.config.file import ConfigurationError, single_provider_config
    from claude_proxy.config.settings import Settings
    with pytest.raises(ConfigurationError) as raised:
        single_provider_config(Settings(provider="openai", safeguards_route=route))
    assert str(raised.value) == (f"SAFEGUARDS_ROUTE: {route!r} is not \"PROVIDER,MODEL\" with "
                                 f"a configured provider (openai)")


def test_the_config_files_judge_route_wins(tmp_path: Any) -> None:
    from claude_proxy.config.file import judge_route, load_config_file
    from claude_proxy.config.settings import Settings
    path = tmp_path / "proxy.toml"
    path.write_text('[providers.a]\nopenai_base_url = "http://127.0.0.1:9/v1"\n'
                    'openai_api_key = "k"\n[router]\ndefault = "a,m"\n'
                    'safeguards = ["a,judge-1", "a,judge-2"]\n')
    config = load_config_file(path, Settings(safeguards_route="a,ignored"))
    assert judge_route(config) == ["a,judge-1", "a,judge-2"]
