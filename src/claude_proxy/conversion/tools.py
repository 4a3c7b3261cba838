"""Anthropic tools and tool_choice → OpenAI functions.

Custom tools become functions. Server tools (`web_search_20250305`, `bash_20250124`, …) cannot
run on an OpenAI upstream and are dropped. Tools marked `defer_loading` are only shown to the
model once a `tool_reference` block in the conversation has loaded them, as the Anthropic API does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger("claude_proxy.conversion")

# Schema keys that describe the document rather than the arguments. `$schema` is dropped
# because several upstreams (Gemini behind OpenRouter, some vLLM guided-decoding backends)
# reject it, while no upstream needs it.
_SCHEMA_META_KEYS = ("$schema", "$id")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def is_server_tool(tool: dict[str, Any]) -> bool:
    """Server tools carry a dated `type` (web_search_20250305); custom tools have none."""
    kind = tool.get("type")
    return kind not in (None, "custom")


def referenced_tool_names(messages: Iterable[dict[str, Any]]) -> set[str]:
    """Names loaded by `tool_reference` blocks anywhere in the conversation."""
    names: set[str] = set()
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            inner = block.get("content") if block.get("type") == "tool_result" else [block]
            for item in inner if isinstance(inner, list) else []:
                if isinstance(item, dict) and item.get("type") == "tool_reference":
                    name = item.get("tool_name")
                    if isinstance(name, str):
                        names.add(name)
    return names


def clean_schema(schema: Any) -> dict[str, Any]:
    """An object JSON schema as upstreams accept it (tool parameters, structured outputs):
    document-level keys removed, `type` and `properties` present."""
    cleaned = dict(schema) if isinstance(schema, dict) else dict(_EMPTY_SCHEMA)
    for key in _SCHEMA_META_KEYS:
        cleaned.pop(key, None)
    cleaned.setdefault("type", "object")
    if cleaned.get("type") == "object":
        cleaned.setdefault("properties", {})
    return cleaned


def convert_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """One custom Anthropic tool as an OpenAI function."""
    parameters = clean_schema(tool.get("input_schema"))
    function: dict[str, Any] = {"name": tool["name"], "parameters": parameters}
    description = tool.get("description")
    if isinstance(description, str) and description:
        function["description"] = description
    return {"type": "function", "function": function}


def convert_tools(
    tools: list[dict[str, Any]] | None, loaded: set[str]
) -> list[dict[str, Any]]:
    """The OpenAI `tools` list: custom tools, minus server tools and unloaded deferred ones."""
    converted: list[dict[str, Any]] = []
    for tool in tools or []:
        name = tool.get("name")
        if is_server_tool(tool):
            logger.debug("dropping server tool %s (%s)", name, tool.get("type"))
            continue
        if not isinstance(name, str) or not name:
            logger.debug("dropping tool without a name")
            continue
        if tool.get("defer_loading") and name not in loaded:
            logger.debug("leaving out deferred tool %s until a tool_reference loads it", name)
            continue
        converted.append(convert_tool(tool))
    return converted


def convert_tool_choice(
    choice: dict[str, Any] | None, available: set[str]
) -> tuple[Any, bool | None]:
    """(`tool_choice`, `parallel_tool_calls`) for the upstream; None means leave it out."""
    if not isinstance(choice, dict):
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        name = choice.get("name")
        if isinstance(name, str) and name in available:
            return {"type": "function", "function": {"name": name}}, parallel
        logger.debug("tool_choice names %r, which is not sent upstream; using auto", name)
        return "auto", parallel
    return None, parallel
