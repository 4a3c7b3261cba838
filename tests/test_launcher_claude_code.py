"""Real Claude Code (the pin, and the newest release when another is installed) started by
`claude-proxy claude -p …`: a session past a 64 k window, and a Task subagent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_pin import claude_binaries
from tests.conftest import UPSTREAM_KEY, clean_env, free_port
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, text_stream
from tests.test_claude_code_windows import FINAL, WINDOW, WindowedUpstream

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.claude_code


def binaries() -> list[Any]:
    found = []
    for label, path in claude_binaries().items():
        usable = os.access(path, os.X_OK)
        required = label == "pinned" and os.environ.get("CI")
        found.append(pytest.param(path, id=label, marks=[] if usable or required else [
            pytest.mark.skip(reason=f"Claude Code ({label}) not installed")]))
    return found


def launch_claude(tmp_path: Path, binary: Path, config_args: list[str], prompt: str,
                  *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for folder in (home, work, tmp):
        folder.mkdir(exist_ok=True)
    env = clean_env(tmp_path, HOME=str(home), TMPDIR=str(tmp), CLAUDE_BIN=str(binary),
                    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_MAX_RETRIES="0")
    command = [sys.executable, "-m", "claude_proxy", "claude", *config_args, "-p", prompt,
               "--output-format", "stream-json", "--verbose", "--no-session-persistence",
               *extra]
    result = subprocess.run(command, env=env, cwd=work, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines and lines[-1]["type"] == "result", (result.stdout[-2000:], result.stderr)
    return result, lines


def env_file(tmp_path: Path, upstream: ScriptedUpstream) -> Path:
    path = tmp_path / ".env.windowed"
    path.write_text(f"OPENAI_API_KEY={UPSTREAM_KEY}\nOPENAI_BASE_URL={upstream.base_url}\n"
                    f"PROVIDER=openai\nBIG_MODEL=big-up\nMIDDLE_MODEL=middle-up\n"
                    f"SMALL_MODEL=small-up\nPORT={free_port()}\nCONTEXT_WINDOW={WINDOW}\n"
                    f"PROVIDER_MAX_OUTPUT_TOKENS=16384\nLOG_FILE={tmp_path / 'proxy.log'}\n")
    return path


@pytest.mark.parametrize("binary", binaries())
def test_a_long_session_compacts_by_itself_within_the_window(
        tmp_path: Path, upstream: ScriptedUpstream, binary: Path) -> None:
    """The session of tests/test_claude_code_windows.py, through the launcher: Claude Code
    knows the window, so it compacts before any request is too long — the proxy refuses
    nothing and nothing over the window reaches the upstream."""
    model = WindowedUpstream()
    upstream.responder = model
    _, lines = launch_claude(tmp_path, binary, ["--env-file", str(env_file(tmp_path, upstream))],
                             "Print numbers with seq again and again until told to stop.",
                             "--allowedTools", "Bash(seq:*)")
    result = lines[-1]
    assert result["is_error"] is False and result["result"] == FINAL
    assert [usage["contextWindow"] for usage in result["modelUsage"].values()] == [WINDOW]
    assert model.compactions >= 1 and model.too_long == [] and max(model.sizes) <= WINDOW
    statuses = re.findall(r"POST /v1/messages .* status=(\d+)",
                          (tmp_path / "logs" / "claude-proxy.log").read_text())
    assert len(statuses) == len(model.sizes) and set(statuses) == {"200"}  # none refused


def subagent_config(tmp_path: Path, upstream: ScriptedUpstream) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(f'[providers.up]\nopenai_base_url = "{upstream.base_url}"\n'
                    f'openai_api_key = "{UPSTREAM_KEY}"\nprovider = "openai"\n'
                    f"context_window = {WINDOW}\n\n[router]\ndefault = \"up,main-model\"\n"
                    f'background = "up,small-model"\nsubagent = "up,sub-model"\n')
    return path


TASK = "Count the files in this folder and report the number."


def subagent_responder(calls: list[tuple[str, str]]) -> Callable[[dict[str, Any]], Reply]:
    """The main loop starts one general-purpose subagent; the subagent answers at once; the
    main loop then ends with what it said."""
    def respond(body: dict[str, Any]) -> Reply:
        text = json.dumps(body["messages"])
        calls.append((body["model"], "subagent" if TASK in json.dumps(
            body["messages"][:2]) else "main"))
        if not body.get("tools"):
            return text_stream(["ok"])
        if body["model"] == "sub-model":
            return text_stream(["There are 3 files."])
        if "There are 3 files." in text:
            return text_stream(["The subagent says: 3 files."])
        return Reply(events=[
            chunk({"role": "assistant", "tool_calls": [{
                "index": 0, "id": "call_agent_1", "type": "function",
                "function": {"name": "Agent", "arguments": json.dumps({
                    "description": "Count files", "prompt": TASK,
                    "subagent_type": "general-purpose"})}}]}),
            chunk({}, "tool_calls")])
    return respond


@pytest.mark.parametrize("binary", binaries())
def test_a_task_subagents_requests_reach_the_subagent_route(
        tmp_path: Path, upstream: ScriptedUpstream, binary: Path) -> None:
    calls: list[tuple[str, str]] = []
    upstream.responder = subagent_responder(calls)
    _, lines = launch_claude(tmp_path, binary, ["--config", str(subagent_config(tmp_path,
                                                                                upstream))],
                             "Use a subagent to count the files.", "--allowedTools", "Agent")
    assert lines[-1]["result"] == "The subagent says: 3 files."
    tool_models = [(model, who) for model, who in calls]
    assert ("sub-model", "subagent") in tool_models
    assert all(model == "sub-model" for model, who in tool_models if who == "subagent")
    assert all(model in ("main-model", "small-model") for model, who in tool_models
               if who == "main")
    log = (tmp_path / "logs" / "claude-proxy.log").read_text()
    sub_lines = [line for line in log.splitlines() if "route=subagent" in line]
    assert sub_lines and all(" agent=-" not in line for line in sub_lines)


DISCOVERED = 32768
"""llama-server's `-c 32768`: a window told only by its `/props`."""


@pytest.mark.parametrize("binary", binaries())
def test_a_discovered_window_reaches_claude_code(
        tmp_path: Path, upstream: ScriptedUpstream, binary: Path) -> None:
    """A llama.cpp provider with no configured window: the proxy the launcher starts learns
    `n_ctx` from `/props`, and Claude Code's result reports it as its context window."""
    upstream.props = {"default_generation_settings": {"n_ctx": DISCOVERED},
                      "build_info": "b0-unknown", "chat_template": "{{ messages }}",
                      "total_slots": 1}
    upstream.responder = lambda _body: text_stream(["done"])
    path = tmp_path / ".env.llamacpp"
    path.write_text(f"OPENAI_BASE_URL={upstream.base_url}\nPROVIDER=llamacpp\nBIG_MODEL=gguf\n"
                    f"MIDDLE_MODEL=gguf\nSMALL_MODEL=gguf\nPORT={free_port()}\n"
                    "PROVIDER_MAX_OUTPUT_TOKENS=4096\n")
    _, lines = launch_claude(tmp_path, binary, ["--env-file", str(path)], "Say done.")
    result = lines[-1]
    assert result["is_error"] is False and result["result"] == "done"
    assert [usage["contextWindow"] for usage in result["modelUsage"].values()] == [DISCOVERED]
