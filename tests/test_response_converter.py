"""OpenAI chunks → Anthropic events: golden sequences, edge cases and every recorded transcript."""

from __future__ import annotations

import json
from typing import Any

import pytest

from claude_proxy.conversion.response_converter import (
    StreamConverter,
    collect_message,
    convert_chunks,
)
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.errors import ProxyError
from claude_proxy.upstream.chat_completions import ChatCompletionsParser
from claude_proxy.upstream.client import OpenAIClient
from tests.scripted_upstream import TRANSCRIPTS, chunk, load_transcript, transcript_chunks
from tests.sse_grammar import Event, accumulate, check_grammar

SIGNER = ThinkingSigner("test-secret")


def converter(model: str = "claude-sonnet-4-6", **options: Any) -> StreamConverter:
    """The converter the service builds for a Chat Completions upstream (`options` are the
    parser's)."""
    return StreamConverter(model, input_tokens=7, sign=SIGNER.sign, message_id="msg_test",
                           parser=ChatCompletionsParser(**options))


def run(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return convert_chunks(chunks, converter())


def checked(events: list[dict[str, Any]]) -> dict[str, Any]:
    wrapped = [Event(event["type"], event) for event in events]
    check_grammar(wrapped)
    return accumulate(wrapped)


def tool(index: int, *, id: str | None = None, name: str | None = None,
         args: str | None = None) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {}}
    if id is not None:
        fragment["id"] = id
        fragment["type"] = "function"
    if name is not None:
        fragment["function"]["name"] = name
    if args is not None:
        fragment["function"]["arguments"] = args
    return fragment


def test_golden_sequence_thinking_text_tool() -> None:
    events = run([
        chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chunk({"reasoning_content": "check."}),
        chunk({"content": "I'll list."}),
        chunk({"tool_calls": [tool(0, id="call_1", name="Bash", args="")]}),
        chunk({"tool_calls": [tool(0, args='{"command": ')]}),
        chunk({"tool_calls": [tool(0, args='"ls"}')]}),
        chunk({}, "tool_calls"),
        chunk(None, None, {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                           "prompt_tokens_details": {"cached_tokens": 60}}),
    ])
    signature = SIGNER.sign("Let me check.")
    assert events == [
        {"type": "message_start", "message": {
            "id": "msg_test", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-6", "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 7, "output_tokens": 0,
                                             "cache_creation_input_tokens": 0,
                                             "cache_read_input_tokens": 0}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "Let me "}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "check."}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": signature}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "text_delta", "text": "I'll list."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "call_1", "name": "Bash", "input": {}}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '{"command": '}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '"ls"}'}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"input_tokens": 40, "output_tokens": 20, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 60}},
        {"type": "message_stop"},
    ]
    assert SIGNER.verify("Let me check.", signature)


def test_tool_fragments_stream_as_they_arrive() -> None:
    conv = converter()
    conv.start()
    opened = conv.feed(chunk({"tool_calls": [tool(0, id="call_a", name="Read", args='{"pa')]}))
    assert [e["type"] for e in opened] == ["content_block_start", "content_block_delta"]
    assert opened[1]["delta"]["partial_json"] == '{"pa'
    more = conv.feed(chunk({"tool_calls": [tool(0, args='th": "x"}')]}))
    assert more == [{"type": "content_block_delta", "index": 0, "delta": {
        "type": "input_json_delta", "partial_json": 'th": "x"}'}}]


def test_parallel_interleaved_tool_calls_become_sequential_blocks() -> None:
    message = checked(run([
        chunk({"tool_calls": [tool(0, id="call_a", name="add", args='{"a": ')]}),
        chunk({"tool_calls": [tool(1, id="call_b", name="mul", args='{"x": ')]}),
        chunk({"tool_calls": [tool(0, args='1}')]}),
        chunk({"tool_calls": [tool(1, args='2}')]}),
        chunk({}, "tool_calls"),
    ]))
    assert [(b["id"], b["name"], b["input"]) for b in message["content"]] == [
        ("call_a", "add", {"a": 1}), ("call_b", "mul", {"x": 2})]
    assert message["stop_reason"] == "tool_use"


def test_same_index_new_id_opens_a_new_block_and_missing_id_is_generated() -> None:
    message = checked(run([
        chunk({"tool_calls": [tool(0, id="functions.add:0", name="add", args='{"a":1}')]}),
        chunk({"tool_calls": [tool(0, id="functions.mul:1", name="mul", args='{"b":2}')]}),
        chunk({"tool_calls": [{"function": {"name": "noid", "arguments": "{}"}}]}),
        chunk({}, "stop"),
    ]))
    ids = [block["id"] for block in message["content"]]
    assert ids[0] == "toolu_px" + b"functions.add:0".hex()
    assert ids[1] == "toolu_px" + b"functions.mul:1".hex()
    assert ids[2].startswith("toolu_") and len(ids[2]) == 30
    assert [b["input"] for b in message["content"]] == [{"a": 1}, {"b": 2}, {}]
    # finish_reason "stop" with tool calls emitted is still tool_use.
    assert message["stop_reason"] == "tool_use"


def test_tool_without_arguments_gets_an_empty_object() -> None:
    events = run([chunk({"tool_calls": [tool(0, id="c", name="now", args="")]}),
                  chunk({}, "tool_calls")])
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == [{"type": "input_json_delta", "partial_json": "{}"}]


def test_text_after_tool_call_opens_a_new_text_block() -> None:
    message = checked(run([
        chunk({"content": "Before."}),
        chunk({"tool_calls": [tool(0, id="c1", name="f", args="{}")]}),
        chunk({"content": " "}),
        chunk({"content": "After."}),
        chunk({}, "tool_calls"),
    ]))
    assert [(b["type"], b.get("text")) for b in message["content"]] == [
        ("text", "Before."), ("tool_use", None), ("text", " After.")]


def test_whitespace_between_tool_calls_does_not_open_a_block() -> None:
    message = checked(run([
        chunk({"tool_calls": [tool(0, id="c1", name="f", args="{}")]}),
        chunk({"content": " "}),
        chunk({"tool_calls": [tool(1, id="c2", name="g", args="{}")]}),
        chunk({}, "tool_calls"),
    ]))
    assert [b["type"] for b in message["content"]] == ["tool_use", "tool_use"]


def test_whitespace_only_answer_is_kept() -> None:
    message = checked(run([chunk({"content": "\n"}), chunk({}, "stop")]))
    assert message["content"] == [{"type": "text", "text": "\n"}]


def test_reasoning_after_text_opens_a_new_thinking_block() -> None:
    message = checked(run([
        chunk({"reasoning_content": "first"}),
        chunk({"content": "text"}),
        chunk({"reasoning_content": "second"}),
        chunk({"content": "more"}),
        chunk({}, "stop"),
    ]))
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in message["content"]] == [
        ("thinking", "first"), ("text", "text"), ("thinking", "second"), ("text", "more")]
    assert all(SIGNER.verify(b["thinking"], b["signature"])
               for b in message["content"] if b["type"] == "thinking")


@pytest.mark.parametrize(("finish", "stop_reason"), [
    ("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal"),
    ("tool_calls", "end_turn"), (None, "end_turn"), ("weird", "end_turn"),
])
def test_stop_reasons(finish: str | None, stop_reason: str) -> None:
    message = checked(run([chunk({"content": "x"}, finish)]))
    assert message["stop_reason"] == stop_reason


def test_usage_estimated_when_upstream_sends_none() -> None:
    message = checked(run([chunk({"content": "x" * 41}), chunk({}, "stop")]))
    assert message["usage"]["output_tokens"] == 11
    assert message["usage"]["input_tokens"] == 7


def test_usage_adds_reasoning_tokens_counted_apart() -> None:
    # xAI reports reasoning outside completion_tokens (total = prompt + completion + reasoning)
    usage = {"prompt_tokens": 10, "completion_tokens": 27, "total_tokens": 350,
             "completion_tokens_details": {"reasoning_tokens": 313}}
    message = checked(run([chunk({"content": "x"}, "stop"), chunk(None, None, usage)]))
    assert message["usage"]["output_tokens"] == 340


def test_error_object_in_stream_raises_and_fail_closes_open_blocks() -> None:
    conv = converter()
    conv.start()
    conv.feed(chunk({"reasoning_content": "thinking..."}))
    with pytest.raises(ProxyError) as raised:
        conv.feed({"error": {"message": "provider overloaded", "code": 503}})
    assert raised.value.status == 503
    events = conv.fail(raised.value)
    assert [e["type"] for e in events] == ["content_block_delta", "content_block_stop", "error"]
    assert events[0]["delta"]["type"] == "signature_delta"
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error",
                                                     "message": "provider overloaded"}}


def test_buffered_completion_gives_the_same_events_as_a_stream() -> None:
    completion = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "reasoning_content": "think", "content": "text",
        "tool_calls": [{"id": "call_z", "type": "function",
                        "function": {"name": "f", "arguments": '{"k":1}'}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    buffered = convert_chunks(OpenAIClient._generate_buffered_stream_chunks(completion),
                              converter())
    streamed = run([
        chunk({"role": "assistant", "reasoning_content": "think"}),
        chunk({"content": "text"}),
        chunk({"tool_calls": [{"index": 0, "id": "call_z", "type": "function",
                               "function": {"name": "f", "arguments": '{"k":1}'}}]}),
        chunk({}, "tool_calls", {"prompt_tokens": 5, "completion_tokens": 3,
                                 "total_tokens": 8}),
    ])
    assert buffered == streamed
    message = collect_message(buffered)
    assert message["content"] == [
        {"type": "thinking", "thinking": "think", "signature": SIGNER.sign("think")},
        {"type": "text", "text": "text"},
        {"type": "tool_use", "id": "call_z", "name": "f", "input": {"k": 1}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 5 and message["usage"]["output_tokens"] == 3


# ---------------------------------------------------------------- recorded transcripts


def reasoning_text(delta: dict[str, Any]) -> str:
    """The oracle's reading of a delta's reasoning: the first non-empty dialect field."""
    for value in (delta.get("reasoning_content"), delta.get("reasoning"), delta.get("thinking")):
        if isinstance(value, dict):
            value = value.get("content") or value.get("text")
        if isinstance(value, str) and value:
            return value
    details = delta.get("reasoning_details")
    return "".join(item.get("text") or item.get("summary") or "" for item in details
                   if isinstance(item, dict)) if isinstance(details, list) else ""


def expected_from_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """An independent oracle: reasoning and content concatenated, tool calls grouped by
    index (a new id at a used index starts a new call), whitespace-only text runs between
    other output dropped."""
    reasoning, segments, calls = [], [[]], []  # type: ignore[var-annotated]
    by_index: dict[int, dict[str, Any]] = {}
    for data in chunks:
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = reasoning_text(delta)
            if piece:
                reasoning.append(piece)
                segments.append([])
            if delta.get("content"):
                segments[-1].append(delta["content"])
            for fragment in delta.get("tool_calls") or []:
                index = fragment.get("index", 0)
                fid = fragment.get("id") or ""
                current = by_index.get(index)
                if current is None or (fid and current["id"] and fid != current["id"]):
                    current = {"id": fid, "name": "", "args": ""}
                    by_index[index] = current
                    calls.append(current)
                function = fragment.get("function") or {}
                current["name"] = current["name"] or function.get("name") or ""
                current["args"] += function.get("arguments") or ""
                segments.append([])
    texts = ["".join(s) for s in segments]
    text = "".join(t for t in texts if not t.isspace())
    return {"thinking": "".join(reasoning), "text": text,
            "tools": [(c["name"], json.loads(c["args"] or "{}")) for c in calls]}


STREAM_STEMS = sorted(p.stem for p in TRANSCRIPTS.glob("*.json")
                      if load_transcript(p.stem).get("stream", True))
JSON_STEMS = sorted(p.stem for p in TRANSCRIPTS.glob("*.json")
                    if not load_transcript(p.stem).get("stream", True))


@pytest.mark.parametrize("stem", STREAM_STEMS)
def test_recorded_stream_converts_exactly(stem: str) -> None:
    chunks = transcript_chunks(stem)
    message = checked(run(chunks))
    expected = expected_from_chunks(chunks)
    thinking = "".join(b["thinking"] for b in message["content"] if b["type"] == "thinking")
    text = "".join(b["text"] for b in message["content"] if b["type"] == "text")
    tools = [(b["name"], b["input"]) for b in message["content"] if b["type"] == "tool_use"]
    assert thinking == expected["thinking"]
    assert text == expected["text"]
    assert tools == expected["tools"]
    assert message["stop_reason"] == ("tool_use" if tools else message["stop_reason"])


@pytest.mark.parametrize("stem", JSON_STEMS)
def test_recorded_json_reply_converts_exactly(stem: str) -> None:
    body = load_transcript(stem)["body"]
    message = collect_message(convert_chunks(
        OpenAIClient._generate_buffered_stream_chunks(body), converter()))
    source = body["choices"][0]["message"]
    blocks = message["content"]
    reasoning = source.get("reasoning_content") or source.get("reasoning") or ""
    thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    assert thinking == ([reasoning] if reasoning else [])
    assert [b["text"] for b in blocks if b["type"] == "text"] == (
        [source["content"]] if source.get("content") else [])
    assert [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in source.get("tool_calls") or []]
    assert message["usage"]["output_tokens"] == body["usage"]["completion_tokens"] or (
        message["usage"]["output_tokens"] > body["usage"]["completion_tokens"])
