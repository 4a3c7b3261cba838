"""An upstream answer → Anthropic stream events, and the Message those add up to.

`StreamConverter` pairs the upstream API's parser (wire events → internal deltas, in
`upstream/`), handed in by whoever chose the API, with the one block state machine
(`conversion/blocks.py`). A buffered (non-streamed) upstream answer is cut into events and fed
through the same machine, and a non-streaming client gets the Message these events add up to.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from claude_proxy.conversion.blocks import BlockMachine, Event, Sign, tool_input
from claude_proxy.conversion.deltas import Delta
from claude_proxy.conversion.tool_guard import HOLD_PING_SECONDS, ToolGuard
from claude_proxy.errors import ProxyError

__all__ = ["StreamConverter", "WireParser", "collect_message", "convert_chunks"]


class WireParser(Protocol):
    """One upstream API's response parser: its wire events in, internal deltas out."""

    def parse(self, chunk: dict[str, Any]) -> list[Delta]: ...

    def flush(self) -> list[Delta]: ...


class StreamConverter(BlockMachine):
    """Feeds upstream chunks (or events) in, gives Anthropic events out, for one response."""

    def __init__(
        self,
        model: str,
        *,
        input_tokens: int,
        sign: Sign,
        parser: WireParser,
        message_id: str | None = None,
        omit_thinking: bool = False,
        stop_sequences: Sequence[str] = (),
        window: int | None = None,
        guard: ToolGuard | None = None,
    ) -> None:
        """`parser`: the upstream API's (its options, such as `<think>` splitting, are its
        own). `stop_sequences`: the client's, matched in the text. `omit_thinking`
        (`thinking.display: "omitted"`) sends thinking blocks without their text, which `sign`
        keeps in the signature. `input_tokens` and `window` (the model's, when known) also
        size an overflow the upstream announces after the first byte. `guard`: the tool-call
        guard between the parser and the blocks (conversion/tool_guard.py), None when off."""
        super().__init__(model, input_tokens=input_tokens, sign=sign, message_id=message_id,
                         stop_sequences=stop_sequences, omit_thinking=omit_thinking)
        self.parser = parser
        self.input_tokens = input_tokens
        self.window = window
        self.guard = guard
        self._quiet_since: float | None = None
        """When the client last got nothing for a chunk while a tool call was held."""

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """Events for one upstream chunk. An `error` object in the stream raises ProxyError.
        While the guard holds a call back, an event that adds nothing (`keep_alive`) every
        HOLD_PING_SECONDS of output silence keeps the client's idle watchdog quiet."""
        guard = self.guard
        deltas = self.parser.parse(chunk)
        if guard is None or not guard.engaged(deltas):
            self._quiet_since = None
            return self.apply(deltas)
        events = self.apply(guard.apply(deltas))
        if events or not guard.holding():
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = time.monotonic()
        elif time.monotonic() - self._quiet_since >= HOLD_PING_SECONDS:
            self._quiet_since = time.monotonic()
            events.append(self.keep_alive())
        return events

    def close(self) -> list[Event]:
        if self.closed:
            return []
        events = self.apply(self._flushed())
        return events + super().close()

    def fail(self, error: ProxyError) -> list[Event]:
        events = self.apply(self._flushed(failed=True))
        return events + super().fail(error)

    def _flushed(self, *, failed: bool = False) -> list[Delta]:
        deltas = self.parser.flush()
        if self.guard is None or not self.guard.engaged(deltas):
            return deltas
        return self.guard.apply(deltas) + self.guard.flush(failed=failed)


def convert_chunks(
    chunks: Iterable[dict[str, Any]], converter: StreamConverter, *, end: bool = True
) -> list[Event]:
    """All events of a complete response, from message_start to message_stop (`end=False`:
    to the last block's stop, so the caller can `settle` before `finish`)."""
    events = converter.start()
    for chunk in chunks:
        events.extend(converter.feed(chunk))
        if converter.stopped:
            break
    events.extend(converter.finish() if end else converter.close())
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
            message.update((key, value) for key, value in event.items()
                           if key not in ("type", "delta", "usage"))
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
    block["input"] = tool_input("".join(partial_json))
