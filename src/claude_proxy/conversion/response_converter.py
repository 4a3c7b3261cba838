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

from claude_proxy.conversion.blocks import BlockMachine, Event, Sign
from claude_proxy.conversion.deltas import Delta
from claude_proxy.conversion.tool_calls import tool_input
from claude_proxy.conversion.tool_guard import HOLD_PING_SECONDS, ToolGuard
from claude_proxy.conversion.usage import summed
from claude_proxy.errors import ProxyError

__all__ = ["StreamConverter", "WireParser", "collect_message", "convert_chunks"]

REPLY_HEAD: Event = {"type": "message_start", "message": {}}
"""The head `collect_message` reads a held reply's blocks after."""


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
        self._held: list[Event] | None = None
        """The events of a reply held back (`hold_reply`), None when nothing is."""
        self._earlier: tuple[dict[str, Any], int] | None = None
        """The usage and reasoning tokens of an answer another replaced (`resume`)."""

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
            return self._released()
        events = self.apply(self._flushed())
        return self._released() + events + super().close()

    def fail(self, error: ProxyError) -> list[Event]:
        events = self.apply(self._flushed(failed=True))
        return self._released() + events + super().fail(error)

    # ------------------------------------------------------------ TOOL_GUARD_REASK

    def hold_reply(self) -> None:
        """Hold the reply back for as long as its only content is tool calls, so that it can
        still be asked again (TOOL_GUARD_REASK on a stream): no call's block starts early,
        and only keep-alives go out until the answer ends (`end_answer`) or other content
        comes (a block of text or thinking: then all that was held goes out at once)."""
        self._held = []
        if self.guard is not None:
            self.guard.start_early = False
        # This instance's `feed` holds the events back (no test per chunk in the class's).
        self.feed = self._feed_held  # type: ignore[method-assign]

    @property
    def holds_reply(self) -> bool:
        """The reply is held back still: nothing but tool calls has come."""
        return self._held is not None

    def _feed_held(self, chunk: dict[str, Any]) -> list[Event]:
        """`feed` while the reply is held: its events kept (keep-alives too: only bytes
        would reach a client's watchdog, and the stream's comments are bytes), until one
        begins other content than a tool call; then all go out."""
        events = StreamConverter.feed(self, chunk)
        if any(event["type"] == "content_block_start"
               and event["content_block"]["type"] != "tool_use" for event in events):
            return self._released() + events
        assert self._held is not None
        self._held += events
        return []

    def _released(self) -> list[Event]:
        """What was held back, once; `feed` is the class's again."""
        held, self._held = self._held, None
        if held is None:
            return []
        del self.feed
        return held

    def end_answer(self) -> dict[str, Any] | None:
        """The upstream's answer ended while the reply was held: its calls are closed (still
        held), and the reply as the client would get it (`content`, `stop_reason`) comes
        back when tool calls are all it holds; None otherwise. What is held goes out at
        `close`, unless `resume` replaces it."""
        if self._held is None or self.closed:
            return None
        self._held += self.apply(self._flushed()) + super().close()
        content = collect_message([REPLY_HEAD, *self._held])["content"]
        if not content or any(block["type"] != "tool_use" for block in content):
            return None
        return {"content": content, "stop_reason": self.stop_reason()}

    def resume(self, fresh: StreamConverter) -> None:
        """Go on with another answer in place of the one held back (nothing of it was sent):
        the parser, guard and signatures of `fresh` (made for its attempt), blocks from
        index 0 again in the same message, and this answer's usage counted with it."""
        self._earlier = (self.usage(), self.reasoning_tokens())
        self.parser, self.guard = fresh.parser, fresh.guard
        self.input_tokens, self.window = fresh.input_tokens, fresh.window
        self._released()  # the first answer's events, never sent
        self._quiet_since = None
        self.restart(fresh.sign)

    def usage(self) -> dict[str, int]:
        usage = super().usage()
        return usage if self._earlier is None else summed(usage, self._earlier[0])

    def reasoning_tokens(self) -> int:
        earlier = 0 if self._earlier is None else self._earlier[1]
        return super().reasoning_tokens() + earlier

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
