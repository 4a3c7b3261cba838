"""The tool-call guard with the real Claude Code (the pin, and the newest release when another
is installed: tests/claude_code_pin.py): calls an upstream broke reach it repaired, the tool
runs, its result is no error, and the next upstream request carries the repaired arguments;
a call cut by the output limit reaches it as it was, and its own "could not be parsed" text
goes back to the model."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_pin import claude_binaries
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, text_stream
from tests.test_claude_code import blocks, run_claude

BINARIES = claude_binaries()
pytestmark = [
    pytest.mark.claude_code,
    pytest.mark.skipif(not os.access(BINARIES["pinned"], os.X_OK) and not os.environ.get("CI"),
                       reason="Claude Code not installed (make test installs it)"),
    pytest.mark.parametrize("binary", list(BINARIES.values()), ids=list(BINARIES)),
]


def calls_then_answer(frames: list[dict[str, Any]], finish: str = "tool_calls",
                      ) -> Callable[[dict[str, Any]], Reply]:
    """First request: the tool_calls frames as given; once results came back: an answer."""
    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] != "tool":
            return Reply(events=[chunk({"role": "assistant", "content": ""}),
                                 *(chunk({"tool_calls": [frame]}) for frame in frames),
                                 chunk({}, finish)])
        return text_stream(["done"])
    return respond


def frame(index: int, arguments: str, call_id: str | None = None,
          name: str | None = None) -> dict[str, Any]:
    start = {"id": call_id, "type": "function"} if call_id else {}
    function = {"name": name, "arguments": arguments} if name else {"arguments": arguments}
    return {"index": index, **start, "function": function}


def tool_results(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [block for line in lines if line["type"] == "user"
            for block in line["message"]["content"] if block.get("type") == "tool_result"]


def sent_back(upstream: ScriptedUpstream) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The second upstream request's assistant tool calls (arguments parsed) and tool
    messages."""
    messages = upstream.requests[1]["messages"]
    calls = [{"id": call["id"], "name": call["function"]["name"],
              "arguments": json.loads(call["function"]["arguments"])}
             for message in messages if message["role"] == "assistant"
             for call in message.get("tool_calls") or []]
    return calls, [message for message in messages if message["role"] == "tool"]


def test_a_bash_call_in_python_literals_runs(binary: Path, tmp_path: Path, proxy: ProxyServer,
                                             upstream: ScriptedUpstream) -> None:
    upstream.responder = calls_then_answer([
        frame(0, "", "call_py", "Bash"),
        frame(0, "{'command': 'echo hi-from-tool', 'description': 'Print a greeting', "),
        frame(0, "'run_in_background': False}")])
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)",
                       binary=binary)
    repaired = {"command": "echo hi-from-tool", "description": "Print a greeting",
                "run_in_background": False}
    assert [(use["name"], use["input"]) for use in blocks(lines, "tool_use")] == [
        ("Bash", repaired)]
    (result,) = tool_results(lines)
    assert not result.get("is_error") and result["content"] == "hi-from-tool"
    calls, tools = sent_back(upstream)
    assert calls == [{"id": "call_py", "name": "Bash", "arguments": repaired}]
    assert tools[0]["content"].startswith("hi-from-tool")


def test_nested_items_as_json_strings_are_repaired(binary: Path, tmp_path: Path,
                                                   proxy: ProxyServer,
                                                   upstream: ScriptedUpstream) -> None:
    """ReportFindings' `findings` items, each a JSON string with a number as a string too:
    Claude Code repairs top-level values only."""
    item = {"file": "a.py", "line": "3", "summary": "off by one",
            "failure_scenario": "an empty list"}
    upstream.responder = calls_then_answer([
        frame(0, "", "call_rf", "ReportFindings"),
        frame(0, json.dumps({"findings": [json.dumps(item)]}))])
    lines = run_claude(tmp_path, proxy, "report", "--allowedTools", "ReportFindings",
                       binary=binary)
    repaired = {"findings": [{**item, "line": 3}]}
    assert [(use["name"], use["input"]) for use in blocks(lines, "tool_use")] == [
        ("ReportFindings", repaired)]
    (result,) = tool_results(lines)
    assert not result.get("is_error") and result["content"] == "1 finding reported."
    calls, _ = sent_back(upstream)
    assert calls == [{"id": "call_rf", "name": "ReportFindings", "arguments": repaired}]


def test_two_reads_collapsed_onto_one_index_both_run(binary: Path, tmp_path: Path,
                                                     proxy: ProxyServer,
                                                     upstream: ScriptedUpstream) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("alpha\n")
    (work / "b.txt").write_text("beta\n")
    first, second = ({"file_path": str(work / name)} for name in ("a.txt", "b.txt"))
    upstream.responder = calls_then_answer([
        frame(0, "", "call_read", "Read"), frame(0, json.dumps(first)),
        frame(0, json.dumps(second))])
    lines = run_claude(tmp_path, proxy, "read both", "--allowedTools", "Read", binary=binary)
    uses = blocks(lines, "tool_use")
    assert [(use["name"], use["input"]) for use in uses] == [("Read", first), ("Read", second)]
    results = {result["tool_use_id"]: result for result in tool_results(lines)}
    assert [results[use["id"]]["content"] for use in uses] == ["1\talpha\n2\t", "1\tbeta\n2\t"]
    assert not any(result.get("is_error") for result in results.values())
    calls, tools = sent_back(upstream)
    assert [(call["name"], call["arguments"]) for call in calls] == [
        ("Read", first), ("Read", second)]
    assert calls[0]["id"] == "call_read" and calls[1]["id"].startswith("toolu_")
    assert sorted(tool["tool_call_id"] for tool in tools) == sorted(call["id"] for call in calls)


def test_a_call_cut_by_max_tokens_reaches_claude_code_as_it_was(
        binary: Path, tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    cut = '{"command": "rm -rf /tmp/build && echo do'
    upstream.responder = calls_then_answer([frame(0, "", "call_cut", "Bash"), frame(0, cut)],
                                           finish="length")
    lines = run_claude(tmp_path, proxy, "clean up", "--allowedTools", "Bash(echo:*)",
                       binary=binary)
    results = tool_results(lines)
    assert results and results[0]["is_error"] is True
    text = json.dumps(results[0]["content"])
    assert "could not be parsed as JSON" in text and "echo do" in text
    tools = sent_back(upstream)[1]
    assert "could not be parsed as JSON" in tools[0]["content"]


def test_with_reask_claude_code_gets_only_the_retrys_call(
        binary: Path, tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    """TOOL_GUARD_REASK on Claude Code's stream: a Bash call with a key its schema refuses
    (`cwd`) is held back and asked again; Claude Code sees one call, the retry's, runs it, and
    its next request carries that call alone."""
    proxy = proxy_factory(tool_guard_reask=True)
    good = {"command": "echo hi-again", "description": "Print a greeting"}

    def respond(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] != "tool":
            return calls_then_answer([frame(0, json.dumps({**good, "cwd": "/tmp"}), "call_bad",
                                            "Bash")])(body)
        if last["tool_call_id"] == "call_bad":
            return calls_then_answer([frame(0, json.dumps(good), "call_ok", "Bash")])(
                {"messages": [{"role": "user"}]})
        return text_stream(["done"])

    upstream.responder = respond
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)",
                       binary=binary)
    assert [(use["id"], use["input"]) for use in blocks(lines, "tool_use")] == [
        ("call_ok", good)]
    (result,) = tool_results(lines)
    assert not result.get("is_error") and result["content"] == "hi-again"
    assert len(upstream.requests) == 3
    history = upstream.requests[2]["messages"]
    assert [call["id"] for message in history for call in message.get("tool_calls") or []] == [
        "call_ok"]
