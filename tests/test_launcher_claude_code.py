"""Real Claude Code (the pinned 2.1.328, and the newest one when installed) started by
`claude-proxy claude -p …`, against a scripted upstream whose window is 64 k tokens.

The upstream counts a prompt as its JSON characters / 4 (what it also reports as
`prompt_tokens`, so Claude Code sees the same figure) and refuses one over its window with
OpenAI's overflow error, as a real server would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import UPSTREAM_KEY, clean_env, free_port
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, error_reply, text_stream

ROOT = Path(__file__).resolve().parents[1]
PINNED = Path(os.environ.get(
    "CLAUDE_BIN",
    ROOT / ".cache/claude-code/node_modules/@anthropic-ai/claude-code-linux-x64/claude"))
NEWEST = Path(os.environ.get(
    "CLAUDE_BIN_NEWEST",
    ROOT / ".cache/claude-code-2.1.332/node_modules/@anthropic-ai/claude-code-linux-x64/claude"))
WINDOW = 65536
COMPACT_PROMPT = "Your task is to create a detailed summary of the conversation so far"
SUMMARY = "Summary: the user asked to read the numbered files one by one; files read so far."

pytestmark = pytest.mark.claude_code


def binaries() -> list[Any]:
    found = []
    for label, path in (("pinned", PINNED), ("newest", NEWEST)):
        path = path if path.is_absolute() else ROOT / path
        usable = os.access(path, os.X_OK)
        required = label == "pinned" and os.environ.get("CI")
        found.append(pytest.param(path, id=label, marks=[] if usable or required else [
            pytest.mark.skip(reason=f"Claude Code ({label}) not installed")]))
    return found


def prompt_tokens(body: dict[str, Any]) -> int:
    text = json.dumps({"messages": body["messages"], "tools": body.get("tools")},
                      ensure_ascii=False)
    return len(text) // 4


def usage(body: dict[str, Any]) -> dict[str, int]:
    tokens = prompt_tokens(body)
    return {"prompt_tokens": tokens, "completion_tokens": 20, "total_tokens": tokens + 20}


def read_call(path: Path, call: int, tokens: dict[str, int]) -> Reply:
    return Reply(events=[
        chunk({"role": "assistant", "tool_calls": [{
            "index": 0, "id": f"call_read_{call}", "type": "function",
            "function": {"name": "Read", "arguments": json.dumps({"file_path": str(path)})}}]}),
        chunk({}, "tool_calls"), chunk(None, None, tokens)])


class WindowedUpstream:
    """Refuses prompts over the window; otherwise reads the files one per turn, answers a
    compaction request with a summary, and ends once every file was read."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.reads = 0
        self.sizes: list[int] = []
        self.refused: list[int] = []
        self.compactions = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        tokens = prompt_tokens(body)
        self.sizes.append(tokens)
        if tokens > WINDOW:
            self.refused.append(tokens)
            return error_reply(400, f"This model's maximum context length is {WINDOW} tokens. "
                                    f"However, your messages resulted in {tokens} tokens.")
        if COMPACT_PROMPT in json.dumps(body["messages"][-1]):
            self.compactions += 1
            return text_stream([SUMMARY], usage=usage(body))
        if body.get("tools") and self.reads < len(self.files):
            self.reads += 1
            return read_call(self.files[self.reads - 1], self.reads, usage(body))
        return text_stream(["All files read."], usage=usage(body))


def numbered_files(work: Path, count: int, tokens_each: int) -> list[Path]:
    files = []
    for n in range(count):
        path = work / f"part{n}.txt"
        line = f"file {n} line of filler text for the context window test 0123456789\n"
        path.write_text(line * (tokens_each * 4 // len(line)))
        files.append(path)
    return files


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
    work = tmp_path / "work"
    work.mkdir()
    files = numbered_files(work, 5, 12000)
    script = WindowedUpstream(files)
    upstream.responder = script
    _, lines = launch_claude(tmp_path, binary, ["--env-file", str(env_file(tmp_path, upstream))],
                             "Read part0.txt to part4.txt one at a time.",
                             "--allowedTools", "Read")
    result = lines[-1]
    assert result["is_error"] is False and result["result"] == "All files read."
    assert [usage["contextWindow"] for usage in result["modelUsage"].values()] == [WINDOW]
    assert script.reads == len(files) and script.compactions >= 1
    assert script.refused == [] and max(script.sizes) <= WINDOW
    assert script.sizes[0] + 5 * 12000 > WINDOW  # the session really outgrew the window
    assert all(request["model"] in ("big-up", "small-up") for request in upstream.requests)


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
