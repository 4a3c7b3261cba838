"""Chat Completions `chat.completion.chunk`s → internal deltas.

Everything about that wire format on the response side lives here: the many names providers
give their reasoning (`_merge_reasoning_fields`), inline `<think>` tags, tool-call fragments
keyed by index or id, OpenRouter's opaque `reasoning_details` entries, usage and finish
reasons. A non-streamed completion is cut into chunks first (`buffered_chunks`), so it goes
through the same parser.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from claude_proxy.conversion.deltas import (
    Delta,
    Finish,
    OpaqueReasoning,
    ReasoningText,
    Text,
    ToolCall,
    UpstreamFailure,
    Usage,
)
from claude_proxy.conversion.reasoning import tool_call_extra
from claude_proxy.conversion.think_tags import TAG_PAIRS, Piece, ThinkTagSplitter
from claude_proxy.conversion.usage import find_usage

Chunk = dict[str, Any]

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_OPENING_TAGS = tuple(opening for opening, _ in TAG_PAIRS)
_PLAIN = frozenset({"content", "role"})
"""The keys of a delta that carries text and nothing else."""


def _merge_reasoning_fields(delta: dict[str, Any]) -> str:
    """The reasoning text of one delta (or message), whatever the provider's dialect.

    The first non-empty of `reasoning_content`, `reasoning`, `thinking` (string, or an object's
    `content`/`text`) and the texts of `reasoning_details`; providers that send the same text
    under two names (Kimi behind Avian, OpenRouter) are thereby read once.

    >>> _merge_reasoning_fields({"reasoning_content": "a", "reasoning": "b"})
    'a'
    >>> _merge_reasoning_fields({"reasoning_content": "", "reasoning": " "})
    ' '
    >>> _merge_reasoning_fields({"thinking": "c"})
    'c'
    >>> _merge_reasoning_fields({"thinking": {"text": "e"}})
    'e'
    >>> _merge_reasoning_fields({"thinking": {"content": "d"}})
    'd'
    >>> _merge_reasoning_fields({"reasoning_details": [
    ...     {"type": "reasoning.text", "text": "f"}, {"type": "reasoning.summary", "summary": "g"},
    ...     {"type": "reasoning.encrypted", "data": "xxx"}]})
    'fg'
    >>> _merge_reasoning_fields({"content": "h"})
    ''
    """
    for name in ("reasoning_content", "reasoning"):
        value = delta.get(name)
        if isinstance(value, str) and value:
            return value
    thinking = delta.get("thinking")
    if isinstance(thinking, str) and thinking:
        return thinking
    if isinstance(thinking, dict):
        for name in ("content", "text"):
            value = thinking.get(name)
            if isinstance(value, str) and value:
                return value
    return _reasoning_details_text(delta.get("reasoning_details"))


def _reasoning_details_text(details: Any) -> str:
    if not isinstance(details, list):
        return ""
    pieces: list[str] = []
    for item in details:
        if not isinstance(item, dict):
            continue
        value = item.get("text") if item.get("text") else item.get("summary")
        if isinstance(value, str):
            pieces.append(value)
    return "".join(pieces)


def is_opaque_detail(entry: dict[str, Any]) -> bool:
    """An OpenRouter `reasoning_details` entry the upstream needs back: encrypted reasoning
    (Gemini thought signatures, OpenAI) or signed text (Anthropic models)."""
    return entry.get("type") == "reasoning.encrypted" or bool(entry.get("signature"))


class DetailsMerger:
    """Streamed `reasoning_details` fragments merged into whole entries.

    A fragment continues the previous entry when it has the same `index` and `type` and no
    other `id`; its strings (`text`, `summary`, `data`, `signature`) are appended, other
    fields filled in. Gemini 3 sends one whole encrypted entry per tool call, each with the
    call's id.
    """

    _APPENDED = ("text", "summary", "data", "signature")

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []

    def add(self, details: Any) -> None:
        if not isinstance(details, list):
            return
        for fragment in details:
            if isinstance(fragment, dict):
                self._add(fragment)

    def _add(self, fragment: dict[str, Any]) -> None:
        last = self._entries[-1] if self._entries else None
        if last is None or not self._continues(last, fragment):
            self._entries.append(dict(fragment))
            return
        for name, value in fragment.items():
            if name in self._APPENDED and isinstance(value, str):
                previous = last.get(name)
                last[name] = (previous if isinstance(previous, str) else "") + value
            elif last.get(name) is None:
                last[name] = value

    @staticmethod
    def _continues(last: dict[str, Any], fragment: dict[str, Any]) -> bool:
        fragment_id = fragment.get("id")
        return (fragment.get("index") == last.get("index")
                and fragment.get("type") == last.get("type")
                and (not fragment_id or fragment_id == last.get("id")))

    @property
    def holding(self) -> bool:
        """Whether entries wait to be taken."""
        return bool(self._entries)

    def take_opaque(self) -> list[Delta]:
        """The whole entries so far that must go back upstream; the merger starts afresh."""
        entries, self._entries = self._entries, []
        return [OpaqueReasoning(entry) for entry in entries if is_opaque_detail(entry)]


def matched_stop(choice: dict[str, Any]) -> str | None:
    """The stop string a server says it stopped at: vLLM's `stop_reason` (a token id there
    is not a string), SGLang's `matched_stop`."""
    for name in ("stop_reason", "matched_stop"):
        value = choice.get(name)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass
class _Slot:
    key: int
    upstream_id: str


class _ThinkSniffer:
    """For models not configured for `<think>` tags: content whose first non-whitespace
    characters open a tag is inline reasoning. Decides once, at the start of the content."""

    def __init__(self) -> None:
        self.held = ""
        self.decided: bool | None = None

    def feed(self, content: str) -> bool | None:
        """True: the content opens with a tag; False: it does not; None: cannot tell yet."""
        self.held += content
        start = self.held.lstrip()
        if not start or any(tag.startswith(start) and tag != start for tag in _OPENING_TAGS):
            return None
        self.decided = start.startswith(_OPENING_TAGS)
        return self.decided


class ChatCompletionsParser:
    """One response's chunks → deltas.

    `think_tags` (THINK_TAG_PREFIXES matched) splits `<think>` sections anywhere in the
    content; otherwise, with `leading_think_tags`, content that starts with a tag in a
    response with no reasoning field is split too (what the proxy does for every model).
    `show_inline_thinking` False (the client turned thinking off) removes that text.
    Tool calls written as text are read behind this parser (`conversion/text_tool_calls.py`).
    """

    def __init__(self, *, think_tags: bool = False, leading_think_tags: bool = False,
                 show_inline_thinking: bool = True) -> None:
        self._think_tags = think_tags
        self._show_inline_thinking = show_inline_thinking
        self._splitter: ThinkTagSplitter | None = None
        self._sniffer = _ThinkSniffer() if leading_think_tags and not think_tags else None
        self._saw_reasoning_field = False
        self._slots: dict[int, _Slot] = {}
        self._next_key = 0
        self._details = DetailsMerger()

    def parse(self, chunk: Chunk) -> list[Delta]:
        text = self._plain_text(chunk)
        if text is not None:
            return [Text(text)]
        error = chunk.get("error")
        if error:
            return [UpstreamFailure(error)]
        deltas: list[Delta] = []
        usage = find_usage(chunk)
        if usage is not None:
            deltas.append(Usage(usage))
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return deltas
        choice = choices[0]
        delta = choice.get("delta") or choice.get("message") or {}
        if isinstance(delta, dict):
            self._parse_delta(delta, deltas)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            deltas.extend(self._details.take_opaque())
            deltas.append(Finish(STOP_REASONS.get(reason, "end_turn"), matched_stop(choice)))
        return deltas

    def _plain_text(self, chunk: Chunk) -> str | None:
        """The text of a chunk that holds nothing else (most chunks of a stream), when this
        parser has nothing held that would change it: exactly what the whole path below
        gives it, without asking it for usage, reasoning, tool calls and a finish reason it
        does not have (a third of the relay's work per chunk). None: the whole path."""
        if (self._splitter is not None or self._think_tags or self._details.holding
                or (self._sniffer is not None and self._sniffer.decided is not False)):
            return None
        choices = chunk.get("choices")
        if (type(choices) is not list or not choices or chunk.get("usage") is not None
                or "error" in chunk or "x_groq" in chunk):
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason") or "usage" in choice:
            return None
        delta = choice.get("delta")
        if type(delta) is not dict or not delta.keys() <= _PLAIN:
            return None
        content = delta.get("content")
        return content if type(content) is str and content else None

    def flush(self) -> list[Delta]:
        """What is still held at the end of the stream (a partial tag, opaque entries)."""
        deltas = self._undecided_text()
        if self._splitter is not None:
            deltas.extend(self._pieces(self._splitter.flush()))
        deltas.extend(self._details.take_opaque())
        return deltas

    # ------------------------------------------------------------ one delta

    def _parse_delta(self, delta: dict[str, Any], deltas: list[Delta]) -> None:
        reasoning = _merge_reasoning_fields(delta)
        if reasoning:
            self._saw_reasoning_field = True
            deltas.append(ReasoningText(reasoning))
        self._details.add(delta.get("reasoning_details"))
        content = delta.get("content")
        tool_calls = delta.get("tool_calls")
        if (isinstance(content, str) and content) or isinstance(tool_calls, list):
            # Opaque reasoning belongs to the thinking that this content closes.
            deltas.extend(self._details.take_opaque())
        if isinstance(content, str) and content:
            deltas.extend(self._content(content))
        if isinstance(tool_calls, list):
            deltas.extend(self._undecided_text())
            for fragment in tool_calls:
                if isinstance(fragment, dict):
                    deltas.extend(_tool_call_extra(fragment))
                    deltas.append(self._tool_piece(fragment))

    def _content(self, content: str) -> list[Delta]:
        if self._splitter is not None:
            return self._pieces(self._splitter.feed(content))
        if self._think_tags:
            # A stream that opens with text but no tag is already thinking (the template
            # opened the tag) unless the upstream sends its reasoning in a field.
            implicit = self._show_inline_thinking and not self._saw_reasoning_field
            self._splitter = ThinkTagSplitter(implicit_thinking=implicit)
            return self._pieces(self._splitter.feed(content))
        sniffer = self._sniffer
        if sniffer is None or sniffer.decided is False:
            return [Text(content)]
        if self._saw_reasoning_field and sniffer.decided is None:
            sniffer.decided = False
            held, sniffer.held = sniffer.held + content, ""
            return [Text(held)]
        if sniffer.feed(content) is None:
            return []
        held, sniffer.held = sniffer.held, ""
        if not sniffer.decided:
            return [Text(held)]
        self._splitter = ThinkTagSplitter()
        return self._pieces(self._splitter.feed(held))

    def _undecided_text(self) -> list[Delta]:
        """Content held while it might still open a tag, as text: a tool call or the end
        came first, so it did not."""
        sniffer = self._sniffer
        if sniffer is None or sniffer.decided is not None or not sniffer.held:
            return []
        held, sniffer.held, sniffer.decided = sniffer.held, "", False
        return [Text(held)]

    def _pieces(self, pieces: list[Piece]) -> list[Delta]:
        return [Text(text) if kind == "text"
                else ReasoningText(text, visible=self._show_inline_thinking)
                for kind, text in pieces]

    def _tool_piece(self, fragment: dict[str, Any]) -> ToolCall:
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        raw_name = function.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        fragment_id = fragment.get("id") if isinstance(fragment.get("id"), str) else ""
        key = self._key_for(fragment.get("index"), str(fragment_id), name)
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = orjson.dumps(arguments).decode()
        return ToolCall(key, id=str(fragment_id), name=name,
                        arguments=arguments if isinstance(arguments, str) else "")

    def _key_for(self, index: Any, fragment_id: str, name: str) -> int:
        """The call a fragment belongs to: by `index`, and a new call whenever a new id shows
        up (some servers number every call 0). Without an index, an id or a name starts a
        new call and anything else continues the last one."""
        if not isinstance(index, int):
            starts = bool(fragment_id or name) or not self._slots
            index = max(self._slots, default=-1) + 1 if starts else max(self._slots)
        slot = self._slots.get(index)
        if slot is None or (fragment_id and slot.upstream_id and fragment_id != slot.upstream_id):
            slot = _Slot(self._next_key, fragment_id)
            self._next_key += 1
            self._slots[index] = slot
        elif fragment_id and not slot.upstream_id:
            slot.upstream_id = fragment_id
        return slot.key


def _tool_call_extra(fragment: dict[str, Any]) -> list[Delta]:
    """A tool call's `extra_content` (Gemini's `google.thought_signature`), kept whole with
    the call's id: the upstream wants it back on that call next turn, the user never sees
    it. It travels in the signature of the (empty) thinking block opened before the call."""
    extra = fragment.get("extra_content")
    if not isinstance(extra, dict) or not extra:
        return []
    call_id = fragment.get("id")
    return [OpaqueReasoning(tool_call_extra(call_id if isinstance(call_id, str) else "", extra))]


def buffered_chunks(response: Chunk) -> Iterator[Chunk]:
    """Cut one JSON completion into stream chunks: reasoning first (under
    `reasoning_content`, with the opaque `reasoning_details` entries), then content, then tool
    calls, then finish reason and usage."""
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    reasoning = _merge_reasoning_fields(message)
    details = message.get("reasoning_details")
    opaque = [entry for entry in details if isinstance(entry, dict) and is_opaque_detail(entry)
              ] if isinstance(details, list) else []
    if reasoning or opaque:
        first: Chunk = {"role": "assistant", "reasoning_content": reasoning}
        if opaque:
            first["reasoning_details"] = opaque
        yield _chunk(first)
    content = message.get("content")
    if isinstance(content, str) and content:
        yield _chunk({"content": content})
    for index, call in enumerate(message.get("tool_calls") or []):
        if isinstance(call, dict):
            yield _chunk({"tool_calls": [{**call, "index": index}]})
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    final_choice: Chunk = {"index": 0, "delta": {}, "finish_reason": finish}
    stop = matched_stop(choice) if isinstance(choice, dict) else None
    if stop is not None:
        final_choice["stop_reason"] = stop
    final: Chunk = {"choices": [final_choice]}
    if isinstance(response.get("usage"), dict):
        final["usage"] = response["usage"]
    yield final


def _chunk(delta: Chunk) -> Chunk:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
