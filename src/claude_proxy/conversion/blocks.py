"""Internal deltas → Anthropic stream events: the one block state machine of a response.

It owns the block indices. Blocks are strictly sequential (each closed before the next opens,
indexed 0..n-1) and carry their content only through deltas, which is what Claude Code's own
accumulator insists on. It knows nothing of the upstream's wire format: the parsers in
`upstream/` feed it `conversion.deltas`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

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
from claude_proxy.conversion.ids import new_message_id, to_anthropic_id
from claude_proxy.conversion.safeguards import results
from claude_proxy.conversion.stop_sequences import StopMatcher
from claude_proxy.conversion.tool_calls import CallCollector, CollectedCall
from claude_proxy.conversion.usage import anthropic_usage, estimate_tokens, reasoning_tokens
from claude_proxy.errors import ProxyError, error_from_payload

logger = logging.getLogger("claude_proxy.conversion")

Event = dict[str, Any]

REFUSAL_DETAILS: dict[str, Any] = {
    "type": "refusal", "category": None,
    "explanation": "The upstream provider's content filter stopped the answer.",
}
"""`stop_details` of a refusal (Anthropic's `BetaRefusalStopDetails`): an upstream filter
names no Anthropic policy category, so `category` is null."""


class Sign(Protocol):
    """Signs a thinking block: its text and the opaque state it carries (see signatures.py)."""

    def __call__(self, thinking: str, opaque: list[dict[str, Any]] = ..., /) -> str: ...


def message_start(message_id: str, model: str, input_tokens: int) -> Event:
    """The `message_start` event: the message, empty, with the input estimate."""
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    return {"type": "message_start", "message": message}


def _block_start(index: int, block: dict[str, Any]) -> Event:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, delta: dict[str, Any]) -> Event:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_stop(index: int) -> Event:
    return {"type": "content_block_stop", "index": index}


class _ReasoningBlockState:
    """One thinking block: start, thinking_deltas, then one signature_delta and the stop.

    The signature covers the whole text and the opaque reasoning the upstream wants back, so a
    later request can prove the block is ours and restore that state. It is sent once, whole:
    Claude Code replaces (does not append) a signature on each signature_delta.
    """

    kind = "thinking"

    def __init__(self, index: int, sign: Sign, *, omitted: bool = False) -> None:
        self.index = index
        self._sign = sign
        self._omitted = omitted
        """`thinking.display: "omitted"`: no thinking_delta; the text travels in the
        signature (`sign` was made with `hidden=True`)."""
        self._pieces: list[str] = []
        self.opaque: list[dict[str, Any]] = []

    def start(self) -> Event:
        return _block_start(self.index, {"type": "thinking", "thinking": "", "signature": ""})

    def add(self, text: str) -> list[Event]:
        self._pieces.append(text)
        if self._omitted:
            return []
        return [_block_delta(self.index, {"type": "thinking_delta", "thinking": text})]

    def close(self) -> list[Event]:
        signature = self._sign("".join(self._pieces), self.opaque)
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


class _ToolBlockState:
    kind = "tool"

    def __init__(self, index: int, call: CollectedCall) -> None:
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


class BlockMachine:
    """Deltas in, Anthropic events out, for one response."""

    def __init__(self, model: str, *, input_tokens: int, sign: Sign,
                 message_id: str | None = None, stop_sequences: Sequence[str] = (),
                 omit_thinking: bool = False) -> None:
        """`stop_sequences`: the client's, matched in the text (conversion/stop_sequences.py);
        once one matches, `stopped` is true and nothing after it is relayed.
        `omit_thinking` (`thinking.display: "omitted"`): thinking blocks without their text."""
        self.model = model
        self._omit_thinking = omit_thinking
        self.message_id = message_id or new_message_id()
        self._input_estimate = input_tokens
        self._stops = StopMatcher(stop_sequences) if stop_sequences else None
        self.restart(sign)
        self.delta_fields: dict[str, Any] = {}
        """More fields of the final `message_delta`'s `delta` (`safeguard_results`)."""
        self.event_fields: dict[str, Any] = {}
        """More fields of the final `message_delta` beside `delta` and `usage`
        (`context_management`): where the SDKs read them."""
        self.judge: Callable[[list[dict[str, Any]]], Awaitable[dict[str, Any]]] | None = None
        """Judges the reply's tool calls once they are complete (`settle`): the `status` of
        its `safeguard_results` (conversion/safeguards.py)."""

    def restart(self, sign: Sign) -> None:
        """The answer's state, as just after `message_start`: at the start, and again when
        an answer of which nothing was sent is replaced by another (TOOL_GUARD_REASK on a
        stream), whose thinking `sign` signs."""
        self.sign = sign
        """Signs its thinking blocks."""
        self._next_index = 0
        self._open: _Block | None = None
        self._held_whitespace = ""
        self._calls = CallCollector()
        self._tool_blocks = 0
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._streamed_chars = 0
        if self._stops is not None:
            self._stops = StopMatcher(self._stops.sequences)
        self._stop_sequence: str | None = None
        self.closed = False
        """The blocks are closed: the content is complete."""
        self.stopped = False
        """A stop sequence matched: the answer is complete, the upstream may be cancelled."""

    # ------------------------------------------------------------ public API

    def start(self) -> list[Event]:
        return [message_start(self.message_id, self.model, self._input_estimate)]

    def apply(self, deltas: Iterable[Delta]) -> list[Event]:
        """The events for some deltas. An UpstreamFailure raises ProxyError (the events of
        the deltas before it are lost to the caller; parsers put failures first)."""
        events: list[Event] = []
        for delta in deltas:
            self._apply(delta, events)
        return events

    def finish(self) -> list[Event]:
        """Close everything and end the message: message_delta, then message_stop."""
        events = self.close()
        delta: dict[str, Any] = {"stop_reason": self.stop_reason(),
                                 "stop_sequence": self._stop_sequence}
        if delta["stop_reason"] == "refusal":
            delta["stop_details"] = dict(REFUSAL_DETAILS)
        delta.update(self.delta_fields)
        events.append({"type": "message_delta", "delta": delta, "usage": self.usage(),
                       **self.event_fields})
        events.append({"type": "message_stop"})
        return events

    def close(self) -> list[Event]:
        """Close every block (once): the content is then complete (`tool_uses`), and what
        is said about it (`delta_fields`) can still be settled before `finish`."""
        if self.closed:
            return []
        self.closed = True
        events: list[Event] = []
        self._release_held(events)
        events.extend(self._close_all())
        if self._next_index == 0 and self._held_whitespace:
            # A whitespace-only answer is still the answer.
            self._open_text(self._held_whitespace, events)
            events.extend(self._close_open())
        return events

    async def settle(self) -> list[Event]:
        """`close`, then what only the complete content allows: the judge's verdicts on its
        tool calls. `finish` then ends the message with them."""
        events = self.close()
        if self.judge is not None:
            self.delta_fields["safeguard_results"] = results(await self.judge(self.tool_uses()))
            self.judge = None
        return events

    def tool_uses(self) -> list[dict[str, Any]]:
        """The tool_use blocks sent so far (id, name, input), in order."""
        return self._calls.uses()

    def keep_alive(self) -> Event:
        """An event that adds nothing, for a client's idle watchdog while content is held
        back: an empty `input_json_delta` on an open tool_use block (Anthropic's own streams
        begin each call with one), which Claude Code counts as an event; else a `ping`, which
        its SDK drops before any watchdog sees it (docs/tool-calls.md)."""
        if isinstance(self._open, _ToolBlockState):
            return _block_delta(self._open.index, {"type": "input_json_delta",
                                                   "partial_json": ""})
        return {"type": "ping"}

    def fail(self, error: ProxyError) -> list[Event]:
        """Close every open block, then one `error` event (the stream then ends)."""
        events = self._close_all()
        events.append(error.body())
        return events

    def stop_reason(self) -> str:
        """The upstream's reason; a tool call made is `tool_use`, unless the output limit
        cut the answer (a cut tool call must not look complete) or a stop sequence ended it."""
        if self._stop_reason in ("max_tokens", "stop_sequence"):
            return self._stop_reason
        if self._tool_blocks:
            return "tool_use"
        reason = self._stop_reason or "end_turn"
        return "end_turn" if reason == "tool_use" else reason

    @property
    def saw_finish_reason(self) -> bool:
        return self._stop_reason is not None

    def reasoning_tokens(self) -> int:
        return reasoning_tokens(self._usage) if self._usage is not None else 0

    def usage(self) -> dict[str, int]:
        """The upstream's usage; its input, where it reported none, the estimate."""
        if self._usage is not None:
            usage = anthropic_usage(self._usage)
            if "prompt_tokens" not in self._usage:
                usage["input_tokens"] = self._input_estimate
            return usage
        return {
            "input_tokens": self._input_estimate,
            "output_tokens": estimate_tokens(self._streamed_chars),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    # ------------------------------------------------------------ deltas

    def _apply(self, delta: Delta, events: list[Event]) -> None:
        if self.stopped:
            if isinstance(delta, Usage):
                self._usage = delta.usage
            return  # what the upstream said after the stop sequence is not the answer
        if isinstance(delta, Text):
            self._matched_text(delta.text, events)
            return
        if not isinstance(delta, Usage | UpstreamFailure):
            self._release_held(events)  # other content, or the end: no sequence there
        if isinstance(delta, ReasoningText):
            self._streamed_chars += len(delta.text)
            if delta.visible:
                self._add_thinking(delta.text, events)
            else:
                logger.debug("removed %d characters of inline thinking", len(delta.text))
        elif isinstance(delta, ToolCall):
            self._add_tool_piece(delta, events)
        elif isinstance(delta, OpaqueReasoning):
            self._thinking_block(events).opaque.append(delta.item)
        elif isinstance(delta, Usage):
            self._usage = delta.usage
        elif isinstance(delta, Finish):
            self._finish_reason(delta)
        elif isinstance(delta, UpstreamFailure):
            raise error_from_payload(delta.error)

    def _finish_reason(self, finish: Finish) -> None:
        self._stop_reason = finish.stop_reason
        stops = self._stops.sequences if self._stops is not None else ()
        if finish.stop_sequence is not None and finish.stop_sequence in stops:
            # The upstream stopped at one of the client's sequences and said which (vLLM).
            self._stop_reason, self._stop_sequence = "stop_sequence", finish.stop_sequence

    def _matched_text(self, text: str, events: list[Event]) -> None:
        """Text through the stop-sequence matcher: what may be relayed goes out; a match
        ends the answer there."""
        if self._stops is None:
            self._add_text(text, events)
            return
        relayed, sequence = self._stops.feed(text)
        if relayed:
            self._add_text(relayed, events)
        if sequence is not None:
            self.stopped = True
            self._stop_reason, self._stop_sequence = "stop_sequence", sequence

    def _release_held(self, events: list[Event]) -> None:
        """Text held back as a possible start of a stop sequence, relayed after all."""
        held = self._stops.flush() if self._stops is not None else ""
        if held:
            self._add_text(held, events)

    def _thinking_block(self, events: list[Event]) -> _ReasoningBlockState:
        """The open thinking block, or a new one (reasoning resuming after text or a tool
        call starts a new block: interleaved thinking)."""
        if not isinstance(self._open, _ReasoningBlockState):
            self._held_whitespace = ""
            events.extend(self._close_open())
            self._open = _ReasoningBlockState(self._take_index(), self.sign,
                                              omitted=self._omit_thinking)
            events.append(self._open.start())
        return self._open

    def _add_thinking(self, text: str, events: list[Event]) -> None:
        events.extend(self._thinking_block(events).add(text))

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

    def _add_tool_piece(self, piece: ToolCall, events: list[Event]) -> None:
        self._calls.add(piece)
        self._streamed_chars += len(piece.arguments)
        self._pump_tools(events)

    def _pump_tools(self, events: list[Event]) -> None:
        """Stream the open tool call; close it once it is done, or move on to the next queued
        call once the open one's arguments are a complete JSON document (calls may arrive
        interleaved)."""
        while True:
            if isinstance(self._open, _ToolBlockState):
                events.extend(self._open.pending_deltas())
                call = self._open.call
                if not call.done and not (
                        self._calls.queued and self._calls.queued[0].name and call.is_complete()):
                    return
                events.extend(self._close_open())
            if not self._calls.queued or not self._calls.queued[0].name:
                return
            self._open_next_tool(events)

    def _open_next_tool(self, events: list[Event]) -> None:
        call = self._calls.queued.pop(0)
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
        self._calls.drop_unnamed()
        while self._calls.queued:
            self._open_next_tool(events)
            events.extend(self._close_open())
        return events
