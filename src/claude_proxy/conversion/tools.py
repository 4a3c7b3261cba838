"""Anthropic tools and tool_choice → OpenAI functions.

Custom tools become functions. Server tools (`web_search_20250305`, `bash_20250124`, …) cannot
run on an OpenAI upstream and are dropped. Tools marked `defer_loading` are only shown to the
model once a `tool_reference` block in the conversation has loaded them, as the Anthropic API does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from claude_proxy.conversion.census import holds

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


def referenced_tool_names(messages: list[dict[str, Any]]) -> set[str]:
    """Names loaded by `tool_reference` blocks anywhere in the conversation (in a message,
    or in a tool result). Every request asks, and most hold none (`census`)."""
    names: set[str] = set()
    if not holds(messages, "tool_reference"):
        return names
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    names.update(_reference_names(inner))
            elif kind == "tool_reference":
                names.update(_reference_names((block,)))
    return names


def _reference_names(blocks: Iterable[Any]) -> Iterator[str]:
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_reference":
            name = block.get("tool_name")
            if isinstance(name, str):
                yield name


def expand_tool_references(request: dict[str, Any]) -> dict[str, Any]:
    """The request with each `tool_reference` turned into what Claude Code's ToolSearch
    promises the model: the found tools' definitions as a `<functions>` block, one
    `<function>{"description": …, "name": …, "parameters": …}</function>` line each (the
    encoding of the tool list at the top of the prompt). The tools found are loaded: their
    `defer_loading` is dropped, so they stay declared in `tools` (hosted APIs and
    grammar-constrained servers cannot call an undeclared tool). The client's request is not
    changed; without references it is returned as it is."""
    messages = request.get("messages") or []
    loaded = referenced_tool_names(messages)
    if not loaded:
        return request
    tools = [tool for tool in request.get("tools") or [] if isinstance(tool, dict)]
    known = {tool["name"]: tool for tool in tools
             if not is_server_tool(tool) and isinstance(tool.get("name"), str)}
    return {**request,
            "tools": [{k: v for k, v in tool.items() if k != "defer_loading"}
                      if tool.get("name") in loaded else tool for tool in tools],
            "messages": [_expanded_message(message, known) for message in messages]}


def functions_block(names: list[str], known: dict[str, dict[str, Any]]) -> str:
    """The `<functions>` block for some found tools (a name nobody declared is said so)."""
    lines = ["<functions>"]
    for name in names:
        tool = known.get(name)
        if tool is None:
            lines.append(f"<!-- no tool named {name} is declared -->")
            continue
        definition = {"description": tool.get("description") or "", "name": name,
                      "parameters": clean_schema(tool.get("input_schema"))}
        lines.append(f"<function>{json.dumps(definition, ensure_ascii=False)}</function>")
    lines.append("</functions>")
    return "\n".join(lines)


def _expanded_message(message: Any, known: dict[str, dict[str, Any]]) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not any(_holds_references(b) for b in content):
        return message
    blocks = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result" and isinstance(
                block.get("content"), list):
            block = {**block, "content": _expanded_blocks(block["content"], known)}
        blocks.append(block)
    return {**message, "content": _expanded_blocks(blocks, known)}


def _holds_references(block: Any) -> bool:
    if not isinstance(block, dict):
        return False
    inner = block.get("content") if block.get("type") == "tool_result" else [block]
    return isinstance(inner, list) and any(
        isinstance(item, dict) and item.get("type") == "tool_reference" for item in inner)


def _expanded_blocks(blocks: list[Any], known: dict[str, dict[str, Any]]) -> list[Any]:
    """The blocks with their tool_reference blocks as one `<functions>` text block, where the
    first of them was."""
    names = [str(b.get("tool_name", "")) for b in blocks
             if isinstance(b, dict) and b.get("type") == "tool_reference"]
    if not names:
        return blocks
    expanded: list[Any] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_reference":
            if names:
                expanded.append({"type": "text", "text": functions_block(names, known)})
                names = []
            continue
        expanded.append(block)
    return expanded


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


def convert_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The OpenAI `tools` list: custom tools, minus server tools and deferred ones (those a
    `tool_reference` loads have lost `defer_loading` in `expand_tool_references`)."""
    converted: list[dict[str, Any]] = []
    for tool in tools or []:
        name = tool.get("name")
        if is_server_tool(tool):
            logger.debug("dropping server tool %s (%s)", name, tool.get("type"))
            continue
        if not isinstance(name, str) or not name:
            logger.debug("dropping tool without a name")
            continue
        if tool.get("defer_loading"):
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
