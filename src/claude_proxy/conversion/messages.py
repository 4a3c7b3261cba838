"""Anthropic system prompt and messages → OpenAI chat messages.

One Anthropic user turn can become several OpenAI messages: a `tool` message per `tool_result`
(these must directly follow the assistant's tool calls), then one `user` message with the rest.
Block types the upstream cannot take are turned into text or dropped with a DEBUG log, never
rejected.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from claude_proxy.conversion.ids import to_upstream_id

logger = logging.getLogger("claude_proxy.conversion")

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
TEXT_SEPARATOR = "\n\n"

Part = dict[str, Any]


# ---------------------------------------------------------------- system


def convert_system(system: Any) -> str | None:
    """The system prompt as one string, without the per-conversation billing header.

    Claude Code's `x-anthropic-billing-header` block changes with every conversation, so
    forwarding it would defeat the upstream's prompt-prefix cache.
    """
    if isinstance(system, str):
        return system or None
    texts = [text for text in _block_texts(system) if not _is_billing_header(text)]
    return TEXT_SEPARATOR.join(texts) or None


def system_parts(system: Any) -> str | list[Part] | None:
    """The system prompt as text parts, one per block, each keeping the client's
    `cache_control` (for upstreams that take breakpoints); billing header left out too."""
    if isinstance(system, str):
        return system or None
    parts = [part for part in text_parts(system) if not _is_billing_header(part["text"])]
    return parts or None


def text_parts(blocks: Any) -> list[Part]:
    """The text blocks of some content as text parts, with their `cache_control`."""
    if isinstance(blocks, str):
        return [_text_part(blocks)] if blocks else []
    parts: list[Part] = []
    for block in blocks or []:
        if isinstance(block, dict) and isinstance(block.get("text"), str) and block["text"]:
            parts.append(_marked([_text_part(block["text"])], block)[0])
    return parts


def _marked(parts: list[Part], block: dict[str, Any]) -> list[Part]:
    """The client's `cache_control` of a block, copied onto the last part made from it (a
    breakpoint marks the end of a block). The caching layer decides what is sent."""
    marker = block.get("cache_control")
    if parts and isinstance(marker, dict):
        parts[-1]["cache_control"] = dict(marker)
    return parts


def marker_of(parts: list[Part]) -> dict[str, Any] | None:
    """The breakpoint of the last marked part, if any."""
    for part in reversed(parts):
        if isinstance(part.get("cache_control"), dict):
            return dict(part["cache_control"])
    return None


def tool_reference_text(block: dict[str, Any]) -> str:
    """What a `tool_reference` block (a tool loaded by tool search) says to an upstream
    that has no such block."""
    return f"Tool {block.get('tool_name', '')} is now available."


def is_billing_header(block: Any) -> bool:
    """Claude Code's per-conversation `x-anthropic-billing-header` system block."""
    return (isinstance(block, dict) and isinstance(block.get("text"), str)
            and _is_billing_header(block["text"]))


def _is_billing_header(text: str) -> bool:
    return text.lstrip().startswith(BILLING_HEADER_PREFIX)


def _block_texts(blocks: Any) -> list[str]:
    if isinstance(blocks, str):
        return [blocks] if blocks else []
    texts: list[str] = []
    for block in blocks or []:
        if isinstance(block, dict):
            text = block.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
    return texts


# ---------------------------------------------------------------- parts


def image_part(source: Any) -> Part | None:
    """An Anthropic image source as an OpenAI `image_url` part."""
    if not isinstance(source, dict):
        return None
    kind = source.get("type")
    if kind == "base64":
        media_type = source.get("media_type") or "image/png"
        url = f"data:{media_type};base64,{source.get('data', '')}"
    elif kind == "url":
        url = str(source.get("url", ""))
    else:
        logger.debug("image source %r cannot be sent upstream; dropped", kind)
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def document_parts(block: dict[str, Any]) -> list[Part]:
    """A `document` block: text sources become text, PDFs an OpenAI `file` part."""
    source = block.get("source") or {}
    title = block.get("title")
    kind = source.get("type") if isinstance(source, dict) else None
    parts: list[Part] = []
    if kind == "text":
        parts.append(_text_part(_titled(title, str(source.get("data", "")))))
    elif kind == "content":
        parts.extend(content_parts(source.get("content"), context="document"))
    elif kind == "base64" and str(source.get("media_type", "")).startswith("text/"):
        parts.append(_text_part(_titled(title, _decode_base64_text(source.get("data")))))
    elif kind == "base64":
        media_type = source.get("media_type") or "application/pdf"
        filename = title if isinstance(title, str) and title else "document.pdf"
        file_data = f"data:{media_type};base64,{source.get('data', '')}"
        parts.append({"type": "file", "file": {"filename": filename, "file_data": file_data}})
    elif kind == "url":
        parts.append(_text_part(_titled(title, f"Document: {source.get('url', '')}")))
    else:
        logger.debug("document source %r cannot be sent upstream; dropped", kind)
    return parts


def _titled(title: Any, text: str) -> str:
    return f"{title}\n\n{text}" if isinstance(title, str) and title else text


def _decode_base64_text(data: Any) -> str:
    try:
        return base64.b64decode(str(data or "")).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return ""


def _text_part(text: str) -> Part:
    return {"type": "text", "text": text}


def content_parts(content: Any, *, context: str) -> list[Part]:
    """Anthropic content (string or blocks) as OpenAI parts: text, image_url and file."""
    if isinstance(content, str):
        return [_text_part(content)] if content else []
    parts: list[Part] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        parts.extend(_block_parts(block, context))
    return parts


def _block_parts(block: dict[str, Any], context: str) -> list[Part]:
    return _marked(_unmarked_block_parts(block, context), block)


def _unmarked_block_parts(block: dict[str, Any], context: str) -> list[Part]:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return [_text_part(text)] if isinstance(text, str) and text else []
    if kind == "image":
        part = image_part(block.get("source"))
        return [part] if part else []
    if kind == "document":
        return document_parts(block)
    if kind == "search_result":
        return [_text_part(_search_result_text(block))]
    if kind == "tool_reference":
        return [_text_part(tool_reference_text(block))]
    if kind == "web_search_tool_result":
        return [_text_part(_web_search_text(block))]
    if kind in ("thinking", "redacted_thinking", "tool_use", "tool_result", "server_tool_use"):
        logger.debug("%s block inside %s content dropped", kind, context)
        return []
    return _unknown_block_parts(block, context)


def _unknown_block_parts(block: dict[str, Any], context: str) -> list[Part]:
    for key in ("text", "content"):
        value = block.get(key)
        if isinstance(value, str) and value:
            logger.debug("unknown %s block %r sent as text", context, block.get("type"))
            return [_text_part(value)]
    logger.debug("unknown %s block %r dropped", context, block.get("type"))
    return []


def _search_result_text(block: dict[str, Any]) -> str:
    body = "\n".join(_block_texts(block.get("content")))
    return f"Search result: {block.get('title', '')} ({block.get('source', '')})\n{body}"


def _web_search_text(block: dict[str, Any]) -> str:
    results = block.get("content")
    if not isinstance(results, list):
        return "Web search returned no results."
    lines = [f"- {item.get('title', '')} ({item.get('url', '')})"
             for item in results if isinstance(item, dict)]
    return "Web search results:\n" + "\n".join(lines)


def user_content(parts: list[Part], keep_parts: bool = False) -> str | list[Part]:
    """Text-only content as one string (every upstream takes that), otherwise the parts.

    With `keep_parts` (an upstream that takes breakpoints) several blocks stay separate parts
    on every turn, and a single marked one becomes a one-part array (rendered like the string
    it is on later turns), so the marker stays on the part the client marked."""
    if len(parts) == 1 and parts[0]["type"] == "text" and "cache_control" not in parts[0]:
        return str(parts[0]["text"])  # most turns: its text itself, not a copy made by a join
    text_only = all(part["type"] == "text" for part in parts)
    if keep_parts and text_only and (len(parts) > 1 or marker_of(parts) is not None):
        return parts
    if text_only:
        return TEXT_SEPARATOR.join(part["text"] for part in parts)
    return parts


# ---------------------------------------------------------------- turns


def convert_user_turn(content: Any, keep_parts: bool = False) -> list[dict[str, Any]]:
    """One Anthropic user turn as tool messages followed by at most one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    tool_images: list[Part] = []
    parts: list[Part] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            output = block.get("content")
            if type(output) is str and "cache_control" not in block \
                    and not block.get("is_error"):
                # Most blocks of a long conversation: a tool's text output, unmarked, as
                # `tool_result_message` would give it (converted again on every request,
                # so built here without building parts).
                tool_messages.append({"role": "tool", "tool_call_id":
                                      to_upstream_id(str(block.get("tool_use_id", ""))),
                                      "content": output})
                continue
            message, images = tool_result_message(block, keep_parts)
            tool_messages.append(message)
            if images:
                tool_images.extend(images)
        else:
            parts.extend(_block_parts(block, "user"))
    if tool_images:
        parts = tool_images + parts
    if parts:
        return [*tool_messages, {"role": "user", "content": user_content(parts, keep_parts)}]
    if not tool_messages:
        # An empty user turn still has a place in the conversation.
        return [{"role": "user", "content": ""}]
    return tool_messages


def tool_result_message(block: dict[str, Any],
                        keep_parts: bool = False) -> tuple[dict[str, Any], list[Part]]:
    """A `tool_result` as an OpenAI tool message; its images go to a following user message.

    Tool messages only carry text on most upstreams, so images are moved out, announced by a
    line that names the call they came from. A marked result (with `keep_parts`) is one text
    part carrying the breakpoint: the same text as the string form of later turns.
    """
    call_id = to_upstream_id(str(block.get("tool_use_id", "")))
    parts = content_parts(block.get("content"), context="tool_result")
    texts = [part["text"] for part in parts if part["type"] == "text"]
    media = [part for part in parts if part["type"] != "text"]
    text = "\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    images: list[Part] = []
    if media:
        images = [_text_part(f"Content returned by tool call {call_id}:"), *media]
    marker = marker_of(_marked([_text_part(text)], block)) or marker_of(parts)
    if keep_parts and marker is not None:
        return {"role": "tool", "tool_call_id": call_id,
                "content": [{**_text_part(text), "cache_control": marker}]}, images
    return {"role": "tool", "tool_call_id": call_id, "content": text}, images


@dataclass(slots=True)
class AssistantTurn:
    """An assistant turn in OpenAI form, with the thinking blocks it carried."""

    message: dict[str, Any] | None
    thinking: list[dict[str, Any]] = field(default_factory=list)


def convert_assistant_turn(content: Any, keep_parts: bool = False) -> AssistantTurn:
    """Text and tool_use blocks become one assistant message; thinking is set aside (for
    the reasoning layer to pass back)."""
    if isinstance(content, str):
        return AssistantTurn({"role": "assistant", "content": content})
    said: str | None = None
    tool_calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_use":
            tool_calls.append(tool_call(block))
        elif kind == "text" and said is None and "cache_control" not in block:
            text = block.get("text")
            if isinstance(text, str) and text:
                said = text
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:  # a second text, a marked one, a document, a server tool's block: as parts
            return _assistant_parts_turn(content, keep_parts)
    return _assistant_turn(said, tool_calls, thinking)


def _assistant_turn(said: str | list[Part] | None, tool_calls: list[dict[str, Any]],
                    thinking: list[dict[str, Any]]) -> AssistantTurn:
    """The turn's message out of its text (None: none), tool calls and thinking. A turn that
    only thought stays a turn (empty text, its reasoning passed back as configured): without
    it, two user messages would follow each other."""
    if said is None and not tool_calls:
        return AssistantTurn({"role": "assistant", "content": ""} if thinking else None,
                             thinking)
    message: dict[str, Any] = {"role": "assistant", "content": said}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return AssistantTurn(message, thinking)


def _assistant_parts_turn(content: list[Any], keep_parts: bool) -> AssistantTurn:
    """`convert_assistant_turn` for a turn holding more than plain text, tool calls and
    thinking: its texts gathered as parts (a marker kept where the upstream takes it)."""
    texts: list[Part] = []
    tool_calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_use":
            tool_calls.append(tool_call(block))
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)
        else:
            texts.extend(part for part in _block_parts(block, "assistant")
                         if part["type"] == "text")
    return _assistant_turn(user_content(texts, keep_parts) if texts else None, tool_calls,
                           thinking)


def tool_call(block: dict[str, Any]) -> dict[str, Any]:
    """A tool_use block as the upstream's call. A string `input` is the text of a call that
    was no JSON object, as the proxy gave it in a whole Message: it goes back as it was
    written, not quoted as a JSON string."""
    arguments = block.get("input")
    return {
        "id": to_upstream_id(str(block.get("id", ""))),
        "type": "function",
        "function": {
            "name": str(block.get("name", "")),
            "arguments": arguments if isinstance(arguments, str) else orjson.dumps(
                arguments if arguments is not None else {}).decode(),
        },
    }


def convert_system_turn(content: Any, keep_parts: bool = False) -> dict[str, Any] | None:
    """A `role: "system"` message inside `messages` (Claude Code sends these) stays a system
    message at its place in the conversation (moving it would change every later prefix)."""
    parts = text_parts(content)
    return {"role": "system", "content": user_content(parts, keep_parts)} if parts else None
