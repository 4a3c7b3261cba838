"""OpenAI chat.completion chunks → Anthropic stream events: one state machine per response.

`StreamConverter` owns the block indices. Blocks are strictly sequential (each closed before
the next opens, indexed 0..n-1) and carry their content only through deltas, which is what
Claude Code's own accumulator insists on. A buffered (non-streamed) upstream answer is cut into
chunks and fed through the same machine, and a non-streaming client gets the Message these
events add up to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from claude_proxy.conversion.ids import new_message_id, to_anthropic_id
from claude_proxy.conversion.think_tags import Piece, ThinkTagSplitter
from claude_proxy.conversion.usage import (
    anthropic_usage,
    estimate_tokens,
    find_usage,
    reasoning_tokens,
)
from claude_proxy.errors import ProxyError, error_from_payload

logger = logging.getLogger("claude_proxy.conversion")

Event = dict[str, Any]

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _merge_reasoning_fields(delta: dict[str, Any]) -> str:
    """The reasoning text of one delta (or message), whatever the provider's dialect.

    The first non-empty of `reasoning_content`, `reasoning`, `thinking` (string, or an object's
    `content`/`text`) and the texts of `reasoning_details`; providers that send the same text
    under two names (Kimi behind Avian, OpenRouter) are thereby read once.
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


def _block_start(index: int, block: dict[str, Any]) -> Event:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: dict[str, Any]) -> Event:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Event:
    return {"type": "content_block_stop", "index": index}


class _ReasoningBlockState:
    """One thinking block: start, thinking_deltas, then one signature_delta and the stop.

    The signature covers the whole text, so a later request can prove the block is ours.
    """

    kind = "thinking"

    def __init__(self, index: int, sign: Callable[[str], str]) -> None:
        self.index = index
        self._sign = sign
        self._pieces: list[str] = []

    def start(self) -> Event:
        return _block_start(self.index, {"type": "thinking", "thinking": "", "signature": ""})

    def add(self, text: str) -> Event:
        self._pieces.append(text)
        return _block_delta(self.index, {"type": "thinking_delta", "thinking": text})

    def close(self) -> list[Event]:
        signature = self._sign("".join(self._pieces))
        return [
            _block_delta(self.index, {"type": "signature_delta", "signature": signature}),
            _block_stop(self.index),
        ]


class _TextBlockState:
    kind = "text"

    def __init__(self, index: int) -> None:
        self.index = index

    def start(self) -> Event:
        return _block_start(self.index, {"type": "text", "text": ""})

    def add(self, text: str) -> Event:
        return _block_delta(self.index, {"type": "text_delta", "text": text})

    def close(self) -> list[Event]:
        return [_block_stop(self.index)]


@dataclass
class _ToolCall:
    """One upstream tool call, collected from its fragments."""

    upstream_id: str
    name: str
    fragments: list[str] = field(default_factory=list)
    sent: int = 0
    anthropic_id: str = ""

    def arguments(self) -> str:
        return "".join(self.fragments)

    def is_complete(self) -> bool:
        """Whether the arguments so far already form a JSON document."""
        text = self.arguments().strip()
        if not text:
            return False
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            return False
        return True


class _ToolBlockState:
    kind = "tool"

    def __init__(self, index: int, call: _ToolCall) -> None:
        self.index = index
        self.call = call

    def start(self) -> Event:
        call = self.call
        call.anthropic_id = to_anthropic_id(call.upstream_id)
        return _block_start(
            self.index,
            {"type": "tool_use", "id": call.anthropic_id, "name": call.name, "input": {}},
        )

    def pending_deltas(self) -> list[Event]:
        call = self.call
        fresh = call.fragments[call.sent:]
        call.sent = len(call.fragments)
        return [_block_delta(self.index, {"type": "input_json_delta", "partial_json": piece})
                for piece in fresh if piece]

    def close(self) -> list[Event]:
        events = self.pending_deltas()
        if not self.call.arguments().strip():
            # No arguments at all: say so explicitly, as clients parse only the deltas.
            events.append(_block_delta(self.index,
                                       {"type": "input_json_delta", "partial_json": "{}"}))
        events.append(_block_stop(self.index))
        return events


_Block = _ReasoningBlockState | _TextBlockState | _ToolBlockState


class StreamConverter:
    """Feeds upstream chunks in, gives Anthropic events out, for one response."""

    def __init__(
        self,
        model: str,
        *,
        input_tokens: int,
        sign: Callable[[str], str],
        message_id: str | None = None,
        think_tags: bool = False,
        show_inline_thinking: bool = True,
    ) -> None:
        """`think_tags` splits `<think>` sections out of the content; with
        `show_inline_thinking` False (the client turned thinking off) they are removed."""
        self.model = model
        self.message_id = message_id or new_message_id()
        self._input_estimate = input_tokens
        self._sign = sign
        self._next_index = 0
        self._open: _Block | None = None
        self._held_whitespace = ""
        self._calls: dict[int, _ToolCall] = {}
        self._queued: list[_ToolCall] = []
        self._tool_blocks = 0
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._streamed_chars = 0
        self._think_tags = think_tags
        self._show_inline_thinking = show_inline_thinking
        self._splitter: ThinkTagSplitter | None = None
        self._saw_reasoning_field = False

    # ------------------------------------------------------------ public API

    def start(self) -> list[Event]:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self._input_estimate,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """Events for one upstream chunk. An `error` object in the stream raises ProxyError."""
        error = chunk.get("error")
        if error:
            raise error_from_payload(error)
        usage = find_usage(chunk)
        if usage is not None:
            self._usage = usage
        events: list[Event] = []
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return events
        choice = choices[0]
        if not isinstance(choice, dict):
            return events
        delta = choice.get("delta") or choice.get("message") or {}
        if isinstance(delta, dict):
            self._feed_delta(delta, events)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish_reason = reason
        return events

    def finish(self) -> list[Event]:
        """Close everything and end the message: message_delta, then message_stop."""
        events = self._flush_splitter()
        events.extend(self._close_all())
        if self._next_index == 0 and self._held_whitespace:
            # A whitespace-only answer is still the answer.
            self._open_text(self._held_whitespace, events)
            events.extend(self._close_open())
        delta = {"stop_reason": self.stop_reason(), "stop_sequence": None}
        events.append({"type": "message_delta", "delta": delta, "usage": self.usage()})
        events.append({"type": "message_stop"})
        return events

    def fail(self, error: ProxyError) -> list[Event]:
        """Close every open block, then one `error` event (the stream then ends)."""
        events = self._flush_splitter()
        events.extend(self._close_all())
        events.append(error.body())
        return events

    def stop_reason(self) -> str:
        if self._tool_blocks:
            return "tool_use"
        reason = STOP_REASONS.get(self._finish_reason or "stop", "end_turn")
        return "end_turn" if reason == "tool_use" else reason

    @property
    def saw_finish_reason(self) -> bool:
        return self._finish_reason is not None

    def reasoning_tokens(self) -> int:
        return reasoning_tokens(self._usage) if self._usage is not None else 0

    def usage(self) -> dict[str, int]:
        if self._usage is not None:
            return anthropic_usage(self._usage)
        return {
            "input_tokens": self._input_estimate,
            "output_tokens": estimate_tokens(self._streamed_chars),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    # ------------------------------------------------------------ deltas

    def _feed_delta(self, delta: dict[str, Any], events: list[Event]) -> None:
        reasoning = _merge_reasoning_fields(delta)
        if reasoning:
            self._saw_reasoning_field = True
            self._add_thinking(reasoning, events)
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self._think_tags:
                self._add_pieces(self._split(content), events)
            else:
                self._add_text(content, events)
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for fragment in tool_calls:
                if isinstance(fragment, dict):
                    self._add_tool_fragment(fragment, events)

    def _split(self, content: str) -> list[Piece]:
        if self._splitter is None:
            # A stream that opens with text but no tag is already thinking (the template
            # opened the tag) unless the upstream sends its reasoning in a field.
            implicit = self._show_inline_thinking and not self._saw_reasoning_field
            self._splitter = ThinkTagSplitter(implicit_thinking=implicit)
        return self._splitter.feed(content)

    def _flush_splitter(self) -> list[Event]:
        events: list[Event] = []
        if self._splitter is not None:
            self._add_pieces(self._splitter.flush(), events)
        return events

    def _add_pieces(self, pieces: list[Piece], events: list[Event]) -> None:
        for kind, text in pieces:
            if kind == "text":
                self._add_text(text, events)
            elif self._show_inline_thinking:
                self._add_thinking(text, events)
            else:
                self._streamed_chars += len(text)
                logger.debug("removed %d characters of inline thinking", len(text))

    def _add_thinking(self, text: str, events: list[Event]) -> None:
        self._streamed_chars += len(text)
        if not isinstance(self._open, _ReasoningBlockState):
            self._held_whitespace = ""
            events.extend(self._close_open())
            self._open = _ReasoningBlockState(self._take_index(), self._sign)
            events.append(self._open.start())
        events.append(self._open.add(text))

    def _add_text(self, text: str, events: list[Event]) -> None:
        """Text deltas; whitespace that would open a block alone is held until text follows,
        so runs such as the blank between two tool calls never become empty-looking blocks."""
        self._streamed_chars += len(text)
        if isinstance(self._open, _TextBlockState):
            events.append(self._open.add(text))
            return
        text = self._held_whitespace + text
        if text.isspace():
            self._held_whitespace = text
            return
        self._held_whitespace = ""
        self._open_text(text, events)

    def _open_text(self, text: str, events: list[Event]) -> None:
        events.extend(self._close_open())
        self._open = _TextBlockState(self._take_index())
        events.append(self._open.start())
        events.append(self._open.add(text))

    def _add_tool_fragment(self, fragment: dict[str, Any], events: list[Event]) -> None:
        function = fragment.get("function")
        function = function if isinstance(function, dict) else {}
        raw_name = function.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        call = self._call_for(fragment, name)
        if function:
            if name and not call.name:
                call.name = name
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                arguments = orjson.dumps(arguments).decode()
            if isinstance(arguments, str) and arguments:
                call.fragments.append(arguments)
                self._streamed_chars += len(arguments)
        self._pump_tools(events)

    def _call_for(self, fragment: dict[str, Any], name: str) -> _ToolCall:
        """The call a fragment belongs to: by `index`, and a new call whenever a new id shows
        up (some servers number every call 0). Without an index, an id or a name starts a
        new call and anything else continues the last one."""
        fragment_id = fragment.get("id") if isinstance(fragment.get("id"), str) else ""
        index = fragment.get("index")
        if not isinstance(index, int):
            starts = bool(fragment_id or name) or not self._calls
            index = max(self._calls, default=-1) + 1 if starts else max(self._calls)
        call = self._calls.get(index)
        if call is None or (fragment_id and call.upstream_id and fragment_id != call.upstream_id):
            call = _ToolCall(upstream_id=fragment_id or "", name="")
            self._calls[index] = call
            self._queued.append(call)
        elif fragment_id and not call.upstream_id:
            call.upstream_id = fragment_id
        return call

    def _pump_tools(self, events: list[Event]) -> None:
        """Stream the open tool call; move on to the next queued call once the open one's
        arguments are a complete JSON document (calls may arrive interleaved)."""
        while True:
            if isinstance(self._open, _ToolBlockState):
                events.extend(self._open.pending_deltas())
                if not (self._queued and self._queued[0].name and self._open.call.is_complete()):
                    return
                events.extend(self._close_open())
            if not self._queued or not self._queued[0].name:
                return
            self._open_next_tool(events)

    def _open_next_tool(self, events: list[Event]) -> None:
        call = self._queued.pop(0)
        self._held_whitespace = ""
        events.extend(self._close_open())
        self._open = _ToolBlockState(self._take_index(), call)
        self._tool_blocks += 1
        events.append(self._open.start())

    # ------------------------------------------------------------ blocks

    def _take_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _close_open(self) -> list[Event]:
        if self._open is None:
            return []
        events = self._open.close()
        self._open = None
        return events

    def _close_all(self) -> list[Event]:
        events = self._close_open()
        for call in list(self._queued):
            if not call.name:
                logger.warning("upstream tool call without a name dropped")
                self._queued.remove(call)
        while self._queued:
            self._open_next_tool(events)
            events.extend(self._close_open())
        return events


def convert_chunks(
    chunks: Iterable[dict[str, Any]], converter: StreamConverter
) -> list[Event]:
    """All events of a complete response, from message_start to message_stop."""
    events = converter.start()
    for chunk in chunks:
        events.extend(converter.feed(chunk))
    events.extend(converter.finish())
    return events


def collect_message(events: Iterable[Event]) -> dict[str, Any]:
    """The Anthropic Message a sequence of stream events adds up to (non-streaming clients)."""
    message: dict[str, Any] = {}
    partial_json: dict[int, list[str]] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = dict(event["message"], content=[])
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            _apply_delta(message["content"][event["index"]], event["delta"], partial_json,
                         event["index"])
        elif kind == "content_block_stop":
            _finish_block(message["content"][event["index"]], partial_json.pop(event["index"],
                                                                               None))
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"] = {**message["usage"], **event["usage"]}
    return message


def _apply_delta(
    block: dict[str, Any], delta: dict[str, Any], partial_json: dict[int, list[str]], index: int
) -> None:
    kind = delta["type"]
    if kind == "text_delta":
        block["text"] += delta["text"]
    elif kind == "thinking_delta":
        block["thinking"] += delta["thinking"]
    elif kind == "signature_delta":
        block["signature"] = delta["signature"]
    elif kind == "input_json_delta":
        partial_json.setdefault(index, []).append(delta["partial_json"])


def _finish_block(block: dict[str, Any], partial_json: list[str] | None) -> None:
    if block["type"] != "tool_use" or partial_json is None:
        return
    text = "".join(partial_json)
    try:
        block["input"] = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        logger.warning("tool %s arguments are not valid JSON; input left empty", block["name"])
        block["input"] = {}
