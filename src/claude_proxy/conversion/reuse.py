"""A session's next turn converted only where it changed, and written only where it changed.

Claude Code sends the whole conversation on every turn, and the parse already reuses the
messages a request shares with the session's last one (server/incremental.py): they are the
very objects parsed before. Converting them again would give the very messages converted
before, and writing those the very bytes written before. So a conversation keeps its last
conversion (`Slot`, with the session's remembered body, in the state layer's memo), and the
next request takes from it the converted messages of the longest beginning of its messages
that are the same objects, and the bytes they were written as; only the rest is converted
and written.

Exact, not a guess: the reuse gives the very bytes a whole conversion gives
(tests/test_reuse.py checks it on Claude Code's tool loop and on generated sessions). That
holds because every step that looks at the conversation either works on each message alone
or says here how it depends on where a message is:

- steps before the conversion (`context_edits.apply`, the web-search and tool-search replay,
  `restore_hidden_thinking`, `expand_tool_references`, `without_media`) change a message only
  by putting a copy in its place: a message they change is no longer the object converted
  before, so the reuse stops there. Context edits that clear old tool results therefore leave
  little to reuse; nothing wrong is reused.
- `convert_messages` converts each message alone (the system prompt first; `keep_parts` is
  the provider's and model's). Conversion builds new objects and changes no client message.
- reasoning passed back (`attach_passback`, `attach_reasoning_details`), opaque reasoning
  (`attach_opaque_details`), tool-call extras and Gemini's skipped signatures work on each
  assistant turn alone, given the provider, model and key (the signer's origin) and whether
  the model refused the reasoning fields. Whether any message carries a field (which the
  `extras` list) is kept per message as the first one that does (`Converted.carrying`).
- the cache step strips every marker (`automatic`, `off`: each message alone) or keeps the
  last four in prompt order (`breakpoints`): a marker's fate depends on the markers after
  it, so with breakpoints the reuse stops at the first message whose conversion held one
  (`Converted.marked`); Claude Code marks only the last message. Later system messages
  become user messages where the template hoists them: each alone, but never the first
  message, the system prompt (so the reuse needs one).
- the refusals that rewrite the conversation as a whole (the alternation fold, tool turns as
  text) or in place (breakpoints, system messages) turn the reuse off for their model.
- the token estimate is read off the client's bytes, and the census resumes after the
  remembered messages (conversion/census.py): neither converts anything.

What a conversion depended on besides the messages (`Context`: the provider's settings, the
model, whether the reasoning fields were refused, whether there is a system prompt) is kept
with it: a request converted for another provider (a failover, another route), after a
refusal was learned, or with other settings, converts whole, and its conversion is the one
kept from then on.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import orjson

from claude_proxy.config.settings import ProviderSettings

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Context:
    """What a conversion depended on besides the client's messages. The settings object
    stands for its provider (each provider has its own, and the recognised profile's copy is
    kept per provider), and with the model for the origin whose opaque reasoning goes back."""

    settings: ProviderSettings
    model: str
    without_reasoning: bool
    has_system: bool

    def same(self, other: Context) -> bool:
        return (self.settings is other.settings and self.model == other.model
                and self.without_reasoning == other.without_reasoning
                and self.has_system == other.has_system)


Buffer = bytes | memoryview

MOST_PIECES = 64
"""A shared prefix in more pieces than this is joined into one: each turn adds one (its new
messages'), and a socket's `writev` takes at most 1024."""


class Spliced:
    """A body's JSON as the pieces it was written in, never joined: the shared prefix's are
    views of the earlier body's pieces, handed to the socket as they are (one `writelines`,
    upstream/transport.py). Joining them made a fresh copy of the whole conversation on
    every turn (1 MB at 850 KB, in fresh memory: the inspector keeps the bodies it showed;
    without it, 850 KB turns cost 0.65–0.67× FLOOR against 0.70–0.72, four A/B pairs);
    `bytes()` joins it for whoever needs it whole (the inspector, a test's mock transport)."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: list[Buffer], size: int) -> None:
        self.pieces = pieces
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def cut(self, start: int, end: int) -> list[Buffer]:
        """Bytes `start` to `end` as views of the pieces (none copied)."""
        taken: list[Buffer] = []
        at = 0
        for piece in self.pieces:
            after = at + len(piece)
            if after > start and at < end:
                taken.append(piece if start <= at and after <= end
                             else memoryview(piece)[max(start - at, 0):end - at])
            at = after
        return taken


@dataclass(slots=True)
class Written:
    """The body as it was sent: its JSON, where the first client message's converted
    messages start in it (after the system prompt's), and where each one's end."""

    json: Spliced
    start: int
    ends: list[int]


@dataclass(slots=True)
class Converted:
    """One request's conversion, as the next can reuse it. `sources`: the client messages
    converted, as objects; `ends[i]`: how many converted messages (the system prompt's left
    out) the first i + 1 of them made; `messages`: those converted messages as sent (after
    every step, which nothing changes afterwards); `carrying[field]`: the first source whose
    messages carry `field`; `marked`: the first whose conversion held a cache marker."""

    context: Context
    sources: list[Any]
    ends: list[int]
    messages: list[Message]
    carrying: dict[str, int]
    marked: int
    written: Written | None = None


class Slot:
    """One conversation's last conversion (kept with its remembered body): filled by each
    request's conversion, and by the body's writing once it is sent."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: Converted | None = None


@dataclass(slots=True)
class Prefix:
    """The beginning of a request's messages that an earlier conversion converted: its
    first `count` sources, and their converted messages."""

    converted: Converted
    count: int

    @property
    def messages(self) -> list[Message]:
        return self.converted.messages[:self.converted.ends[self.count - 1]]

    def carries(self, field: str) -> bool:
        return self.converted.carrying.get(field, self.count) < self.count


def reusable(slot: Slot | None, sources: list[Any], context: Context) -> Prefix | None:
    """The longest beginning of `sources` that the slot's last conversion converted in the
    same context, when it was written (one pointer compare per message)."""
    last = slot.last if slot is not None else None
    if last is None or last.written is None or not context.has_system \
            or not last.context.same(context):
        return None
    limit = min(len(sources), len(last.sources), last.marked)
    same = list(map(operator.is_, sources[:limit], last.sources[:limit]))
    count = same.index(False) if False in same else limit
    return Prefix(last, count) if count else None


def first_holding(messages: list[Message], ends: list[int], field: str) -> int | None:
    """The index of the first source (by `ends`, as `Converted.ends`) whose converted
    messages (`messages`, the system prompt's left out) carry `field`."""
    for position, message in enumerate(messages):
        if field in message:
            return bisect_right(ends, position)
    return None


def first_marked(messages: list[Message], ends: list[int]) -> int | None:
    """The index of the first source whose converted messages hold a cache marker."""
    for position, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list) and any(
                isinstance(part, dict) and "cache_control" in part for part in content):
            return bisect_right(ends, position)
    return None


class Prewritten(dict[str, Any]):
    """An upstream body whose conversion a session's next request can reuse: written with
    the bytes of the messages it shares with the conversation's last one (`written`), and
    kept so in the slot for the next."""

    __slots__ = ("converted", "json", "prefix", "slot")

    def __init__(self, body: dict[str, Any], converted: Converted, prefix: Prefix | None,
                 slot: Slot) -> None:
        super().__init__(body)
        self.converted = converted
        self.prefix = prefix
        self.slot = slot
        self.json: bytes | Spliced | None = None

    def written(self) -> bytes | Spliced:
        """The body as `orjson.dumps` writes it. The shared messages' bytes are the earlier
        body's (its pieces, not copied); every other value is written now, as orjson writes
        it. A body whose messages are no longer those converted (changed after the
        conversion) is written whole and left out of the slot."""
        if self.json is None:
            converted = self.converted
            messages = self.get("messages")
            spliced = None
            if (list(self)[:2] == ["model", "messages"] and isinstance(messages, list)
                    and len(messages) == len(converted.messages) + 1):
                spliced = _spliced(self, messages[0], converted, self.prefix)
            if spliced is None:
                self.json = orjson.dumps(self)
            else:
                self.json, converted.written = spliced
                self.slot.last = converted
        return self.json


_MESSAGES = b',"messages":['


def _spliced(body: dict[str, Any], system: Message, converted: Converted,
             prefix: Prefix | None) -> tuple[Spliced, Written] | None:
    """`orjson.dumps(body)` in pieces: everything but the messages, the system prompt's, the
    prefix's (views of the earlier body's), then the other messages' (joined: a few KB); and
    where each source's end."""
    around = orjson.dumps({**body, "messages": []})
    cut = len(b'{"model":') + len(orjson.dumps(body["model"])) + len(_MESSAGES)
    if around[cut - len(_MESSAGES):cut + 1] != _MESSAGES + b"]":
        return None
    head = orjson.dumps(system)
    view = memoryview(around)
    pieces: list[Buffer] = [view[:cut], head]
    start = at = cut + len(head)
    ends: list[int] = []
    first = 0
    if prefix is not None:
        earlier = prefix.converted.written
        assert earlier is not None  # a prefix is only taken from a written conversion
        shared = earlier.json.cut(earlier.start, earlier.ends[prefix.count - 1])
        pieces += [b"".join(shared)] if len(shared) > MOST_PIECES else shared
        ends = [end - earlier.start + start for end in earlier.ends[:prefix.count]]
        at, first = ends[-1], prefix.count
    messages, counts = converted.messages, converted.ends
    new: list[bytes] = []
    for index in range(first, len(counts)):
        for message in messages[counts[index - 1] if index else 0:counts[index]]:
            written = orjson.dumps(message)
            new += (b",", written)
            at += 1 + len(written)
        ends.append(at)
    if new:
        pieces.append(b"".join(new))
    pieces.append(view[cut:])
    json = Spliced(pieces, at + len(around) - cut)
    return json, Written(json, start, ends)
