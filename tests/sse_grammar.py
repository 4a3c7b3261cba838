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
}


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
            if open_block["type"] == "tool_use":
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
            assert data["delta"]["stop_reason"] in {
                "end_turn", "max_tokens", "tool_use", "stop_sequence", "refusal"}
            usage = data["usage"]
            assert isinstance(usage["output_tokens"], int) and isinstance(
                usage["input_tokens"], int)
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
            if block["type"] == "tool_use":
                block["input"] = json.loads(partial.get(data["index"], "") or "{}")
        elif event.name == "message_delta":
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
        elif event.name == "error":
            message["error"] = data["error"]
    return message
