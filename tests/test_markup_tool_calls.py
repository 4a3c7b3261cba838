"""Tool-call markup left in the text or the reasoning (DeepSeek's DSML and special tokens,
Kimi's section tokens, GLM's arg_key/arg_value, MiniMax's invoke, gpt-oss's harmony): the
shapes quoted in public threads (tests/data/markup-tool-calls.json, each with its source) read
whole, cut at every point and cut anywhere (Hypothesis); a call the check refuses gives the
text back byte for byte; and the path through the proxy on all three upstream APIs, streamed
and not, and with the real Claude Code."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from claude_proxy.config.settings import ProviderSettings, matches_prefix
from claude_proxy.conversion.deltas import Delta, ReasoningText, Text, ToolCall
from claude_proxy.conversion.text_tool_calls import (
    Check,
    TextCallParser,
    TextCallPlan,
    declared_tools,
)
from claude_proxy.upstream.chat_completions import ChatCompletionsParser
from claude_proxy.upstream.messages import MessagesParser
from tests.conftest import FIXTURES, ProxyServer
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    message_reply,
    message_stream,
    responses_stream,
)
from tests.test_claude_code import CLAUDE_BIN, run_claude

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "markup-tool-calls.json").read_text())["cases"]
BY_NAME = {case["name"]: case for case in CASES}
CLAUDE_CODE_TOOLS: list[dict[str, Any]] = json.loads(
    (FIXTURES / "claude-code-2.1.332-first-request.json").read_text())["body"]["tools"]
DEFAULTS = ProviderSettings()


def offered(case: dict[str, Any]) -> dict[str, Any]:
    """The case's tools, name → schema (Claude Code's own where the case names them)."""
    tools = {tool["name"]: tool["input_schema"] for tool in CLAUDE_CODE_TOOLS
             if tool["name"] in case["claude_code_tools"]}
    return {**tools, **case["tools"]}


def pieces(content: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(content)]
    return [content[start:end] for start, end in pairwise(bounds) if end > start]


def stream_chunks(case: dict[str, Any], parts: list[str]) -> list[dict[str, Any]]:
    """The parts as the upstream's stream: Chat Completions chunks, or a Messages stream's
    text block events."""
    if case["where"] == "messages-text":
        return [{"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}},
                *({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": part}} for part in parts),
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}]
    field = "reasoning_content" if case["where"] == "reasoning" else "content"
    return [*({"choices": [{"index": 0, "delta": {field: part}, "finish_reason": None}]}
              for part in parts),
            {"choices": [{"index": 0, "delta": {}, "finish_reason": case["finish_reason"]}]}]


def normalised(deltas: list[Delta]) -> list[list[Any]]:
    """Text and reasoning joined where adjacent (how a stream cuts them is not the answer),
    calls as [name, arguments, id]."""
    out: list[list[Any]] = []
    for delta in deltas:
        if isinstance(delta, Text | ReasoningText):
            kind = "text" if isinstance(delta, Text) else "reasoning"
            if out and out[-1][0] == kind:
                out[-1][1] += delta.text
            elif delta.text:
                out.append([kind, delta.text])
        elif isinstance(delta, ToolCall):
            out.append(["call", delta.name, json.loads(delta.arguments), delta.id])
    return out


def read(case: dict[str, Any], parts: list[str], *, in_reasoning: bool = False,
         tools: dict[str, Any] | None = None, check: Check | None = None,
         markup: bool = True) -> list[list[Any]]:
    """The case's stream through the Chat Completions parser and, with `markup`, the
    reader of the families its model has by default."""
    model = case["model"]
    parser: Any = MessagesParser() if case["where"] == "messages-text" else ChatCompletionsParser(
        think_tags=matches_prefix(model, DEFAULTS.think_tag_models), leading_think_tags=True)
    if markup:
        families = DEFAULTS.tool_call_markup(model)
        assert families, model
        parser = TextCallParser(parser, TextCallPlan(offered(case) if tools is None else tools,
                                                     families, in_reasoning, check))
    deltas = [delta for part in stream_chunks(case, parts) for delta in parser.parse(part)]
    return normalised(deltas + parser.flush())


def every_cut(case: dict[str, Any]) -> list[list[int]]:
    content = case["content"]
    recorded = case.get("chunks")
    chunked = ([len("".join(recorded[:at])) for at in range(1, len(recorded))] if recorded
               else list(range(7, len(content), 7)))
    return [[], chunked, list(range(1, len(content))),
            *([cut] for cut in range(1, len(content)))]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_recorded_shapes_whole_and_cut_at_every_point(case: dict[str, Any]) -> None:
    opt_in = case.get("expected_reasoning_opt_in")
    for cuts in every_cut(case):
        parts = pieces(case["content"], cuts)
        assert read(case, parts) == case["expected"], cuts
        if opt_in is not None:
            assert read(case, parts, in_reasoning=True) == opt_in, cuts


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_any_split_into_chunks_reads_the_same(case: dict[str, Any], data: st.DataObject) -> None:
    content = case["content"]
    cuts = data.draw(st.lists(st.integers(1, max(1, len(content) - 1)), max_size=12))
    in_reasoning = data.draw(st.booleans())
    whole = read(case, [content], in_reasoning=in_reasoning)
    assert read(case, pieces(content, cuts), in_reasoning=in_reasoning) == whole


CALLS = [case for case in CASES if any(piece[0] == "call" for piece in
                                       case.get("expected_reasoning_opt_in", case["expected"]))]


@pytest.mark.parametrize("case", CALLS, ids=[case["name"] for case in CALLS])
def test_a_call_to_an_unoffered_tool_or_refused_by_the_check_gives_the_text_back(
        case: dict[str, Any]) -> None:
    """The answer is then exactly what it is without any markup reading: the text (and
    reasoning) byte for byte, in order."""
    parts = pieces(case["content"], list(range(5, len(case["content"]), 5)))
    plain = read(case, parts, markup=False)
    assert all(piece[0] != "call" for piece in plain)
    assert read(case, parts, in_reasoning=True, check=lambda name, arguments: None) == plain
    assert read(case, parts, in_reasoning=True, tools={"another_tool": {}}) == plain
    if case["where"] != "reasoning" and "<think>" not in case["content"]:
        assert plain == [["text", case["content"]]]


def test_the_check_decides_and_its_arguments_are_what_is_sent() -> None:
    """The check is the only judge: what it returns (a guard's repair) goes out, and every
    call of an envelope must pass for any to be sent."""
    case = BY_NAME["dsml-opensquilla"]
    seen: list[tuple[str, dict[str, Any]]] = []

    def repairing(name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        seen.append((name, arguments))
        return {**arguments, "checked": True}

    calls = read(case, [case["content"]], check=repairing)
    assert [call[2]["checked"] for call in calls] == [True, True]
    assert [name for name, _ in seen] == ["exec_command", "exec_command"]
    second_refused = read(case, [case["content"]],
                          check=lambda name, arguments: None if "FileHash" in arguments["cmd"]
                          else arguments)
    assert second_refused == [["text", case["content"]]]


def test_text_around_the_markup_stays_in_order_and_mentions_stay_text() -> None:
    case = BY_NAME["dsml-sglang"]
    envelope = case["content"]
    content = f"Before.\n{envelope}\nBetween <｜DSML｜ and <|channel|> text.\n{envelope}\nAfter."
    text = {**case, "content": content}
    assert read(text, pieces(content, [3, 40, 200, 231])) == [
        ["text", "Before.\n"], ["call", "Bash", {"command": "pwd"}, ""],
        ["text", "\nBetween <｜DSML｜ and <|channel|> text.\n"],
        ["call", "Bash", {"command": "pwd"}, ""], ["text", "\nAfter."]]


def test_a_section_in_the_reasoning_followed_by_more_reasoning_or_an_answer_stays_reasoning(
        ) -> None:
    """Only a section the reasoning ends in, in an answer with nothing else, is a call."""
    case = BY_NAME["kimi-in-reasoning-bedrock"]
    section = case["content"]
    planned = {**case, "content": section + " Then I will add them."}
    assert read(planned, [section[:30], section[30:] + " Then I will add them."],
                in_reasoning=True) == [["reasoning", planned["content"]]]
    model = case["model"]
    parser = TextCallParser(ChatCompletionsParser(leading_think_tags=True),
                            TextCallPlan(offered(case), DEFAULTS.tool_call_markup(model), True))
    deltas = parser.parse({"choices": [{"delta": {"reasoning_content": section}}]})
    deltas += parser.parse({"choices": [{"delta": {"content": "The answer is 10368."}}]})
    assert normalised(deltas + parser.flush()) == [
        ["reasoning", section], ["text", "The answer is 10368."]]


def test_the_families_are_on_by_default_for_the_models_that_ship_them() -> None:
    assert {model: DEFAULTS.tool_call_markup(model) for model in (
        "deepseek-v4-flash", "deepseek-ai/DeepSeek-V3.1", "moonshotai/Kimi-K2.6",
        "moonshot.kimi-k2-thinking", "glm-5.1", "zai-org/GLM-4.7", "MiniMax-M3",
        "openai/gpt-oss-120b", "Qwen/Qwen3-Coder-480B-A35B", "gpt-5.5")} == {
        "deepseek-v4-flash": ("deepseek",), "deepseek-ai/DeepSeek-V3.1": ("deepseek",),
        "moonshotai/Kimi-K2.6": ("kimi",), "moonshot.kimi-k2-thinking": ("kimi",),
        "glm-5.1": ("glm",), "zai-org/GLM-4.7": ("glm",), "MiniMax-M3": ("minimax",),
        "openai/gpt-oss-120b": ("harmony",), "Qwen/Qwen3-Coder-480B-A35B": ("qwen",),
        "gpt-5.5": ()}
    chosen = ProviderSettings(glm_tool_call_prefixes="", kimi_tool_call_prefixes="*")
    assert chosen.tool_call_markup("glm-5.1") == ("kimi",)
    assert not DEFAULTS.reads_reasoning_tool_calls("kimi-k2.6")
    assert ProviderSettings(reasoning_tool_call_prefixes="kimi").reads_reasoning_tool_calls(
        "kimi-k2.6")


def test_the_offered_tools_are_read_from_every_apis_request() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert declared_tools({"tools": [
        {"type": "function", "function": {"name": "chat", "parameters": schema}},
        {"type": "function", "name": "responses", "parameters": schema},
        {"name": "messages", "input_schema": schema},
        {"type": "web_search_20250305", "name": "web_search"}]}) == {
        "chat": schema, "responses": schema, "messages": schema}


# ------------------------------------------------------------ through the proxy

THROUGH_CHAT = ["dsml-sglang", "kimi-call-without-section", "glm-typed-values",
                "harmony-analysis-then-call", "minimax-without-opening-tag"]


def anthropic_tools(case: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "description": name, "input_schema": schema}
            for name, schema in offered(case).items()]


def ask(proxy: ProxyServer, case: dict[str, Any], *, stream: bool,
        **fields: Any) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    request: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 1024,
                               "tools": anthropic_tools(case),
                               "messages": [{"role": "user", "content": "go"}], **fields}
    if not stream:
        return client.messages.create(**request).model_dump(exclude_none=True)
    with client.messages.stream(**request) as events:
        return events.get_final_message().model_dump(exclude_none=True)


def blocks(message: dict[str, Any]) -> list[list[Any]]:
    kinds = {"text": "text", "thinking": "reasoning"}
    return [["call", block["name"], block["input"]] if block["type"] == "tool_use"
            else [kinds[block["type"]], block.get("text", block.get("thinking"))]
            for block in message["content"]]


def expected_blocks(expected: list[list[Any]]) -> list[list[Any]]:
    """The pieces as blocks: calls without their ids; whitespace alone makes no block."""
    return [piece[:3] if piece[0] == "call" else piece for piece in expected
            if piece[0] == "call" or piece[1].strip()]


def chat_reply(case: dict[str, Any], *, stream: bool) -> Reply:
    if not stream:
        return completion({"content": case["content"]}, finish=case["finish_reason"])
    parts = pieces(case["content"], list(range(7, len(case["content"]), 7)))
    return Reply(events=[chunk({"role": "assistant", "content": ""}),
                         *(chunk({"content": part}) for part in parts),
                         chunk({}, case["finish_reason"])])


@pytest.mark.parametrize("name", THROUGH_CHAT)
def test_the_chat_completions_answer_becomes_tool_use_streamed_and_not(
        name: str, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    case = BY_NAME[name]
    proxy = proxy_factory(middle_model=case["model"])
    for stream in (True, False):
        upstream.queue(chat_reply(case, stream=stream))
        message = ask(proxy, case, stream=stream, thinking={"type": "enabled",
                                                            "budget_tokens": 1024})
        assert blocks(message) == expected_blocks(case["expected"]), stream
        assert message["stop_reason"] == "tool_use"
        if name == "kimi-call-without-section":  # Kimi's id, encoded reversibly
            assert message["content"][0]["id"] == (
                "toolu_px" + b"functions.get_weather:0".hex())


def test_a_call_read_from_text_passes_the_tool_call_guards_check(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """With TOOL_GUARD=repair (the default) a call read from text is the guard's to check:
    a tool named in another case (R8) is the one offered, and its string-written integer
    is sent as the integer its schema asks for; with `observe`, the reader's own check
    finds no such tool and the text goes back as it came."""
    content = ('<|tool_call_begin|> functions.GET_WEATHER:0 {"city": "Tokyo", "days": "3"} '
               '<|tool_call_end|>')
    case = {**BY_NAME["kimi-call-without-section"], "content": content,
            "tools": {"get_weather": {"type": "object", "additionalProperties": False,
                                      "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}},
                                      "required": ["city"]}}}
    expected = {"repair": [["call", "get_weather", {"city": "Tokyo", "days": 3}]],
                "observe": [["text", content]]}
    for mode, blocks_sent in expected.items():
        proxy = proxy_factory(middle_model=case["model"], tool_guard=mode)
        upstream.queue(chat_reply(case, stream=False))
        assert blocks(ask(proxy, case, stream=False)) == blocks_sent, mode


def test_models_not_named_keep_the_text(proxy_factory: Callable[..., ProxyServer],
                                        upstream: ScriptedUpstream) -> None:
    case = BY_NAME["dsml-sglang"]
    proxy = proxy_factory(middle_model=case["model"], deepseek_tool_call_prefixes="")
    upstream.queue(chat_reply(case, stream=True))
    message = ask(proxy, case, stream=True)
    assert blocks(message) == [["text", case["content"]]]
    assert message["stop_reason"] == "end_turn"


def test_a_section_the_reasoning_ends_in_becomes_tool_use_when_opted_in(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    case = BY_NAME["kimi-in-reasoning"]
    content = case["content"]
    events = [chunk({"role": "assistant", "reasoning_content": content[:60]}),
              chunk({"reasoning_content": content[60:]}), chunk({}, "stop")]
    for prefixes, expected in (("kimi", case["expected_reasoning_opt_in"]),
                               ("", case["expected"])):
        proxy = proxy_factory(middle_model=case["model"], reasoning_tool_call_prefixes=prefixes)
        upstream.queue(Reply(events=list(events)))
        message = ask(proxy, case, stream=True,
                      thinking={"type": "enabled", "budget_tokens": 1024})
        assert blocks(message) == expected_blocks(expected), prefixes


def test_minimaxs_own_messages_api_text_block_becomes_tool_use(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """MiniMax's Anthropic-format endpoint answered with the markup as a `text` block
    (MiniMax-AI/MiniMax-M2.5#10, the block verbatim)."""
    case = BY_NAME["minimax-anthropic-text-block"]
    proxy = proxy_factory(upstream_api="messages", openai_base_url=upstream.root_url,
                          provider="minimax", middle_model=case["model"])
    text = [{"type": "text", "text": case["content"]}]
    upstream.queue(message_stream(text, pieces=9), message_reply(text))
    for stream in (True, False):
        message = ask(proxy, case, stream=stream)
        assert blocks(message) == [["call", "exec", {"command": "ls"}]], stream
        assert message["stop_reason"] == "tool_use"
    assert upstream.requests[-1]["tools"][0]["name"] == "exec"


def test_a_responses_api_answer_with_harmony_text_becomes_tool_use(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """gpt-oss behind a /responses server whose harmony parser missed the call (synthetic
    events around the imp#1719 text)."""
    case = BY_NAME["harmony-analysis-then-call"]
    proxy = proxy_factory(middle_model=case["model"], reasoning_model_prefixes="gpt-oss")
    content = case["content"]
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress",
            "content": []}
    upstream.queue(responses_stream(
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
           "content_index": 0, "delta": content[at:at + 11]} for at in range(0, len(content), 11)),
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                                                    "output": [], "usage": {
                                                        "input_tokens": 5,
                                                        "output_tokens": 9}}}))
    message = ask(proxy, case, stream=True)
    assert upstream.paths[-1].endswith("/responses")
    assert blocks(message) == expected_blocks(case["expected"])
    assert message["stop_reason"] == "tool_use"


# ------------------------------------------------------------ with the real Claude Code

def dsml_bash_responder(body: dict[str, Any]) -> Reply:
    """DeepSeek V4 behind a server that left its DSML in the content (finish_reason stop),
    cut mid-tag; then the answer."""
    if any(message["role"] == "tool" for message in body["messages"]):
        output = body["messages"][-1]["content"].split("\n", 1)[0]
        return Reply(events=[chunk({"role": "assistant", "content": ""}),
                             chunk({"content": f"It printed: {output.strip()}"}),
                             chunk({}, "stop")])
    dsml = BY_NAME["dsml-sglang"]["content"].replace(
        ">pwd<", ">echo hi-from-dsml<").replace(
        "</｜DSML｜parameter>\n</｜DSML｜invoke>",
        "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"description\" string=\"true\">Print a "
        "greeting</｜DSML｜parameter>\n</｜DSML｜invoke>")
    text = "I'll run it.\n\n" + dsml
    return Reply(events=[chunk({"role": "assistant", "content": ""}),
                         *(chunk({"content": text[at:at + 23]}) for at in range(0, len(text), 23)),
                         chunk({}, "stop")])


@pytest.mark.claude_code
@pytest.mark.skipif(not os.access(CLAUDE_BIN, os.X_OK) and not os.environ.get("CI"),
                    reason="Claude Code not installed (make test installs it)")
def test_claude_code_runs_a_bash_call_deepseek_wrote_as_dsml(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(middle_model="deepseek-v4-flash")
    upstream.responder = dsml_bash_responder
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    tool_uses = [block for line in lines if line["type"] == "assistant"
                 for block in line["message"]["content"] if block["type"] == "tool_use"]
    assert [(t["name"], t["input"]) for t in tool_uses] == [
        ("Bash", {"command": "echo hi-from-dsml", "description": "Print a greeting"})]
    results = [block for line in lines if line["type"] == "user"
               for block in line["message"]["content"] if block.get("type") == "tool_result"]
    assert [result.get("is_error", False) for result in results] == [False]
    second = upstream.requests[1]
    assert second["messages"][-2]["tool_calls"][0]["function"] == {
        "name": "Bash",
        "arguments": '{"command":"echo hi-from-dsml","description":"Print a greeting"}'}
    assert second["messages"][-1]["content"].startswith("hi-from-dsml")
    assert lines[-1]["result"] == "It printed: hi-from-dsml"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2
