"""The conversation as the GenAI conventions' opt-in attributes (`gen_ai.input.messages`,
`gen_ai.output.messages`, `gen_ai.system_instructions`), recorded only when
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true, and redacted as the dashboard's
bodies are (logs.redact)."""

from __future__ import annotations

from typing import Any

import orjson
from opentelemetry.util.types import AttributeValue

from claude_proxy.logs import redact
from claude_proxy.record import RequestRecord


def conversation(record: RequestRecord, answer: dict[str, Any],
                 secrets: list[str]) -> dict[str, AttributeValue]:
    """The conversation as the GenAI conventions' JSON attributes, secrets redacted as the
    dashboard redacts its bodies (logs.redact)."""
    body = record.client_request() or {}
    found: dict[str, AttributeValue] = {}
    system = body.get("system")
    if system:
        found["gen_ai.system_instructions"] = as_json(parts_of(system), secrets)
    messages = body.get("messages")
    if isinstance(messages, list):
        found["gen_ai.input.messages"] = as_json(
            [{"role": message.get("role"), "parts": parts_of(message.get("content"))}
             for message in messages if isinstance(message, dict)], secrets)
    if answer:
        found["gen_ai.output.messages"] = as_json(
            [{"role": "assistant", "parts": parts_of(answer.get("content")),
              "finish_reason": answer.get("stop_reason")}], secrets)
    return found


def parts_of(content: Any) -> list[dict[str, Any]]:
    """Anthropic content blocks as the conventions' message parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking", "")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"),
                          "response": block.get("content")})
        else:
            parts.append({"type": str(kind)})
    return parts


def as_json(value: Any, secrets: list[str]) -> str:
    return redact(orjson.dumps(value, default=str).decode(), secrets)
