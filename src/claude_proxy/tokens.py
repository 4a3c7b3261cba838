"""A tokenizer-free estimate of a request's input tokens (count_tokens and message_start).

Claude Code only needs a number close enough to manage its context window; about four
characters a token is the usual rule. Images and documents count a fixed amount each. What is
counted is what the translation sends: system, messages, tools, and a structured-output schema
(sent as `response_format`, or in the system prompt where the upstream refuses that).
"""

from __future__ import annotations

from typing import Any

import orjson

from claude_proxy.conversion.structured import requested_schema, schema_instruction
from claude_proxy.conversion.usage import estimate_tokens

TOKENS_PER_MEDIA_BLOCK = 1600
_SKIPPED_KEYS = frozenset({"type", "id", "tool_use_id", "signature", "cache_control", "data",
                           "media_type"})


def estimate_request_tokens(request: dict[str, Any]) -> int:
    characters = _characters(request.get("system"))
    media = 0
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            characters += _characters(message.get("content"))
            media += _media_blocks(message.get("content"))
    tools = request.get("tools")
    if tools:
        characters += len(orjson.dumps(tools))
    schema = requested_schema(request)
    if schema is not None:
        characters += len(schema_instruction(schema))
    return estimate_tokens(characters) + media * TOKENS_PER_MEDIA_BLOCK


def _characters(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_characters(item) for item in value)
    if isinstance(value, dict):
        return sum(_characters(item) if key != "input" else len(orjson.dumps(item))
                   for key, item in value.items() if key not in _SKIPPED_KEYS)
    return 0


def _media_blocks(value: Any) -> int:
    if isinstance(value, list):
        return sum(_media_blocks(item) for item in value)
    if isinstance(value, dict):
        own = 1 if value.get("type") in ("image", "document") else 0
        return own + _media_blocks(value.get("content"))
    return 0
