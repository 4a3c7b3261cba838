"""Which block types a conversation holds, found once a request.

Several steps ask whether the conversation holds some kind of block: the token estimate
(payloads: images, documents, signatures), the web-search replay and the tool-search replay
(their server blocks), the hidden-thinking restore (thinking), the tool-reference expansion
(`tool_reference`). Claude Code sends the whole conversation on every turn, so each asking
walked every block of hundreds of KB, five times a request, though most conversations hold
none of them. The client's messages are now a `Conversation`: a list that keeps its census
once taken, so the five questions cost one walk and four set lookups.

The census holds for the list it was taken of: no step changes the client's messages in
place (each step that changes the conversation makes a new list, a plain one, whose census
is taken again when asked).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from claude_proxy.conversion.shapes import (
    BLOCK_FIELDS,
    BLOCKS,
    MESSAGE_BLOCK,
    WRONG,
    Mismatch,
    mismatch,
)

Census = frozenset[str]


class Conversation(list[Any]):
    """The client's messages as they came, with their census once taken (`kinds`), and,
    for a session's remembered messages, the census of each of their beginnings
    (`running[i]`: the types of messages 0 to i)."""

    __slots__ = ("census", "running")

    def __init__(self, messages: list[Any]) -> None:
        super().__init__(messages)
        self.census: Census | None = None
        self.running: list[Census] | None = None


class Remembered(list[Any]):
    """Messages the session's next request will reuse (server/incremental.py). `known`: the
    running census of the first of them, which an earlier request checked (the very same
    objects, which nothing changes in place): they are not walked again. Checking these
    messages keeps their running census, for the next request."""

    __slots__ = ("known",)

    def __init__(self, messages: list[Any], known: list[Census]) -> None:
        super().__init__(messages)
        self.known = known


def checked(messages: list[Any], roles: tuple[str, ...]) -> Conversation | None:
    """The messages as a `Conversation` with its census taken, if each is an object with
    one of `roles` and a string or a list of blocks as its content; else None. A block that
    is not an object, or whose fields are not of their types (conversion/shapes.py), raises
    its `Mismatch`.

    Validation asks exactly this of every message, and the census walks the same blocks:
    one loop does both (at 800 KB, 320 messages, it was 125 µs of validation plus 85 of
    census). Anything else (a missing role, content of another type) is left to the
    validator, which names the problem. `Remembered` messages are walked from the first
    one not known: they were checked, as they are, by an earlier request."""
    if isinstance(messages, Remembered):
        return _resumed(messages, roles)
    found: set[str] = set()
    if not _walked(messages, roles, found):
        return None
    conversation = Conversation(messages)
    conversation.census = frozenset(found)
    return conversation


def _resumed(messages: Remembered, roles: tuple[str, ...]) -> Conversation | None:
    """`checked` from the first message not known, keeping each beginning's census."""
    running = list(messages.known)
    found = set(running[-1]) if running else set()
    if not _walked(islice(messages, len(running), None), roles, found, running,
                   first=len(running)):
        return None
    conversation = Conversation(messages)
    conversation.census = running[-1] if running else frozenset()
    conversation.running = running
    return conversation


def _walked(messages: Iterable[Any], roles: tuple[str, ...], found: set[str],
            running: list[Census] | None = None, first: int = 0) -> bool:
    """Whether each message has the shape `checked` asks for; its block types go into
    `found`, and with `running`, the census so far after each message. `first`: the
    index of the first message walked (for a `Mismatch`'s location)."""
    add = found.add
    shapes = BLOCK_FIELDS
    census = running[-1] if running else frozenset()
    for index, message in enumerate(messages, first):
        if type(message) is not dict or message.get("role") not in roles:
            return False
        content = message.get("content")
        if type(content) is list:
            for block in content:
                if type(block) is not dict:
                    raise _mismatch(block, content, index)
                kind = block.get("type")
                if type(kind) is str:
                    add(kind)
                    fields = shapes.get(kind)
                    if fields is not None:
                        for name, item in block.items():
                            accepts = fields.get(name)
                            if accepts is not None and accepts.get(type(item), WRONG) is not None:
                                if BLOCKS[kind].inside(block) is not None:
                                    raise _mismatch(block, content, index)
                                break
                elif "type" in block:
                    raise _mismatch(block, content, index)
                inner = block.get("content")
                if type(inner) is list:
                    _add_kinds(inner, found)
        elif type(content) is not str:
            return False
        if running is not None:
            if len(found) != len(census):
                census = frozenset(found)
            running.append(census)
    return True


def _mismatch(block: Any, content: list[Any], index: int) -> Mismatch:
    """What is wrong with `block` (of message `index`, whose `content` holds it): looked for
    again, only once something is."""
    position = next(position for position, item in enumerate(content) if item is block)
    problem = (MESSAGE_BLOCK.inside(block) if type(block) is dict
               else [f"Input should be {MESSAGE_BLOCK.what}"])
    assert problem is not None
    return mismatch(problem, "messages", index, "content", position)


def kinds(messages: list[Any]) -> frozenset[str]:
    """The types of the messages' blocks, nested ones included (a tool result's content)."""
    if isinstance(messages, Conversation):
        if messages.census is None:
            messages.census = _taken(messages)
        return messages.census
    return _taken(messages)


def holds(messages: list[Any], *types: str) -> bool:
    """Whether any block of the messages (nested ones included) is of one of `types`."""
    return not kinds(messages).isdisjoint(types)


def _taken(messages: list[Any]) -> frozenset[str]:
    """One flat loop over the messages' blocks; only nested content lists (a tool result's
    blocks) go through `_add_kinds`."""
    found: set[str] = set()
    add = found.add
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict):
                kind = block.get("type")
                if isinstance(kind, str):
                    add(kind)
                inner = block.get("content")
                if isinstance(inner, list):
                    _add_kinds(inner, found)
    return frozenset(found)


def _add_kinds(blocks: list[Any], found: set[str]) -> None:
    for block in blocks:
        if isinstance(block, dict):
            kind = block.get("type")
            if isinstance(kind, str):
                found.add(kind)
            inner = block.get("content")
            if isinstance(inner, list):
                _add_kinds(inner, found)
