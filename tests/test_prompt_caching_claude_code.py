"""Prompt caching end to end with the real Claude Code 2.1.328: an OpenRouter-shaped upstream
with an `anthropic/*` model gets breakpoints on the parts Claude Code marked, and Claude Code's
result reports the cache reads and writes the upstream reported; over Claude Code's own
5-step tool loop every upstream body begins with the previous one's bytes."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import orjson
import pytest

from tests.conftest import ProxyServer
from tests.scripted_upstream import ScriptedUpstream, echo_loop, text_stream
from tests.test_claude_code import CLAUDE_BIN, run_claude
from tests.test_prompt_caching import (
    EPHEMERAL,
    assert_prefix_stable,
    key_of,
    marks,
    shape_settings,
)

pytestmark = [
    pytest.mark.claude_code,
    pytest.mark.skipif(not CLAUDE_BIN.exists(), reason="Claude Code not installed"),
]

USAGE = {"prompt_tokens": 21000, "completion_tokens": 9, "total_tokens": 21009,
         "prompt_tokens_details": {"cached_tokens": 18000, "cache_write_tokens": 2500}}
STEPS = 5


def test_breakpoints_reach_openrouter_and_claude_code_reports_the_cache(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**shape_settings("openrouter-anthropic"))
    upstream.queue(text_stream(["cached ", "answer"], usage=USAGE))
    lines = run_claude(tmp_path, proxy, "say hi")
    result = lines[-1]
    assert result["is_error"] is False and result["result"] == "cached answer"
    usage = result["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"],
            usage["cache_creation_input_tokens"], usage["output_tokens"]) == (500, 18000, 2500, 9)
    sent = upstream.requests[0]
    found = marks(sent)
    # Claude Code marks system blocks 1 and 2 (block 0, the billing header, is left out) and
    # the last block of the last message.
    assert [where for where, _, _ in found] == [
        (0, "system", 0), (0, "system", 1),
        (1, "user", len(sent["messages"][1]["content"]) - 1)]
    assert [marker for _, _, marker in found] == [EPHEMERAL] * 3
    assert found[0][1].startswith("You are a Claude agent")
    assert found[2][1] == "say hi"
    session = upstream.headers[0].get("x-claude-code-session-id")
    assert session is None  # the header is not forwarded; only its hash is
    assert sent["prompt_cache_key"].startswith("cc-") and len(sent["prompt_cache_key"]) == 43


@pytest.mark.parametrize("shape", ["openrouter-anthropic", "deepseek", "openai"])
def test_five_step_loop_keeps_every_prefix(
        shape: str, tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**shape_settings(shape))
    upstream.responder = echo_loop(STEPS, "All steps ran.")
    lines = run_claude(tmp_path, proxy, "run five steps", "--allowedTools", "Bash(echo:*)")
    assert lines[-1]["result"] == "All steps ran." and lines[-1]["num_turns"] == STEPS
    bodies = upstream.requests
    assert len(bodies) == STEPS
    assert_prefix_stable(bodies)
    if shape != "openrouter-anthropic":
        for before, after in pairwise(bodies):
            assert orjson.dumps(after["messages"]).startswith(
                orjson.dumps(before["messages"])[:-1])
            assert "cache_control" not in orjson.dumps(after).decode()
    else:
        for body in bodies:
            last = body["messages"][-1]
            assert [where for where, _, _ in marks(body)] == [
                (0, "system", 0), (0, "system", 1),
                (len(body["messages"]) - 1, last["role"], len(last["content"]) - 1)]
    keys = {body.get("prompt_cache_key") for body in bodies}
    assert len(keys) == 1
    if shape != "deepseek":
        assert keys == {key_of(lines[0]["session_id"])}  # Claude Code's session id, hashed
        assert lines[0]["session_id"] not in orjson.dumps(bodies[0]).decode()
