"""The upstream's tool calls of one answer, collected from their fragments: calls may arrive
interleaved, their ids and names late. The block state machine (`blocks.py`) opens each one's
`tool_use` block in turn and owns its index; this keeps only what the calls said.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from claude_proxy.conversion.deltas import ToolCall

logger = logging.getLogger("claude_proxy.conversion")


@dataclass
class CollectedCall:
    """One upstream tool call, collected from its fragments."""

    upstream_id: str
    name: str
    fragments: list[str] = field(default_factory=list)
    sent: int = 0
    anthropic_id: str = ""
    done: bool = False
    """No more of it will come (`ToolCall.last`): its block may close at once."""

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


def tool_input(arguments: str) -> Any:
    """A tool call's `input` in a whole Message, from the text its `input_json` deltas carry:
    the object that text is; `{}` for no text at all (what the stream sends then); any other
    text (not JSON, or JSON but no object) as it came, a string. Claude Code reads a string
    `input` as it reads a streamed call's text, so its own precise error ("could not be parsed
    as JSON") reaches the model, where `{}` would tell it of a missing parameter instead
    (docs/tool-calls.md)."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


class CallCollector:
    """The answer's tool calls by the parser's key, and those whose blocks have not opened
    yet, in order of arrival."""

    def __init__(self) -> None:
        self.calls: dict[int, CollectedCall] = {}
        self.queued: list[CollectedCall] = []

    def add(self, piece: ToolCall) -> None:
        call = self.calls.get(piece.key)
        if call is None:
            call = CollectedCall(upstream_id=piece.id, name="")
            self.calls[piece.key] = call
            self.queued.append(call)
        elif piece.id and not call.upstream_id:
            call.upstream_id = piece.id
        if piece.name and not call.name:
            call.name = piece.name
        if piece.arguments:
            call.fragments.append(piece.arguments)
        call.done = call.done or piece.last

    def drop_unnamed(self) -> None:
        """At the end: a queued call that never got a name cannot become a block."""
        for call in list(self.queued):
            if not call.name:
                logger.warning("upstream tool call without a name dropped")
                self.queued.remove(call)

    def uses(self) -> list[dict[str, Any]]:
        """The tool_use blocks sent so far (id, name, input), in order."""
        uses = []
        for call in self.calls.values():
            if not call.anthropic_id:
                continue
            uses.append({"id": call.anthropic_id, "name": call.name,
                         "input": tool_input(call.arguments())})
        return uses
