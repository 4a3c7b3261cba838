"""Context management (`context_management.edits`): the edits the proxy can honour, applied to
the conversation before it is converted, and the `applied_edits` that say what was done.

Anthropic's API clears old tool results (`clear_tool_uses_20250919`) and old thinking
(`clear_thinking_20251015`) server-side and reports each applied edit with what it cleared;
clients (Claude Code, the SDKs) read `context_management.applied_edits` from the message, or
streamed from `message_delta` beside `delta` and `usage`. Claude Code sends a no-op
`clear_thinking` with `keep: "all"` on every request; nothing done is then `[]`.

- `clear_tool_uses_20250919`: once `trigger` is passed (`input_tokens`, default 100000, or
  `tool_uses`), every tool use but the `keep` most recent (default 3) whose tool is not in
  `exclude_tools` has its result replaced by a placeholder, and its input emptied too when
  `clear_tool_inputs` is true or names the tool (a result already no longer than the
  placeholder stays as it is). If that would clear fewer than `clear_at_least` input tokens,
  nothing is cleared.
- `clear_thinking_20251015`: thinking is removed from all but the last `keep` thinking turns
  (`{"type": "thinking_turns", "value": N}`; without `keep`, all are kept, the default of
  Anthropic's current models), only where the upstream needs no reasoning passed back
  (`needs_reasoning` false); an upstream that does (DeepSeek, Kimi, GLM, MiniMax, llama.cpp
  replay it on tool turns) keeps it, and nothing is reported cleared.

Token counts are the proxy's estimate (characters / 4), as every other count it makes. Pure:
no I/O; the body given is never changed (edited messages are copies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion.usage import estimate_tokens
from claude_proxy.errors import ProxyError

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
CLEARED = "[Tool result cleared by context management]"
"""What a cleared tool result says instead (the tool call stays, so the turn is well formed)."""
DEFAULT_TRIGGER: dict[str, Any] = {"type": "input_tokens", "value": 100_000}
DEFAULT_KEEP_TOOL_USES = 3

Edit = dict[str, Any]


# ---------------------------------------------------------------- the request's shape


def check(body: Mapping[str, Any]) -> None:
    """A malformed `context_management` is the client's mistake: 400 naming the member."""
    config = body.get("context_management")
    if config is None:
        return
    if not isinstance(config, dict):
        _bad("context_management", "Input should be a valid dictionary")
    edits = config.get("edits", [])
    if not isinstance(edits, list):
        _bad("context_management.edits", "Input should be a valid list")
    for position, edit in enumerate(edits):
        where = f"context_management.edits.{position}"
        if not isinstance(edit, dict):
            _bad(where, "Input should be a valid dictionary")
        if position and edit.get("type") == CLEAR_THINKING:
            _bad(where, f"{CLEAR_THINKING} must be listed first in `edits`")
        kind = edit.get("type")
        if kind == CLEAR_TOOL_USES:
            _check_clear_tool_uses(where, edit)
        elif kind == CLEAR_THINKING:
            _check_keep_thinking(where, edit.get("keep"))
        else:
            _bad(f"{where}.type", f"{kind!r} is not supported by this proxy (supported: "
                                  f"{CLEAR_TOOL_USES}, {CLEAR_THINKING})")


def _check_clear_tool_uses(where: str, edit: Edit) -> None:
    _check_counter(f"{where}.trigger", edit.get("trigger"), ("input_tokens", "tool_uses"))
    _check_counter(f"{where}.keep", edit.get("keep"), ("tool_uses",))
    _check_counter(f"{where}.clear_at_least", edit.get("clear_at_least"), ("input_tokens",))
    excluded = edit.get("exclude_tools")
    if excluded is not None and not (isinstance(excluded, list)
                                     and all(isinstance(name, str) for name in excluded)):
        _bad(f"{where}.exclude_tools", "Input should be a list of tool names")
    inputs = edit.get("clear_tool_inputs")
    if inputs is not None and not isinstance(inputs, bool) and not (
            isinstance(inputs, list) and all(isinstance(name, str) for name in inputs)):
        _bad(f"{where}.clear_tool_inputs", "Input should be a boolean or a list of tool names")


def _check_counter(where: str, value: Any, kinds: tuple[str, ...]) -> None:
    """`{"type": one of kinds, "value": a non-negative integer}`, or absent."""
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") not in kinds:
        _bad(where, f"Input should be an object with type {' or '.join(map(repr, kinds))}")
    number = value.get("value")
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        _bad(f"{where}.value", "Input should be a non-negative integer")


def _check_keep_thinking(where: str, keep: Any) -> None:
    if keep is None or keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return
    _check_counter(f"{where}.keep", keep, ("thinking_turns", "all"))
    if keep["value"] < 1:
        _bad(f"{where}.keep.value", "Input should be greater than 0")


def _bad(where: str, message: str) -> None:
    raise ProxyError(400, f"{where}: {message}")


# ---------------------------------------------------------------- applying the edits


def needs_reasoning(settings: ProviderSettings) -> bool:
    """Whether the upstream wants earlier reasoning back: it is passed back as a field
    (DeepSeek, Kimi, GLM, llama.cpp, vLLM, MiniMax), or its dialect carries opaque reasoning
    that tool-call turns need (Gemini's thought signatures, OpenRouter's details)."""
    return settings.passback != "none" or settings.dialect in ("gemini", "openrouter")


@dataclass(frozen=True)
class Edited:
    body: dict[str, Any]
    """The request with the edits applied (the original when none applied)."""
    applied: list[Edit]
    """`context_management.applied_edits`: one entry per edit that changed something."""

    @property
    def cleared_tokens(self) -> int:
        return sum(int(edit["cleared_input_tokens"]) for edit in self.applied)


def apply(body: dict[str, Any], input_tokens: int, *, needs_reasoning: bool) -> Edited:
    """The request's edits, in its order, on its messages. `input_tokens`: the estimate of the
    request as sent (for `trigger`); `needs_reasoning`: the upstream wants earlier reasoning
    back, so thinking is not cleared."""
    config = body.get("context_management")
    edits = config.get("edits") if isinstance(config, dict) else None
    if not edits:
        return Edited(body, [])
    messages: list[Any] = list(body.get("messages") or [])
    applied: list[Edit] = []
    for edit in edits:
        if edit.get("type") == CLEAR_TOOL_USES:
            entry = clear_tool_uses(messages, edit, input_tokens)
        elif needs_reasoning:
            entry = None
        else:
            entry = clear_thinking(messages, edit.get("keep"))
        if entry is not None:
            applied.append(entry)
            input_tokens -= int(entry["cleared_input_tokens"])
    return Edited({**body, "messages": messages} if applied else body, applied)


def clear_tool_uses(messages: list[Any], edit: Edit, input_tokens: int) -> Edit | None:
    """One `clear_tool_uses` edit on `messages` (edited in place: copies replace the messages
    it changes); its `applied_edits` entry, or None when it did not fire or cleared nothing."""
    uses = _tool_uses(messages)
    trigger = edit.get("trigger") or DEFAULT_TRIGGER
    measure = len(uses) if trigger["type"] == "tool_uses" else input_tokens
    if measure <= _value({"trigger": trigger}, "trigger", 0):
        return None
    keep = _value(edit, "keep", DEFAULT_KEEP_TOOL_USES)
    excluded = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs") or False
    older = uses[:max(0, len(uses) - keep)]
    results = _tool_results(messages)
    plan = []
    chars = 0
    for where, block in older:
        name = str(block.get("name", ""))
        result = results.get(str(block.get("id", "")))
        if name in excluded or result is None or result[1].get("content") == CLEARED:
            continue
        clear_input = inputs is True or (isinstance(inputs, list) and name in inputs)
        saved = _chars(result[1].get("content")) - len(CLEARED)
        saved_input = _chars(block.get("input")) - 2 if clear_input else 0
        if saved <= 0 and saved_input <= 0:
            continue  # no shorter cleared: the placeholder would weigh more
        chars += max(0, saved) + max(0, saved_input)
        plan.append((where, block, result, clear_input))
    cleared_tokens = estimate_tokens(max(0, chars))
    floor = _value(edit, "clear_at_least", 0)
    if not plan or cleared_tokens < floor:
        return None
    for (message_at, block_at), _, (result_at, _), clear_input in plan:
        _edit_block(messages, result_at, lambda b: {**b, "content": CLEARED})
        if clear_input:
            _edit_block(messages, (message_at, block_at), lambda b: {**b, "input": {}})
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(plan),
            "cleared_input_tokens": cleared_tokens}


def clear_thinking(messages: list[Any], keep: Any) -> Edit | None:
    """One `clear_thinking` edit: thinking blocks out of every assistant turn but the last
    `keep` that have any; its entry, or None when nothing was removed."""
    if keep is None or keep == "all" or keep.get("type") == "all":
        return None
    else:
        turns = int(keep["value"])
    thinking_turns = [at for at, message in enumerate(messages) if _role(message) == "assistant"
                      and any(_is_thinking(block) for block in _blocks(message))]
    older = thinking_turns[:max(0, len(thinking_turns) - turns)]
    chars = 0
    for at in older:
        message = messages[at]
        kept = [block for block in _blocks(message) if not _is_thinking(block)]
        chars += sum(len(str(block.get("thinking", block.get("data", ""))))
                     for block in _blocks(message) if _is_thinking(block))
        messages[at] = {**message, "content": kept or [{"type": "text", "text": ""}]}
    if not older:
        return None
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(older),
            "cleared_input_tokens": estimate_tokens(chars)}


# ---------------------------------------------------------------- the conversation's pieces

Place = tuple[int, int]
"""(message index, block index)."""


def _value(edit: Edit, name: str, default: int) -> int:
    """The `value` of a knob such as `{"type": "tool_uses", "value": 3}`, or the default."""
    knob = edit.get(name)
    return int(knob["value"]) if isinstance(knob, dict) and "value" in knob else default


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [block for block in content if isinstance(block, dict)] if isinstance(
        content, list) else []


def _is_thinking(block: dict[str, Any]) -> bool:
    return block.get("type") in ("thinking", "redacted_thinking")


def _tool_uses(messages: list[Any]) -> list[tuple[Place, dict[str, Any]]]:
    """Every tool_use block of the assistant turns, oldest first."""
    return [((at, index), block) for at, message in enumerate(messages)
            if _role(message) == "assistant"
            for index, block in enumerate(_raw_blocks(message))
            if isinstance(block, dict) and block.get("type") == "tool_use"]


def _tool_results(messages: list[Any]) -> dict[str, tuple[Place, dict[str, Any]]]:
    """Each tool_result block of the user turns, by the id of its tool_use."""
    return {str(block.get("tool_use_id")): ((at, index), block)
            for at, message in enumerate(messages) if _role(message) == "user"
            for index, block in enumerate(_raw_blocks(message))
            if isinstance(block, dict) and block.get("type") == "tool_result"}


def _raw_blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _edit_block(messages: list[Any], place: Place, change: Any) -> None:
    """Replace one block through copies: the client's body is never changed."""
    at, index = place
    message = messages[at]
    content = list(message["content"])
    content[index] = change(content[index])
    messages[at] = {**message, "content": content}


def _chars(value: Any) -> int:
    """The characters a piece of content weighs (text as is, anything else as JSON)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       for b in value):
        return sum(len(str(b.get("text", ""))) for b in value)
    return len(orjson.dumps(value))
