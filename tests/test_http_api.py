"""The HTTP surface: endpoints, client auth, validation, limits, count_tokens, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import CLIENT_KEY, ProxyServer, clean_env, free_port, load_fixture
from tests.scripted_upstream import ScriptedUpstream, text_stream

MINIMAL = {"model": "claude-sonnet-4-6", "max_tokens": 64,
           "messages": [{"role": "user", "content": "hi"}]}


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def test_root_head_and_health(proxy: ProxyServer) -> None:
    assert httpx.head(f"{proxy.url}/").status_code == 200
    assert httpx.get(f"{proxy.url}/").json()["status"] == "ok"
    health = httpx.get(f"{proxy.url}/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_unknown_path_and_method_are_anthropic_errors(proxy: ProxyServer) -> None:
    assert_anthropic_error(httpx.get(f"{proxy.url}/v1/nothing"), 404, "not_found_error")
    assert_anthropic_error(httpx.get(f"{proxy.url}/v1/messages"), 405,
                           "invalid_request_error")


@pytest.mark.parametrize(("body", "fragment"), [
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m", "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]},
     "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
     "messages.0.role"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]},
     "messages.0.content"),
    ([1, 2, 3], "JSON object"),
])
def test_invalid_requests_are_400(proxy: ProxyServer, body: Any, fragment: str) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json=body)
    assert fragment in assert_anthropic_error(response, 400, "invalid_request_error")


def test_malformed_and_empty_json(proxy: ProxyServer) -> None:
    for content in (b"{not json", b"", b"\xff\xfe"):
        response = httpx.post(f"{proxy.url}/v1/messages", content=content,
                              headers={"content-type": "application/json"})
        assert_anthropic_error(response, 400, "invalid_request_error")


def test_json_nested_deeper_than_the_upstream_request_can_carry_is_400(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """orjson reads 1,024 levels and writes 255: a tool input or schema nested 300 deep
    parses, then cannot be written upstream. The client hears why, not "internal error"
    (and a session's long body, parsed incrementally, says the same)."""
    deep: Any = {"a": 1}
    for _ in range(300):
        deep = {"k": deep}
    call = [{"role": "user", "content": "x" * 40_000},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                               "input": deep}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "r"}]}]
    schema = {**MINIMAL, "tools": [{"name": "f", "input_schema": deep}]}
    for body, session in (({**MINIMAL, "messages": call}, None), (schema, None),
                          ({**MINIMAL, "messages": call}, "deep-session"),
                          ({**MINIMAL, "messages": call}, "deep-session")):
        headers = {"content-type": "application/json"}
        if session:
            headers["x-claude-code-session-id"] = session
        response = httpx.post(f"{proxy.url}/v1/messages", headers=headers,
                              content=json.dumps(body).encode())
        assert assert_anthropic_error(response, 400, "invalid_request_error") == (
            "request body is nested too deeply")
    assert upstream.requests == []


def test_body_over_the_limit_is_413(proxy_factory: Callable[..., ProxyServer]) -> None:
    proxy = proxy_factory(max_request_bytes=4096)
    big = {**MINIMAL, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_anthropic_error(httpx.post(f"{proxy.url}/v1/messages", json=big), 413,
                           "request_too_large")

    def chunked() -> Any:  # no content-length: the limit is enforced while reading
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}], "max_tokens": 5}'

    response = httpx.post(f"{proxy.url}/v1/messages", content=chunked())
    assert_anthropic_error(response, 413, "request_too_large")


def test_client_key_required_when_configured(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(anthropic_api_key=CLIENT_KEY)
    url = f"{proxy.url}/v1/messages"
    assert_anthropic_error(httpx.post(url, json=MINIMAL), 401, "authentication_error")
    assert_anthropic_error(httpx.post(url, json=MINIMAL, headers={"x-api-key": "wrong"}), 401,
                           "authentication_error")
    assert_anthropic_error(httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=MINIMAL),
                           401, "authentication_error")
    assert len(upstream.requests) == 0
    ok_key = httpx.post(url, json=MINIMAL, headers={"x-api-key": CLIENT_KEY})
    ok_bearer = httpx.post(url, json=MINIMAL, headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert ok_key.status_code == 200 and ok_bearer.status_code == 200
    assert ok_key.json()["content"] == [{"type": "text", "text": "scripted default"}]
    # /health stays open and says nothing about the configuration.
    assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="bad", max_retries=0).messages.create(
            **MINIMAL)


def test_count_tokens_counts_system_messages_and_tools(proxy: ProxyServer) -> None:
    def count(body: dict[str, Any]) -> int:
        response = httpx.post(f"{proxy.url}/v1/messages/count_tokens?beta=true", json=body)
        assert response.status_code == 200
        result = response.json()
        assert set(result) == {"input_tokens"} and isinstance(result["input_tokens"], int)
        return int(result["input_tokens"])

    base = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "x" * 400}]}
    plain = count(base)
    # About four bytes of the conversation's JSON a token (routing/tokens.plain_estimate):
    # the 400 characters and the message's 30 bytes of keys and quotes.
    assert plain == 108
    with_system = count({**base, "system": "s" * 400})
    tools = [{"name": "Read", "description": "d" * 400, "input_schema": {"type": "object"}}]
    with_tools = count({**base, "tools": tools})
    assert with_system == 208 and with_tools > plain + 100
    fixture = load_fixture("claude-code-2.1.328-first-request.json")["body"]
    assert count(fixture) > 8000  # ~49 KB of prompt and tools
    sdk_count = anthropic.Anthropic(base_url=proxy.url, api_key="x").messages.count_tokens(
        **base)
    assert sdk_count.input_tokens == 108


def test_claude_code_request_fixture_through_the_proxy(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    fixture = load_fixture("claude-code-2.1.328-first-request.json")
    upstream.queue(text_stream(["pong"]))
    headers = {k: v for k, v in fixture["headers"].items()
               if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
    response = httpx.post(f"{proxy.url}{fixture['path']}", json=fixture["body"],
                          headers=headers)
    assert response.status_code == 200
    assert "event: content_block_delta" in response.text and '"text":"pong"' in response.text
    assert [m["role"] for m in upstream.requests[0]["messages"]] == ["system", "user", "system"]


# ---------------------------------------------------------------- the command line


def run_cli(*args: str, env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess[
        str]:
    return subprocess.run([sys.executable, "-m", "claude_proxy", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    result = run_cli(env=clean_env(tmp_path))
    assert result.returncode == 2
    assert "OPENAI_API_KEY is not set" in result.stderr


def test_cli_names_the_bad_variable(tmp_path: Path) -> None:
    env_file = tmp_path / ".env.bad"
    env_file.write_text("OPENAI_API_KEY=k\nPORT=not-a-port\n")
    result = run_cli("--env-file", str(env_file), env=clean_env(tmp_path))
    assert result.returncode == 2 and "PORT" in result.stderr
    missing = run_cli("--env-file", str(tmp_path / "nope"), env=clean_env(tmp_path))
    assert missing.returncode == 2 and "env file not found" in missing.stderr


def test_cli_serves_with_an_env_file(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    port = free_port()
    env_file = tmp_path / ".env.test"
    env_file.write_text(f"OPENAI_API_KEY=sk-cli-test\nOPENAI_BASE_URL={upstream.base_url}\n"
                        "BIG_MODEL=cli-big\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "claude_proxy", "--env-file", str(env_file),
         "--host", "127.0.0.1", "--port", str(port)],
        env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # wait for uvicorn to say it is up
            if "Uvicorn running on" in line:
                break
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/messages",
                           json={**MINIMAL, "model": "claude-opus-4-1"}, timeout=20)
        assert reply.status_code == 200
        assert upstream.requests[-1]["model"] == "cli-big"
    finally:
        process.terminate()
        process.wait(timeout=10)
