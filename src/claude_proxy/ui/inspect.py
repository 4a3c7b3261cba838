"""What the request inspector shows, computed from one kept record (pure: dicts in, dicts out).

Built only when someone opens a request, never while requests run: the record keeps its
bodies and streamed events by reference, and this module turns them into views.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from claude_proxy.conversion.response_converter import collect_message
from claude_proxy.record import RequestRecord, Sent
from claude_proxy.sse import decode_frames

logger = logging.getLogger("claude_proxy.ui")

MAX_TEXT = 20_000
"""Longer strings are cut in the views (a file read by a tool can be megabytes)."""
HEAVY_UPSTREAM_FIELDS = ("messages", "input", "tools")
"""Shown collapsed: Chat Completions `messages`, Responses `input`, and the tools."""
OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def cut(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


# ---------------------------------------------------------------- the client's request


def _media_placeholder(block: dict[str, Any]) -> str:
    found = block.get("source")
    source: dict[str, Any] = found if isinstance(found, dict) else {}
    data = source.get("data")
    size = f", {len(data)} base64 characters" if isinstance(data, str) else ""
    return f"[{block.get('type')} {source.get('media_type') or source.get('type') or ''}{size}]"


def block_view(block: Any) -> dict[str, Any]:
    """One content block, text cut, images and documents as placeholders."""
    if isinstance(block, str):
        return {"type": "text", "text": cut(block)}
    if not isinstance(block, dict):
        return {"type": "unknown"}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": cut(str(block.get("text", "")))}
    if kind in ("image", "document"):
        return {"type": kind, "placeholder": _media_placeholder(block)}
    if kind == "thinking":
        return {"type": "thinking", "text": cut(str(block.get("thinking", "")))}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.get("id"), "name": block.get("name"),
                "input": block.get("input")}
    if kind == "tool_result":
        content = block.get("content")
        parts = content if isinstance(content, list) else [content or ""]
        return {"type": "tool_result", "tool_use_id": block.get("tool_use_id"),
                "is_error": bool(block.get("is_error")),
                "content": [block_view(part) for part in parts]}
    return {"type": str(kind)}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [block_view(block) for block in content]
    return [block_view(content if isinstance(content, str) else "")]


def client_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as the client sent it: settings, system prompt, messages, tool names."""
    settings = {key: value for key, value in body.items()
                if key not in ("system", "messages", "tools")}
    listed = body.get("tools")
    tools: list[Any] = listed if isinstance(listed, list) else []
    return {
        "settings": settings,
        "system": _blocks(body.get("system")) if body.get("system") else [],
        "messages": [{"role": message.get("role"), "blocks": _blocks(message.get("content"))}
                     for message in body.get("messages", []) if isinstance(message, dict)],
        "tools": [tool.get("name") for tool in tools if isinstance(tool, dict)],
    }


# ---------------------------------------------------------------- the upstream request


def _tool_names(tools: Any, *path: str) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        value = tool
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            names.append(value)
    return names


def why_added(name: str, value: Any, client: dict[str, Any], added: dict[str, Any]) -> str | None:
    """Why the proxy put this top-level field in the upstream request, if it did."""
    if name in added:
        return "reasoning field added by the proxy"
    if name in OUTPUT_LIMITS and value != client.get("max_tokens"):
        return f"clamped from {client.get('max_tokens')}"
    if name == "stream_options":
        return "added so the upstream reports usage"
    return None


def upstream_view(client: dict[str, Any], upstream: dict[str, Any],
                  added: dict[str, Any]) -> dict[str, Any]:
    """The request as sent upstream, each field the proxy added or changed marked with why."""
    fields = [{"name": name, "value": value, "added": why_added(name, value, client, added)}
              for name, value in upstream.items() if name not in HEAVY_UPSTREAM_FIELDS]
    sent_tools = (_tool_names(upstream.get("tools"), "function", "name")
                  + _tool_names(upstream.get("tools"), "name"))
    dropped = [name for name in _tool_names(client.get("tools"), "name")
               if name not in sent_tools]
    messages = []
    items = upstream.get("messages", upstream.get("input"))
    for message in items if isinstance(items, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        extra = {key: (cut(value) if isinstance(value, str) else value)
                 for key, value in message.items()
                 if key not in ("role", "content", "tool_calls", "tool_call_id", "name", "type")}
        messages.append({
            "role": message.get("role") or message.get("type"),
            "text": cut(text) if content is not None else "",
            "tool_calls": _tool_names(message.get("tool_calls"), "function", "name"),
            "extra": extra, "added": sorted(key for key in extra if key in added)})
    return {"fields": fields, "messages": messages, "tools": sent_tools,
            "dropped_tools": dropped}


# ---------------------------------------------------------------- the answer


def message_of(record: RequestRecord) -> dict[str, Any]:
    """The Anthropic answer the client got (for a stream: what its events add up to)."""
    if record.message is not None:
        return record.message
    events = list(decode_frames(record.events))
    try:
        return collect_message(event for event in events if event.get("type") != "error")
    except (KeyError, IndexError, TypeError):
        logger.warning("request %s: its events do not add up to a message",
                       record.request_id)
        return {}


def answer_view(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content") or []
    return {
        "thinking": [cut(block.get("thinking", "")) for block in content
                     if block.get("type") == "thinking"],
        "text": cut("".join(block.get("text", "") for block in content
                            if block.get("type") == "text")),
        "tool_calls": [{"id": block.get("id"), "name": block.get("name"),
                        "input": block.get("input")} for block in content
                       if block.get("type") == "tool_use"],
        "usage": message.get("usage"),
        "stop_reason": message.get("stop_reason"),
    }


def error_of(record: RequestRecord) -> dict[str, Any] | None:
    """The error the client got: an error response's body, or a stream's `error` event."""
    if record.error_body:
        try:
            body = orjson.loads(record.error_body)
        except orjson.JSONDecodeError:
            return {"type": "error", "message": cut(record.error_body.decode(errors="replace"))}
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return dict(body["error"])
        return None
    for event in decode_frames(record.events[-2:], b'"type":"error"'):
        if event.get("type") == "error" and isinstance(event.get("error"), dict):
            return dict(event["error"])
    return None


def _body(parsed: dict[str, Any] | None, sent: Sent | None) -> dict[str, Any] | None:
    """A body from the bytes it was sent as (the kept form), else as the request held it."""
    if sent is not None:
        try:
            body = orjson.loads(bytes(sent))
        except orjson.JSONDecodeError:
            return None
        return body if isinstance(body, dict) else None
    return parsed


def inspector_view(record: RequestRecord) -> dict[str, Any]:
    client = _body(record.client_body, record.client_json) or {}
    upstream = _body(record.upstream_body, record.upstream_json)
    return {
        "client": client_view(client) if client else None,
        "upstream": (upstream_view(client, upstream, record.added)
                     if upstream is not None else None),
        "answer": answer_view(message_of(record)),
        "error": error_of(record),
        "tool_guard": [guard_view(call) for call in record.tool_calls
                       if call["outcome"] != "valid"],
    }


def guard_view(call: dict[str, Any]) -> dict[str, Any]:
    """What the tool-call guard did with one call: its arguments as the upstream sent them
    (kept for this view) and what went out instead, cut."""
    return {**call, "original": cut(call.get("original") or ""),
            "sent": [cut(text) for text in call.get("sent") or []]}
