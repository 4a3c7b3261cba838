"""The internal deltas: what every upstream API's parser reduces its wire events to.

Chat Completions chunks and Responses events look nothing alike, but both carry the same few
things. Each parser turns its wire format into these; one block state machine
(`conversion/blocks.py`) turns them into Anthropic events. A new upstream API, or a new
reasoning field, is then a parser change and never a change on the Anthropic side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningText:
    """Reasoning the user may read. `visible` False: inline `<think>` text the client did
    not ask for, counted (for the output estimate) but not shown."""

    text: str
    visible: bool = True


@dataclass(frozen=True)
class OpaqueReasoning:
    """State the upstream wants back and the user must not see (an OpenAI reasoning item,
    an OpenRouter encrypted or signed `reasoning_details` entry), whole. It travels inside
    the thinking block's signature."""

    item: dict[str, Any]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolCall:
    """A piece of one tool call: `key` tells calls apart (the parser assigns it); `id` and
    `name` may come with any piece, `arguments` is the next fragment of the JSON. `last`: the
    call is complete (the upstream closed it, or the tool-call guard sends it whole)."""

    key: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    last: bool = False


@dataclass(frozen=True)
class Usage:
    """Token counts in Chat Completions' shape (`prompt_tokens`, `completion_tokens`, the
    `*_details`), the one `conversion/usage.py` reads."""

    usage: dict[str, Any]


@dataclass(frozen=True)
class Finish:
    """The upstream said why it stopped, as an Anthropic stop reason; `stop_sequence` is
    the string it stopped at when it says (vLLM's `stop_reason`, SGLang's `matched_stop`)."""

    stop_reason: str
    stop_sequence: str | None = None


@dataclass(frozen=True)
class UpstreamFailure:
    """An error announced inside the answer (an `error` chunk or event)."""

    error: Any


Delta = ReasoningText | OpaqueReasoning | Text | ToolCall | Usage | Finish | UpstreamFailure
