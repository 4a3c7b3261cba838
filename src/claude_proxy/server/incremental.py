"""A session's request body parsed again only where it changed.

Claude Code sends the whole conversation on every turn. Late in a session that is 800 KB of
JSON, and all of it but the last few KB came in the turn before, byte for byte. (The cache
marker moves to the new last block, so the previous last message changes too.) Parsing is
the largest single cost of such a request: 0.5 to 1.2 ms of about 6. So when the session's
previous body is remembered (state/memo.py), the messages it shares are taken from it as
they were parsed, and only the rest of the body is parsed: the new messages, and what
follows the conversation (system prompt, tools, settings).

The reuse is exact, not a guess:
- a message is reused only when every byte up to its end equals the previous body's;
- a message's end is known only where orjson's serialization of the parsed message is found
  in the bytes, right where it should be. Claude Code's `JSON.stringify` writes the same
  bytes. A client that writes JSON with spaces gets no reuse, and nothing else changes.
- anything unusual (a different start, a second "messages" key, invalid JSON) is parsed
  whole, as before.

Later requests share the reused objects, so nothing may change them in place. The conversion
builds new objects; tests/test_incremental.py replays sessions through the proxy and checks
the remembered messages against their bytes after every turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

REUSE_FROM = 32 * 1024
"""Bodies shorter than this are parsed whole and not remembered: there is nothing to save
(at 68 KB, where the system prompt and tools are most of the body, a next turn's parse
already costs about what a whole one does). Low enough that a Claude Code session's first
request (50 KB) is remembered, and its later ones find their ends from there."""

REMEMBER_FOR = 900.0
"""Seconds a session's body is remembered after its last request (turns come seconds
apart; a session back after a long pause is parsed whole once)."""

HELD_PER_BYTE = 2.5
"""What a remembered body holds per byte of its JSON: the bytes, and the parsed messages
(1.2 to 1.8 bytes of objects per byte, measured with tracemalloc at 800 and 70 KB, on
Claude Code's conversations; a body of many tiny values holds more per byte, which this
weight does not see)."""

_OPEN = b'"messages":['
_SENTINEL = "\x00"
_SENTINEL_KEY = b'"\\u0000":'
"""The remaining messages' key in the rest's document: a body cannot have it but by writing
it so, and then it is parsed whole."""
_DOC_START = b"{" + _SENTINEL_KEY + b"["


@dataclass(slots=True)
class ParsedBody:
    """A body as a later one can reuse it: its bytes, where its first message starts, the
    parsed messages, where each of the first `len(ends)` messages ends in `raw`, and how
    many of them it took from the body before. `running`: each beginning's census of block
    types once the messages are checked (conversion/census.py), for the next body's
    check to start after the messages it shares."""

    raw: bytes
    start: int
    messages: list[Any]
    ends: list[int]
    shared: int = 0
    running: list[frozenset[str]] | None = None

    @property
    def weight(self) -> int:
        return int(len(self.raw) * HELD_PER_BYTE)


def parse(raw: bytes, previous: ParsedBody | None) -> tuple[Any, ParsedBody | None]:
    """The body, exactly as `orjson.loads(raw)` gives it (raising its JSONDecodeError), and
    what the session's next body can reuse (None when there is nothing to remember)."""
    if previous is None or len(raw) < REUSE_FROM:
        return _whole(raw)
    shared = _shared(raw, previous)
    if not shared:
        return _whole(raw)
    end = previous.ends[shared - 1]
    rest = _rest(raw, end)
    if rest is None:
        return _whole(raw)
    messages = previous.messages[:shared] + rest.pop(_SENTINEL)
    body = {**_head_of(raw, previous.start), "messages": messages, **rest}
    ends = _ends(raw, messages, shared, end, previous.ends[:shared])
    return body, ParsedBody(raw, previous.start, messages, ends, shared)


def _whole(raw: bytes) -> tuple[Any, ParsedBody | None]:
    """The body parsed whole, and remembered when its conversation's bytes can be found."""
    body = orjson.loads(raw)
    if len(raw) < REUSE_FROM or not isinstance(body, dict):
        return body, None
    messages = body.get("messages")
    head = _head(body)
    if not isinstance(messages, list) or head is None:
        return body, None
    start = _head_bytes(head)
    if start is None or not raw.startswith(start):
        return body, None
    ends = _ends(raw, messages, 0, len(start), [])
    return body, (ParsedBody(raw, len(start), messages, ends) if ends else None)


def _head(body: dict[str, Any]) -> dict[str, Any] | None:
    """The keys before "messages", in order (None without "messages")."""
    head: dict[str, Any] = {}
    for key, value in body.items():
        if key == "messages":
            return head
        head[key] = value
    return None


def _head_of(raw: bytes, start: int) -> dict[str, Any]:
    """The keys before "messages" parsed again (a few bytes), so that no request shares
    their values with another."""
    written = raw[:start - len(_OPEN)]
    head: dict[str, Any] = orjson.loads(written[:-1] + b"}" if written.endswith(b",")
                                        else written + b"}")
    return head


def _head_bytes(head: dict[str, Any]) -> bytes | None:
    """How the body starts when written compactly, up to the first message."""
    values = [_written(value) for value in head.values()]
    if None in values:
        return None
    pairs = b"".join(orjson.dumps(key) + b":" + value + b","
                     for key, value in zip(head, values, strict=True) if value is not None)
    return b"{" + pairs + _OPEN


def _written(value: Any) -> bytes | None:
    """`value` as orjson writes it; None for what it parses but cannot write (nested
    deeper than its 255 levels): such a message is simply not remembered."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None


def _ends(raw: bytes, messages: list[Any], first: int, at: int, ends: list[int]) -> list[int]:
    """`ends` extended with where each message from `first` on ends in `raw` (`at`: where
    the one before ended, or the first starts), up to the first not found as written."""
    for index in range(first, len(messages)):
        if index:
            if raw[at:at + 1] != b",":
                break
            at += 1
        written = _written(messages[index])
        if written is None or not raw.startswith(written, at):
            break
        at += len(written)
        ends.append(at)
    return ends


def _shared(raw: bytes, previous: ParsedBody) -> int:
    """How many of the previous body's first messages `raw` repeats byte for byte, each
    where it was. Claude Code's next turn repeats all but the last (its marker moved): one
    memcmp over them says so; otherwise a search over the messages, each byte compared
    about once."""
    ends, view = previous.ends, memoryview(previous.raw)

    def same(first: int, last: int) -> bool:  # messages first..last-1, the ones before equal
        start = ends[first - 1] if first else 0
        return raw.startswith(view[start:ends[last - 1]], start)

    likely = len(ends) - 1
    if not likely:
        return 1 if same(0, 1) else 0
    if same(0, likely):
        return len(ends) if same(likely, len(ends)) else likely
    low, high = 0, likely  # the first `low` are equal; the first `high` are not all
    while high - low > 1:
        middle = (low + high) // 2
        if same(low, middle):
            low = middle
        else:
            high = middle
    return low


def _rest(raw: bytes, end: int) -> dict[str, Any] | None:
    """The body after its first messages (which end at `end`) parsed alone, as an object
    whose "messages" are the remaining ones; None when that would not be exact."""
    follows = raw[end:end + 1]
    if follows not in (b",", b"]"):
        return None
    document = _DOC_START + memoryview(raw)[end + 1 if follows == b"," else end:]
    if document.find(_SENTINEL_KEY, len(_DOC_START)) != -1:
        return None
    try:
        rest = orjson.loads(document)
    except orjson.JSONDecodeError:
        return None  # the whole body's own error is the one to report
    if not isinstance(rest, dict) or "messages" in rest:
        return None  # a second "messages" key, which wins: the whole body says which
    return rest
