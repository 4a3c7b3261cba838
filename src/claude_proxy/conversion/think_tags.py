"""A streaming splitter for reasoning written inline as `<think>…</think>` in `content`.

Models served without a reasoning parser (R1 distills, QwQ, MiniMax-M2, llama.cpp with
`--reasoning-format none`) put their reasoning in the text. Tags may be cut anywhere between
chunks (`"<thi"`, `"nk>"`), a stream may carry only the closing tag (the chat template opened
it), and a `<` that turns out not to start a tag must come out unchanged.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["thinking", "text"]
Piece = tuple[Kind, str]

# (opening, closing) pairs; Kimi writes ◁think▷…◁/think▷.
TAG_PAIRS: tuple[tuple[str, str], ...] = (("<think>", "</think>"), ("◁think▷", "◁/think▷"))


def held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could be the start of one of `tags`."""
    longest = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


class ThinkTagSplitter:
    """Feed content pieces in; get (kind, text) pieces out, in order, nothing lost.

    `implicit_thinking` starts the stream inside a thinking section, for streams whose
    template already opened the tag and that carry only `</think>`.
    """

    def __init__(self, *, implicit_thinking: bool = False) -> None:
        self._kind: Kind = "text"
        self._closing: str | None = None
        self._held = ""
        self._at_start = True
        self._implicit = implicit_thinking

    def feed(self, piece: str) -> list[Piece]:
        text = self._held + piece
        self._held = ""
        out: list[Piece] = []
        if self._at_start:
            text = self._decide_start(text)
            if self._at_start:  # still only whitespace or a partial opening tag
                self._held = text
                return out
        while text:
            text = self._consume(text, out)
        return out

    def flush(self) -> list[Piece]:
        """Whatever is held back at the end of the stream, as the current kind."""
        held, self._held = self._held, ""
        if self._at_start:
            self._at_start = False
            self._kind = "thinking" if self._implicit else "text"
        return [(self._kind, held)] if held else []

    def _decide_start(self, text: str) -> str:
        """At the start: an opening tag (after optional whitespace) enters thinking."""
        stripped = text.lstrip()
        for opening, closing in TAG_PAIRS:
            if stripped.startswith(opening):
                self._at_start = False
                self._enter_thinking(closing)
                return stripped[len(opening):]
            if stripped and opening.startswith(stripped):
                return text  # maybe an opening tag cut short: wait for more
        if not stripped:
            return text
        self._at_start = False
        if self._implicit:
            self._enter_thinking(None)
        return text

    def _enter_thinking(self, closing: str | None) -> None:
        self._kind = "thinking"
        self._closing = closing

    def _consume(self, text: str, out: list[Piece]) -> str:
        """Emit up to the next tag of interest and switch kinds; returns the rest."""
        tags = self._tags_of_interest()
        found = min(((text.find(tag), tag) for tag in tags if tag in text), default=None)
        if found is None:
            keep = held_suffix(text, tags)
            emitted = text[: len(text) - keep]
            self._held = text[len(text) - keep:]
            if emitted:
                out.append((self._kind, emitted))
            return ""
        position, tag = found
        if position:
            out.append((self._kind, text[:position]))
        self._switch(tag)
        return text[position + len(tag):]

    def _tags_of_interest(self) -> tuple[str, ...]:
        if self._kind == "text":
            return tuple(opening for opening, _ in TAG_PAIRS)
        if self._closing is not None:
            return (self._closing,)
        return tuple(closing for _, closing in TAG_PAIRS)

    def _switch(self, tag: str) -> None:
        if self._kind == "text":
            closing = dict(TAG_PAIRS)[tag]
            self._enter_thinking(closing)
        else:
            self._kind = "text"
            self._closing = None
