"""Real Claude Code (the pin, and the newest release when another is installed) in front of
local model servers as they behave: llama-server without Jinja (its recorded answer, replayed
exactly), and a chat template that demands strict user/assistant alternation (Gemma's)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_pin import claude_binaries
from tests.conftest import ProxyServer, SuiteRecord
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, http_recording, text_stream
from tests.test_claude_code import TOOL_OUTPUT, blocks, run_claude
from tests.test_local_servers import alternates, strict_template

BINARIES = claude_binaries()

pytestmark = pytest.mark.claude_code


@pytest.fixture(params=list(BINARIES))
def claude_bin(request: pytest.FixtureRequest) -> Path:
    binary = BINARIES[request.param]
    if not os.access(binary, os.X_OK):
        pytest.skip(f"Claude Code ({request.param}) not installed at {binary}")
    return binary


def test_llamacpp_without_jinja_is_answered_once_and_not_retried(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream,
        claude_bin: Path) -> None:
    """Claude Code's own retries are on (10 by default) and none happens: each of its
    requests is its first try (`x-stainless-retry-count: 0`) and is one upstream request.
    (On a 400 Claude Code does send the request again with fewer beta features, each a new
    request; against the 500 it retried the same request 11 times over 192 s.)"""
    upstream.responder = lambda body: http_recording("nojinja-tools")
    before = len(SuiteRecord.requests)
    lines = run_claude(tmp_path, proxy, "say pong", binary=claude_bin, retries=True)
    result = lines[-1]
    assert result["is_error"] is True and result["api_error_status"] == 400
    assert result["result"] == (
        "API Error: 400 the upstream server cannot take this request as it is set up: tools "
        "param requires --jinja flag (500). To fix: start llama-server with --jinja (tools are "
        "rendered by the chat template only then).")
    received = [headers for path, headers in SuiteRecord.requests[before:]
                if path == "/v1/messages"]
    assert [h.get("x-stainless-retry-count") for h in received] == ["0"] * len(received)
    assert len(received) == len(upstream.requests)
    betas = [h.get("anthropic-beta") for h in received]
    assert len(set(betas)) == len(betas)  # each one a different request


def tool_result(message: dict[str, Any]) -> str | None:
    """The tool result a message carries: a `tool` message, or (the loop as text) a user
    message opening with a `<tool_response>`."""
    content = message["content"]
    if message["role"] == "tool":
        return str(content)
    opening = "<tool_response>\n"
    if message["role"] == "user" and isinstance(content, str) and content.startswith(opening):
        return content.removeprefix(opening)
    return None


def bash_loop(body: dict[str, Any]) -> Reply:
    """A Bash `echo` call (a new call id each time) unless the last message is its result,
    which is then quoted."""
    result = tool_result(body["messages"][-1])
    if result is not None:
        return text_stream(["The command printed: ", result.splitlines()[0]])
    calls = sum(1 for m in body["messages"]
                if m.get("tool_calls") or "<tool_call>" in str(m.get("content")))
    arguments = json.dumps({"command": f"echo {TOOL_OUTPUT}", "description": "Print"})
    return Reply(events=[
        chunk({"role": "assistant", "tool_calls": [{
            "index": 0, "id": f"call_strict_{calls + 1}", "type": "function",
            "function": {"name": "Bash", "arguments": arguments}}]}),
        chunk({}, "tool_calls")])


def test_strict_template_carries_a_two_turn_session_with_a_tool_loop(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream, claude_bin: Path) -> None:
    """Claude Code's default model (no ANTHROPIC_MODEL) puts a system message in the
    middle of the conversation, and text after its tool results; the template (Gemma 3's)
    takes no `tool` message either."""
    proxy = proxy_factory(big_model=f"gemma-3-strict-{claude_bin.parts[-4]}")
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(bash_loop, refused)
    turns = [run_claude(tmp_path, proxy, prompt, *extra, "--allowedTools", "Bash(echo:*)",
                        binary=claude_bin, persist=True, model=None)
             for prompt, extra in (("run the echo", ()), ("run it once more", ("-c",)))]
    for lines in turns:
        assert lines[-1]["is_error"] is False, lines[-1]
        assert lines[-1]["result"] == f"The command printed: {TOOL_OUTPUT}"
        assert [t["name"] for t in blocks(lines, "tool_use")] == ["Bash"]
    # The first request was refused for its mid-conversation system message, and sent once
    # more; that one refusal taught the whole strict form, so the first request with a tool
    # result, and every one after it, went out folded with its tool loop as text at once.
    assert len(refused) == 1
    assert "system" in [m["role"] for m in refused[0]["messages"][1:]]
    answered = [body for body in upstream.requests if body not in refused]
    assert len(answered) == 4 and all(alternates(body["messages"]) for body in answered)
    last = answered[3]["messages"]
    assert [m["role"] for m in last] == [
        "system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    first_turn = last[1]["content"]
    assert "run the echo" in first_turn and "<system-reminder>" in first_turn
    assert last[2]["content"].endswith(
        '<tool_call>\n{"name":"Bash","arguments":{"command":"echo '
        f'{TOOL_OUTPUT}","description":"Print"}}}}\n</tool_call>')
    assert last[3]["content"].startswith(f"<tool_response>\n{TOOL_OUTPUT}")
    assert "run it once more" in last[5]["content"]
