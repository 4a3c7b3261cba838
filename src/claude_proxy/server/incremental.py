"""A session's request body parsed again only where it changed.

Claude Code sends the whole conversation on every turn. Late in a session that is 800 KB of
JSON, and all of it but the last few KB came in the turn before, byte for byte. (The cache
marker moves to the new last block, so the previous last message changes too.) Parsing is
the largest single cost of such a request: 0.5 to 1.2 ms of about 6. So when the session's
previous body is remembered (state/memo.py), the messages it shares are taken from it as
they were parsed, and so is what follows the conversation (system prompt, tools, settings:
40 KB of every Claude Code body) when the body ends with the same bytes. Only the rest is
parsed: the new messages, and the one whose marker moved.

The reuse is exact, not a guess:
- a message is reused only when every byte up to its end equals the previous body's;
- a message's end is known only where orjson's serialization of the parsed message is found
  in the bytes, right where it should be. Claude Code's `JSON.stringify` writes the same
  bytes. A client that writes JSON with spaces gets no reuse, and nothing else changes.
- what follows the conversation is reused only when the body ends with its very bytes
  (from the `]` that closes the messages on) and the bytes before them parse as the rest of
  the messages' array;
- anything unusual (a different start, a second "messages" key, invalid JSON) is parsed
  whole, as before.

Later requests share the reused objects, so nothing may change them in place. The conversion
builds new objects; tests/test_incremental.py replays sessions through the proxy and checks
the remembered messages, and what follows them, against their bytes after every turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from claude_proxy.conversion.reuse import Slot

REUSE_FROM = 32 * 1024
"""Bodies shorter than this are parsed whole and not remembered (orjson parses 32 KB in
about 20 µs). Low enough that a Claude Code session's first request (50 KB) is
remembered, and its later ones reuse it."""

REMEMBER_FOR = 900.0
"""Seconds a session's body is remembered after its last request (turns come seconds
apart; a session back after a long pause is parsed whole once)."""

HELD_PER_BYTE = 4.0
"""What a remembered body holds per byte of its JSON: the bytes, the parsed messages (1.2 to
1.8 bytes of objects per byte, measured with tracemalloc at 800 and 70 KB, on Claude Code's
conversations), and their last conversion with the upstream body written from it
(conversion/reuse.py: 1.25 to 1.5 bytes per byte, measured the same way); a body of many
tiny values holds more per byte, which this weight does not see."""

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
    known: list[frozenset[str]] = field(default_factory=list)
    """The running census of the `shared` messages, from the body they were taken from."""
    running: list[frozenset[str]] | None = None
    rest: dict[str, Any] | None = None
    """The keys after the conversation (system prompt, tools, settings) as parsed, when every
    message's end is known: then their bytes are those from the last end on (the `]` that
    closes the messages, `raw[ends[-1]:]`)."""
    turns: Slot = field(default_factory=Slot)
    """The conversation's last conversion (conversion/reuse.py): a body that goes on from
    this one shares it."""
    rest_known: bool = False
    """Whether `rest` is the very objects of the body before, whose validation passed (its
    `running` set): they are not checked again (server/requests.py)."""

    @property
    def weight(self) -> int:
        return int(len(self.raw) * HELD_PER_BYTE)


KEPT_PER_SESSION = 4
"""Bodies kept per session: Claude Code sends its subagents' requests under the session's
id, so a session holds several conversations at once (the main one, and a subagent's
while it works); with one body kept they would take turns to miss."""


class SessionBodies:
    """A session's last bodies, one per conversation, the most recently used first. (A
    conversation's second request shares no message with its first, whose only message
    had the cache marker: the first stays beside it until it is the oldest.)"""

    __slots__ = ("bodies",)

    def __init__(self) -> None:
        self.bodies: list[ParsedBody] = []

    @property
    def weight(self) -> int:
        return sum(body.weight for body in self.bodies)

    def parse(self, raw: bytes) -> tuple[Any, ParsedBody | None]:
        """`parse` against the kept body that shares the most messages with `raw`; what
        can be reused then replaces that body (or joins them, the oldest let go)."""
        previous, most = None, 0
        if len(raw) >= REUSE_FROM:
            for candidate in self.bodies:
                shared = _shared(raw, candidate)
                if shared > most:
                    previous, most = candidate, shared
        body, parsed = parse(raw, previous, most)
        if parsed is not None:
            others = [kept for kept in self.bodies if kept is not previous]
            self.bodies = [parsed, *others][:KEPT_PER_SESSION]
        return body, parsed


def parse(raw: bytes, previous: ParsedBody | None,
          shared: int | None = None) -> tuple[Any, ParsedBody | None]:
    """The body, exactly as `orjson.loads(raw)` gives it (raising its JSONDecodeError), and
    what the session's next body can reuse (None when there is nothing to remember).
    `shared`: how many of `previous`'s messages `raw` repeats, when already counted."""
    if previous is None or len(raw) < REUSE_FROM:
        return _whole(raw)
    if shared is None:
        shared = _shared(raw, previous)
    if not shared:
        return _whole(raw)
    end = previous.ends[shared - 1]
    found = _same_rest(raw, end, previous)
    rest_known = found is not None and previous.running is not None
    if found is None:
        rest = _rest(raw, end)
        if rest is None:
            return _whole(raw)
        found = rest.pop(_SENTINEL), rest
    new, rest = found
    messages = previous.messages[:shared] + new
    body = {**_head_of(raw, previous.start), "messages": messages, **rest}
    ends = _ends(raw, messages, shared, end, previous.ends[:shared])
    return body, ParsedBody(raw, previous.start, messages, ends, shared,
                            (previous.running or [])[:shared],
                            rest=rest if _all_found(raw, messages, ends) else None,
                            turns=previous.turns, rest_known=rest_known)


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
    if not ends:
        return body, None
    rest = _rest(raw, ends[-1]) if _all_found(raw, messages, ends) else None
    if rest is not None:
        del rest[_SENTINEL]
    return body, ParsedBody(raw, len(start), messages, ends, rest=rest)


def _all_found(raw: bytes, messages: list[Any], ends: list[int]) -> bool:
    """Whether every message's end is known, the last one's followed by the `]` that closes
    them (so that what follows is the keys after the conversation)."""
    return bool(ends) and len(ends) == len(messages) and raw[ends[-1]:ends[-1] + 1] == b"]"


def _same_rest(raw: bytes, end: int,
               previous: ParsedBody) -> tuple[list[Any], dict[str, Any]] | None:
    """The messages after the shared ones (which end at `end`), and the previous body's
    keys after the conversation, when this body ends with the very bytes the previous one
    ended with from its messages' `]` on: then only the new messages are parsed (Claude
    Code's system prompt and tools, 40 KB, are the same on every turn). Exact: the bytes
    between are taken only if they parse as the rest of an array."""
    if previous.rest is None:
        return None
    tail = memoryview(previous.raw)[previous.ends[-1]:]
    cut = len(raw) - len(tail)
    if cut < end or not raw.endswith(tail):
        return None
    between = raw[end:cut]
    if not between:
        return [], previous.rest
    if not between.startswith(b","):
        return None
    try:
        new = orjson.loads(b"[" + between[1:] + b"]")
    except orjson.JSONDecodeError:
        return None
    return new, previous.rest


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
