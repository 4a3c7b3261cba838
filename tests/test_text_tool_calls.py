"""Tool calls written as text by Qwen3-Coder / Qwen 3.5 (TEXT_TOOL_CALL_PREFIXES): the splitter
on the recorded shapes (tests/data/text-tool-calls.json, each with its source), cut at every
point, and the whole path through the proxy with the anthropic SDK, streamed and not."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest

from claude_proxy.conversion.text_tool_calls import (
    MAX_ENVELOPE_CHARS,
    Piece,
    TextCall,
    TextToolCallSplitter,
)
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion
from tests.test_claude_code import CLAUDE_BIN, run_claude

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "text-tool-calls.json").read_text())["cases"]
QWEN = "Qwen/Qwen3-Coder-30B-A3B-Instruct"


def expected_pieces(case: dict[str, Any]) -> list[Piece]:
    return [("text", item[1]) if item[0] == "text" else ("call", TextCall(item[1], item[2]))
            for item in case["expected"]]


def merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent text pieces joined (how a stream cuts text is not part of the answer)."""
    out: list[Piece] = []
    for piece in pieces:
        if piece[0] == "text" and out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + piece[1])
        elif piece != ("text", ""):
            out.append(piece)
    return out


def split(content: str, tools: dict[str, Any], cuts: list[int]) -> list[Piece]:
    splitter = TextToolCallSplitter(tools)
    pieces: list[Piece] = []
    for start, end in zip([0, *cuts], [*cuts, len(content)], strict=True):
        pieces += splitter.feed(content[start:end])
    return merged(pieces + splitter.flush())


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_recorded_shapes_whole_and_cut_at_every_point(case: dict[str, Any]) -> None:
    content, tools = case["content"], case["tools"]
    expected = expected_pieces(case)
    assert split(content, tools, []) == expected
    for cut in range(1, len(content)):
        assert split(content, tools, [cut]) == expected, cut
    assert split(content, tools, list(range(1, len(content)))) == expected


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_an_undeclared_tool_or_missing_argument_stays_text(case: dict[str, Any]) -> None:
    content = case["content"]
    assert split(content, {"another_tool": {}}, [7]) == [("text", content)]
    (name, schema), = case["tools"].items()
    stricter = {name: {**schema, "required": [*schema["required"], "absent"]}}
    assert split(content, stricter, [7]) == [("text", content)]


def test_text_that_only_mentions_a_marker_comes_out_unchanged() -> None:
    tools = {"square_the_number": CASES[0]["tools"]["square_the_number"]}
    for text in ("a < b and <tool", "use <function=x> to call", "<tool_call>not json</tool_call>"):
        assert split(text, tools, [3, 9]) == [("text", text)]


def test_two_calls_and_an_envelope_too_long_to_hold() -> None:
    weather = CASES[2]["tools"]
    one = CASES[2]["content"].split("\n\n", 1)[1]
    two = one.replace("Tokyo, Japan", "Paris")
    assert split(one + "\n" + two, weather, [50, 120]) == [
        ("call", TextCall("get_current_weather", {"location": "Tokyo, Japan"})),
        ("text", "\n"), ("call", TextCall("get_current_weather", {"location": "Paris"}))]
    endless = "<tool_call>\n" + "x" * MAX_ENVELOPE_CHARS
    assert split(endless, weather, [20]) == [("text", endless)]


# ------------------------------------------------------------ through the proxy

SQUARE = {"name": "square_the_number", "description": "output the square of the number.",
          "input_schema": CASES[0]["tools"]["square_the_number"]}
XML_CALL = CASES[0]["content"]


def ask(proxy: ProxyServer, *, stream: bool) -> tuple[anthropic.types.Message, list[str]]:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    fields: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 1024,
                              "tools": [SQUARE],
                              "messages": [{"role": "user", "content": "Square 1024"}]}
    if not stream:
        return client.messages.create(**fields), []
    with client.messages.stream(**fields) as events:
        kinds = [f"{event.type}:{getattr(getattr(event, 'delta', None), 'type', '')}"
                 for event in events if event.type.startswith("content_block")]
        return events.get_final_message(), kinds


def streamed(pieces: list[str]) -> Reply:
    return Reply(events=[chunk({"role": "assistant", "content": ""}),
                         *(chunk({"content": piece}) for piece in pieces), chunk({}, "stop")])


def test_a_streamed_text_call_cut_across_chunks_becomes_tool_use(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model=QWEN)
    text = "Let me square it.\n\n"
    pieces = [text + "<tool", "_call>\n<func", "tion=square_the_number>\n<parameter=input",
              "_num>\n1024\n\n\n</tool_c", "all>"]
    assert "".join(pieces) == text + XML_CALL
    upstream.queue(streamed(pieces))
    message, kinds = ask(proxy, stream=True)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[0].text == text  # type: ignore[union-attr]
    call = message.content[1]
    assert isinstance(call, anthropic.types.ToolUseBlock)
    assert (call.name, call.input) == ("square_the_number", {"input_num": 1024})
    assert call.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    assert kinds == ["content_block_start:", "content_block_delta:text_delta",
                     "content_block_stop:", "content_block_start:",
                     "content_block_delta:input_json_delta", "content_block_stop:"]
    assert upstream.requests[0]["model"] == QWEN


@pytest.mark.parametrize("case", CASES[:2], ids=[case["name"] for case in CASES[:2]])
def test_a_non_streamed_text_call_becomes_tool_use(
        case: dict[str, Any], proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model=QWEN)
    upstream.queue(completion({"content": case["content"]}, finish=case["finish_reason"]))
    message, _ = ask(proxy, stream=False)
    assert message.stop_reason == "tool_use"
    assert [(block.type, getattr(block, "name", None), getattr(block, "input", None))
            for block in message.content] == [
        ("tool_use", "square_the_number", {"input_num": 1024})]


def test_an_undeclared_tool_name_stays_text(proxy_factory: Callable[..., ProxyServer],
                                            upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model=QWEN)
    content = XML_CALL.replace("square_the_number", "delete_everything")
    upstream.queue(streamed([content[:20], content[20:]]),
                   completion({"content": content}))
    for stream in (True, False):
        message, _ = ask(proxy, stream=stream)
        assert [(block.type, getattr(block, "text", None)) for block in message.content] == [
            ("text", content)]
        assert message.stop_reason == "end_turn"


def test_models_not_named_keep_the_text(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model=QWEN, text_tool_call_prefixes=["some-other-model"])
    upstream.queue(completion({"content": XML_CALL}))
    message, _ = ask(proxy, stream=False)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == XML_CALL  # type: ignore[union-attr]


# ------------------------------------------------------------ with the real Claude Code

BASH_AS_TEXT = ("I'll run it.\n\n<tool_call>\n<function=Bash>\n<parameter=command>\n"
                "echo hi-from-text-call\n</parameter>\n<parameter=description>\nPrint a "
                "greeting\n</parameter>\n</function>\n</tool_call>")


def qwen_bash_responder(body: dict[str, Any]) -> Reply:
    """Qwen3-Coder behind a server that did not parse its call: the Bash call as text with
    finish_reason stop, cut mid-tag; then the answer."""
    if any(message["role"] == "tool" for message in body["messages"]):
        output = body["messages"][-1]["content"].split("\n", 1)[0]
        return streamed([f"The command printed: {output.strip()}"])
    return streamed([BASH_AS_TEXT[:40], BASH_AS_TEXT[40:75], BASH_AS_TEXT[75:]])


@pytest.mark.claude_code
@pytest.mark.skipif(not os.access(CLAUDE_BIN, os.X_OK) and not os.environ.get("CI"),
                    reason="Claude Code not installed (make test installs it)")
def test_claude_code_runs_a_tool_call_qwen_wrote_as_text(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model=QWEN)
    upstream.responder = qwen_bash_responder
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    tool_uses = [block for line in lines if line["type"] == "assistant"
                 for block in line["message"]["content"] if block["type"] == "tool_use"]
    assert [(t["name"], t["input"]) for t in tool_uses] == [
        ("Bash", {"command": "echo hi-from-text-call", "description": "Print a greeting"})]
    second = upstream.requests[1]
    assert second["messages"][-2]["tool_calls"][0]["function"] == {
        "name": "Bash",
        "arguments": '{"command":"echo hi-from-text-call","description":"Print a greeting"}'}
    assert second["messages"][-1]["content"].startswith("hi-from-text-call")
    assert lines[-1]["result"] == "The command printed: hi-from-text-call"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2
