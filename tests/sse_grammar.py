"""A strict reader of the proxy's SSE output: it parses the bytes and checks the Anthropic
stream grammar event by event (what Claude Code's own accumulator enforces)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DELTA_FOR_BLOCK = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
    "server_tool_use": {"input_json_delta"},
    "web_search_tool_result": set(),
    "tool_search_tool_result": set(),
}
"""The deltas each block type may have (result blocks come whole in their start)."""


@dataclass
class Event:
    name: str
    data: dict[str, Any]


def parse_sse(raw: bytes) -> list[Event]:
    """Events from raw SSE bytes; every event must have a name and one JSON data line."""
    text = raw.decode("utf-8")
    assert "\r" not in text, "events are separated by plain newlines"
    events: list[Event] = []
    for frame in text.split("\n\n"):
        lines = [line for line in frame.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields: dict[str, list[str]] = {}
        for line in lines:
            name, _, value = line.partition(": ")
            fields.setdefault(name, []).append(value)
        assert set(fields) == {"event", "data"}, f"unexpected SSE fields in {frame!r}"
        assert len(fields["event"]) == 1 and len(fields["data"]) == 1, frame
        data = json.loads(fields["data"][0])
        assert data["type"] == fields["event"][0], "event name must equal data.type"
        events.append(Event(fields["event"][0], data))
    return events


def check_grammar(events: list[Event]) -> None:
    """message_start, then strictly sequential blocks indexed 0..n-1 whose deltas match their
    type, then message_delta and message_stop — or, after closing every block, one error."""
    names = [event.name for event in events if event.name != "ping"]
    assert names and names[0] == "message_start", names[:3]
    message = events[0].data["message"]
    for key in ("id", "model", "usage"):
        assert key in message
    assert isinstance(message["usage"]["input_tokens"], int)
    open_block: dict[str, Any] | None = None
    next_index = 0
    ended = False
    for event in events[1:]:
        assert not ended, f"event after the end: {event.name}"
        data = event.data
        if event.name == "ping":
            continue
        if event.name == "content_block_start":
            assert open_block is None, "a block opened before the previous one closed"
            assert data["index"] == next_index
            open_block = data["content_block"]
            assert open_block["type"] in DELTA_FOR_BLOCK
            if open_block["type"] == "text":
                assert open_block["text"] == ""
            if open_block["type"] in ("tool_use", "server_tool_use"):
                assert open_block["input"] == {} and open_block["id"] and open_block["name"]
            next_index += 1
        elif event.name == "content_block_delta":
            assert open_block is not None and data["index"] == next_index - 1
            delta_type = data["delta"]["type"]
            assert delta_type in DELTA_FOR_BLOCK[open_block["type"]], delta_type
            for value in data["delta"].values():
                assert isinstance(value, str)
        elif event.name == "content_block_stop":
            assert open_block is not None and data["index"] == next_index - 1
            open_block = None
        elif event.name == "message_delta":
            assert open_block is None
            check_message_delta(data)
        elif event.name == "message_stop":
            assert names[-2] == "message_delta"
            ended = True
        elif event.name == "error":
            assert open_block is None, "error sent while a block was open"
            assert data["error"]["type"] and data["error"]["message"]
            ended = True
        else:
            raise AssertionError(f"unknown event {event.name}")
    assert ended, "stream did not end with message_stop or error"


DELTA_FIELDS = {"stop_reason", "stop_sequence", "stop_details", "safeguard_results"}
MESSAGE_DELTA_FIELDS = {"type", "delta", "usage", "context_management"}
SAFEGUARD_STATUSES = {"available", "unsupported", "unavailable"}
CALL_STATUSES = {"evaluated", "skipped", "unavailable"}


def check_message_delta(data: dict[str, Any]) -> None:
    """The final message_delta: known fields only, each in Anthropic's shape (`stop_details`
    exactly with a refusal; `safeguard_results` as Claude Code parses it; `context_management`
    beside `delta`, as the SDKs' `BetaRawMessageDeltaEvent` has it)."""
    assert set(data) <= MESSAGE_DELTA_FIELDS, set(data) - MESSAGE_DELTA_FIELDS
    delta = data["delta"]
    assert set(delta) <= DELTA_FIELDS, set(delta) - DELTA_FIELDS
    assert delta["stop_reason"] in {
        "end_turn", "max_tokens", "tool_use", "stop_sequence", "refusal"}
    assert ("stop_details" in delta) == (delta["stop_reason"] == "refusal")
    if "stop_details" in delta:
        assert delta["stop_details"]["type"] == "refusal"
    for result in delta.get("safeguard_results", []):
        assert result["type"] == "dangerous_tool_use"
        status = result["status"]
        assert status["type"] in SAFEGUARD_STATUSES
        if status["type"] == "unavailable":
            assert status["reason"] in {"disabled", "error", "rate_limited", "input_too_long"}
        for call in status.get("tool_uses", {}).values():
            assert call["type"] in CALL_STATUSES
            if call["type"] == "evaluated":
                assert call["outcome"] in {"flagged", "not_flagged"}
    if "context_management" in data:
        for edit in data["context_management"]["applied_edits"]:
            assert edit["type"] in {"clear_tool_uses_20250919", "clear_thinking_20251015"}
            assert isinstance(edit["cleared_input_tokens"], int)
    usage = data["usage"]
    assert isinstance(usage["output_tokens"], int) and isinstance(usage["input_tokens"], int)


def accumulate(events: list[Event]) -> dict[str, Any]:
    """The final message: content blocks with their full text / thinking / parsed input."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for event in events:
        data = event.data
        if event.name == "message_start":
            message = {**data["message"], "content": []}
        elif event.name == "content_block_start":
            message["content"].append(dict(data["content_block"]))
        elif event.name == "content_block_delta":
            block = message["content"][data["index"]]
            delta = data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif event.name == "content_block_stop":
            block = message["content"][data["index"]]
            if block["type"] in ("tool_use", "server_tool_use"):
                block["input"] = json.loads(partial.get(data["index"], "") or "{}")
        elif event.name == "message_delta":
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
            message.update((k, v) for k, v in data.items() if k not in ("type", "delta", "usage"))
        elif event.name == "error":
            message["error"] = data["error"]
    return message
