"""Structured outputs: the client's JSON schema (`output_config.format`, or the older beta
`output_format`) → the upstream's `response_format` (pure functions).

Three modes, from best to most widely accepted; a provider that refuses one is sent the next
(see `capabilities.structured_mode`):

- `json_schema`: `response_format: {type: json_schema, json_schema: {name, schema, strict}}`,
  the upstream constrains decoding to the schema;
- `json_object`: `response_format: {type: json_object}` plus the schema in the system prompt;
- `prompt`: the schema in the system prompt only.

Whatever the mode, the upstream's text is the JSON and goes back to the client as the text
block, which is what the SDKs parse.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from claude_proxy.conversion.tools import clean_schema

StructuredMode = Literal["json_schema", "json_object", "prompt"]
SCHEMA_NAME = "response"


def requested_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the client wants the answer to follow, if any."""
    config = request.get("output_config")
    for holder in (config.get("format") if isinstance(config, dict) else None,
                   request.get("output_format")):
        if (isinstance(holder, dict) and holder.get("type") == "json_schema"
                and isinstance(holder.get("schema"), dict)):
            schema: dict[str, Any] = holder["schema"]
            return schema
    return None


def schema_instruction(schema: dict[str, Any]) -> str:
    """The system-prompt text that asks for the schema when the upstream cannot enforce it."""
    return ("Answer with a single JSON object that matches this JSON schema, and nothing "
            "else: no prose, no code fences.\nJSON schema: "
            + orjson.dumps(clean_schema(schema)).decode())


def apply_structured_output(body: dict[str, Any], schema: dict[str, Any],
                            mode: StructuredMode) -> None:
    """Ask the upstream for `schema` in `mode` (edits the upstream body in place)."""
    if mode == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": SCHEMA_NAME, "schema": clean_schema(schema), "strict": True}}
        return
    if mode == "json_object":
        body["response_format"] = {"type": "json_object"}
    _add_to_system_prompt(body["messages"], schema_instruction(schema))


def apply_responses_structured_output(body: dict[str, Any], request: dict[str, Any]) -> None:
    """The Responses API's spelling: `text.format` (beside `text.verbosity`, if any). Its
    models (OpenAI's reasoning models) all take `json_schema`, so there is no step-down."""
    schema = requested_schema(request)
    if schema is None:
        return
    text = dict(body.get("text") or {})
    text["format"] = {"type": "json_schema", "name": SCHEMA_NAME,
                      "schema": clean_schema(schema), "strict": True}
    body["text"] = text


def _add_to_system_prompt(messages: list[dict[str, Any]], text: str) -> None:
    """Appended to the leading system message (a string, or parts kept for prompt caching),
    or as one; never a second system message, which some chat templates refuse."""
    first = messages[0] if messages else None
    if first is None or first.get("role") != "system":
        messages.insert(0, {"role": "system", "content": text})
    elif isinstance(first.get("content"), list):
        first["content"] = [*first["content"], {"type": "text", "text": text}]
    else:
        first["content"] = f"{first.get('content') or ''}\n\n{text}"
