"""What the HTTP client must know about an upstream API's stream, and nothing more.

The client reads a stream up to its first real event before answering the client (so an error
there still has an HTTP status); which events merely announce the response, where an error
hides, and how a whole JSON answer is replayed as a stream differ per API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from claude_proxy.upstream.chat_completions import buffered_chunks

Chunk = dict[str, Any]


@dataclass(frozen=True)
class Wire:
    is_preamble: Callable[[Chunk], bool]
    """Events that only announce the response (read past them before the first byte)."""
    error_of: Callable[[Chunk], Any]
    """The error payload an event carries, or None."""
    buffered: Callable[[Chunk], Iterator[Chunk]]
    """A whole JSON answer cut into the events a stream would have had."""
    ends: Callable[[Chunk], bool] | None = None
    """The event after which nothing more comes (the Messages API's `message_stop`), for
    an API without the `[DONE]` line; None: the stream ends with `[DONE]` or the body."""


def _never(chunk: Chunk) -> bool:
    return False


def _chat_error(chunk: Chunk) -> Any:
    return chunk.get("error")


CHAT_WIRE = Wire(_never, _chat_error, buffered_chunks)
