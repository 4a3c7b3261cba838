"""Replies built from whole content blocks (the server-tool flows: web search, tool search),
and their stream events: pure functions.

`block_events` renders a whole block the way Anthropic streams it and the way Claude Code's
accumulator reads it: `server_tool_use` and `tool_use` start with `input: {}` and carry the
input in one `input_json_delta`; text and thinking start empty and arrive through deltas; a
result block (`web_search_tool_result`, `tool_search_tool_result`) comes whole in its
`content_block_start` (there are no deltas for it).
"""

from __future__ import annotations

import secrets
import string
from typing import Any

import orjson

Event = dict[str, Any]
Block = dict[str, Any]

_ALPHABET = string.ascii_letters + string.digits


def new_server_tool_id() -> str:
    return "srvtoolu_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def text_block(text: str) -> Block:
    return {"type": "text", "text": text}


def block_events(index: int, block: Block) -> list[Event]:
    """One whole block as Anthropic streams it."""
    kind = block["type"]
    if kind in ("server_tool_use", "tool_use"):
        start: Block = {**block, "input": {}}
        given = block.get("input")  # a string: the text of a call that is no JSON object
        text = given if isinstance(given, str) else orjson.dumps(given or {}).decode()
        deltas = [{"type": "input_json_delta", "partial_json": text}]
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block.get("signature", "")}]
    else:
        start, deltas = block, []
    return [{"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": delta}
              for delta in deltas),
            {"type": "content_block_stop", "index": index}]


def message_start(message_id: str, model: str, input_tokens: int) -> Event:
    return {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}


def message_end(stop_reason: str, usage: dict[str, Any]) -> list[Event]:
    return [{"type": "message_delta", "delta": {"stop_reason": stop_reason,
                                                "stop_sequence": None}, "usage": usage},
            {"type": "message_stop"}]


def message(message_id: str, model: str, content: list[Block], stop_reason: str,
            usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": usage}
