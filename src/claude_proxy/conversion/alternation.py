"""Conversations for chat templates that demand strict user/assistant alternation (pure).

Gemma's template (and the Mistral family's) raise `Conversation roles must alternate
user/assistant/user/assistant/...` on anything else, while Claude Code sends a system message
in the middle of the conversation and text after its tool results (reminders), which become a
second user message in a row. For a model that refused such a conversation (learned as a
refusal, `upstream/capabilities.py`), the body is folded: a later system message becomes
`<system-reminder>` text of the user message next to it (a user message of its own when there
is none), consecutive messages of one role become one, and text that follows tool results goes
into the last tool result. Tool results themselves stay
directly after the assistant message that called them, where the Mistral family expects them.

Gemma 3's template goes further: a `tool` message is neither user nor assistant, so the first
tool result breaks the alternation whatever is folded. So one refusal teaches the whole strict
form (`upstream/capabilities.STRICT_FORM`), whether or not the refused conversation had tool
turns: the tool loop is carried as text, each call becoming assistant text naming the tool and
its arguments (Hermes' `<tool_call>` JSON, which conversion/text_tool_calls.py reads back should
the model imitate it), each result user text in a `<tool_response>` envelope, in order; then
the conversation is folded as above.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import orjson

from claude_proxy.conversion.caching import system_messages_as_user

Message = dict[str, Any]

_REFUSED = re.compile(r"roles must alternate|must alternate (between )?user|"
                      r"alternat\w* (between )?user and assistant", re.IGNORECASE)
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def names_alternation(message: str) -> bool:
    """Whether an upstream error is a template refusing a non-alternating conversation."""
    return _REFUSED.search(message) is not None


def alternates(body: dict[str, Any]) -> bool:
    """Whether `messages` already alternate: at most one system message, first; no two
    user (or assistant) messages in a row; nothing but tool results after tool results
    before the next assistant message."""
    previous = None
    for position, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role == "system" and position > 0:
            return False
        if role in ("user", "assistant") and role == previous:
            return False
        if role == "user" and previous == "tool":
            return False
        previous = role
    return True


def has_broken_alternation(body: dict[str, Any]) -> bool:
    return not alternates(body)


def fold_to_alternation(body: dict[str, Any]) -> None:
    """Rewrite `body["messages"]` so that roles alternate (see the module docstring)."""
    system_messages_as_user(body)
    folded: list[Message] = []
    for message in body.get("messages") or []:
        last = folded[-1] if folded else None
        role = message.get("role")
        if last is not None and role == "user" and last.get("role") == "tool" and \
                _is_text(message.get("content")):
            last["content"] = _joined(last.get("content"), message.get("content"))
        elif last is not None and role in ("user", "assistant") and last.get("role") == role:
            _merge(last, message)
        else:
            folded.append(dict(message))
    body["messages"] = folded


def has_tool_turns(body: dict[str, Any]) -> bool:
    """Whether `messages` hold a tool call or a tool result."""
    return any(message.get("role") == "tool" or message.get("tool_calls")
               for message in body.get("messages") or [])


def tool_turns_as_text(body: dict[str, Any]) -> None:
    """Rewrite `body["messages"]` with tool calls and results as text (see the module
    docstring), then fold them to alternation."""
    body["messages"] = [_as_text(message) for message in body.get("messages") or []]
    fold_to_alternation(body)


def _as_text(message: Message) -> Message:
    if message.get("role") == "tool":
        result = message.get("content")
        parts = _parts(result)
        text = "\n".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
        others = [p for p in parts if p.get("type") != "text"]  # images stay parts
        envelope = f"<tool_response>\n{text}\n</tool_response>"
        return {"role": "user", "content": _joined(envelope, others) if others else envelope}
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = "\n".join(_call_text(call) for call in calls)
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return {**rest, "content": _joined(message.get("content"), written)}


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments: Any = function.get("arguments") or "{}"
    with contextlib.suppress(orjson.JSONDecodeError):  # else written as the model sent it
        arguments = orjson.loads(arguments)
    named = orjson.dumps({"name": function.get("name", ""), "arguments": arguments})
    return f"<tool_call>\n{named.decode()}\n</tool_call>"


def _merge(into: Message, message: Message) -> None:
    """One message of the same role appended to another: content, tool calls, reasoning."""
    into["content"] = _joined(into.get("content"), message.get("content"))
    calls = [*(into.get("tool_calls") or []), *(message.get("tool_calls") or [])]
    if calls:
        into["tool_calls"] = calls
    for name in _REASONING_FIELDS:
        if name in message:
            into[name] = "".join(str(m.get(name) or "") for m in (into, message))


def _is_text(content: Any) -> bool:
    return isinstance(content, str) or (isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content))


def _joined(first: Any, second: Any) -> Any:
    """Two contents as one: strings joined by a blank line, otherwise parts."""
    if first in (None, ""):
        return second if second is not None else ""
    if second in (None, ""):
        return first
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    return [*_parts(first), *_parts(second)]


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [dict(part) for part in content or [] if isinstance(part, dict)]
