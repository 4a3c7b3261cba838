"""Tool calls that a model wrote as text, because the server's tool parser did not run or did
not recognise the shape: Qwen3-Coder's XML and the Hermes JSON, DeepSeek's DSML and special
tokens, Kimi's section tokens, GLM's `<arg_key>`/`<arg_value>`, MiniMax's `<invoke>`, gpt-oss's
harmony (one reader per format in `conversion/markup/`; docs/text-tool-calls.md).

A splitter for one answer: text in, text and calls out, in order. Text outside an envelope
streams through at once (a possible start of an opening tag is held back, as the `<think>`
splitter does); an envelope is held whole, then becomes calls only when every call in it
passes the check (by default: names a tool the request offered, has that tool's required
properties, and no unknown one where the schema forbids them). Otherwise the envelope is
given back as the text it was. `TextCallParser` puts a splitter behind any upstream API's
parser. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import orjson

from claude_proxy.conversion.deltas import Delta, ReasoningText, Text, ToolCall
from claude_proxy.conversion.markup.deepseek import DEEPSEEK
from claude_proxy.conversion.markup.dsml import DSML
from claude_proxy.conversion.markup.envelope import Markup, Reader, Schema, TextCall
from claude_proxy.conversion.markup.glm import GLM
from claude_proxy.conversion.markup.harmony import HARMONY
from claude_proxy.conversion.markup.kimi import KIMI
from claude_proxy.conversion.markup.minimax import MINIMAX
from claude_proxy.conversion.markup.qwen import QWEN
from claude_proxy.conversion.response_converter import WireParser

__all__ = ["FAMILIES", "MAX_ENVELOPE_CHARS", "Check", "Piece", "Schema", "TextCall",
           "TextCallParser", "TextCallPlan", "TextToolCallSplitter", "declared_check",
           "declared_tools", "fits", "reading_text_calls"]

FAMILIES: dict[str, tuple[Markup, ...]] = {
    "qwen": (QWEN,), "deepseek": (DSML, DEEPSEEK), "kimi": (KIMI,), "glm": (GLM,),
    "minimax": (MINIMAX,), "harmony": (HARMONY,)}
"""The formats by the name the settings turn them on with (config/settings.py)."""

MAX_ENVELOPE_CHARS = 1_000_000
"""An envelope that grows past this is not a call the proxy will hold: it goes out as text."""

Check = Callable[[str, dict[str, Any]], dict[str, Any] | None]
"""(tool name, arguments) → the arguments to send (possibly repaired) when the call is one
to accept for an offered tool, else None."""

Piece = tuple[Literal["text"], str] | tuple[Literal["call"], TextCall]


def fits(name: str, arguments: dict[str, Any], declared: Mapping[str, Schema]) -> bool:
    """Whether a call names a declared tool and its arguments fit that tool's schema: every
    required property there, and no unknown one where the schema forbids extras."""
    schema = declared.get(name)
    if schema is None:
        return False
    required = schema.get("required")
    if isinstance(required, list) and not all(key in arguments for key in required):
        return False
    found = schema.get("properties")
    if schema.get("additionalProperties") is False and isinstance(found, dict):
        return all(key in found for key in arguments)
    return True


def declared_check(declared: Mapping[str, Schema]) -> Check:
    """The default check: the arguments as they are when `fits` accepts them."""
    def check(name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return arguments if fits(name, arguments, declared) else None
    return check


@dataclass(frozen=True)
class _Scan:
    """What a splitter looks for, made once per set of formats."""

    openings: re.Pattern[str]
    prefixes: frozenset[str]
    """Every proper prefix of an opening tag: what a text may end with and still open one."""
    longest: int
    closings: dict[str, tuple[str, ...]]
    longest_closing: dict[str, int]
    readers: dict[str, tuple[Reader, ...]]

    def held_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that could start an opening tag."""
        start = text.find("<", max(0, len(text) - self.longest + 1))
        while start >= 0:
            if text[start:] in self.prefixes:
                return len(text) - start
            start = text.find("<", start + 1)
        return 0


@lru_cache(maxsize=64)
def _scan_for(formats: tuple[str, ...]) -> _Scan:
    """The tables for a set of families, built once: a process sees a handful of sets (one
    per combination the settings give its models), and every answer reuses its set's."""
    closings: dict[str, tuple[str, ...]] = {}
    readers: dict[str, tuple[Reader, ...]] = {}
    for markup in (markup for name in formats for markup in FAMILIES[name]):
        for opening, ends in markup.envelopes.items():
            assert opening.startswith("<"), opening  # the plain-text scan relies on it
            closings[opening] = tuple(dict.fromkeys(closings.get(opening, ()) + ends))
            readers[opening] = (*readers.get(opening, ()), markup.read)
    ordered = sorted(closings, key=len, reverse=True)
    return _Scan(openings=re.compile("|".join(map(re.escape, ordered))),
                 prefixes=frozenset(tag[:size] for tag in ordered for size in range(1, len(tag))),
                 longest=max(map(len, ordered)), closings=closings,
                 longest_closing={tag: max(map(len, ends)) for tag, ends in closings.items()},
                 readers=readers)


class TextToolCallSplitter:
    """Feed content pieces in; get ("text", str) and ("call", TextCall) pieces out.

    `formats` names the families read (FAMILIES); `check` accepts or refuses each call
    (default `declared_check`). `tail` is for reasoning: an envelope becomes calls only when
    nothing but whitespace follows it until `flush`; `give_back` returns what it holds when
    the answer goes on."""

    def __init__(self, declared: Mapping[str, Schema], formats: tuple[str, ...] = ("qwen",),
                 *, check: Check | None = None, tail: bool = False) -> None:
        self._declared = declared
        self._check = check or declared_check(declared)
        self._scan = _scan_for(formats)
        self._tail = tail
        self._held = ""
        """A possible start of an opening tag, or the envelope so far."""
        self._opening: str | None = None
        """Inside an envelope: the tag that opened it."""
        self._scanned = 0
        """How much of the held envelope is known not to hold a closing tag (a long call
        fed in small pieces is then searched once, not once per piece)."""
        self._pending = ""
        """`tail`: a closed envelope and the whitespace after it."""

    def passes(self, piece: str) -> bool:
        """Whether `piece` comes out as it went in: nothing held, no tag can start in it."""
        return self._opening is None and not self._held and not self._pending and (
            "<" not in piece)

    def feed(self, piece: str) -> list[Piece]:
        if self.passes(piece):
            return [("text", piece)] if piece else []
        text = self._held + piece
        self._held = ""
        out: list[Piece] = []
        while text:
            if self._opening is not None:
                text = self._in_envelope(text, out)
            elif self._pending:
                text = self._after_pending(text, out)
            else:
                text = self._in_text(text, out)
        return out

    def flush(self) -> list[Piece]:
        """The end of the answer: an envelope never closed is read as far as it goes (vLLM's
        parsers do the same); a held partial tag is text."""
        held, pending, opened = self._held, self._pending, self._opening is not None
        self._held, self._pending, self._opening, self._scanned = "", "", None, 0
        if opened or pending:
            return self._read(pending + held)
        return [("text", held)] if held else []

    def give_back(self) -> list[Piece]:
        """Everything held, as the text it was (`tail`: the reasoning did not end in it)."""
        text = self._pending + self._held
        self._held, self._pending, self._opening, self._scanned = "", "", None, 0
        return [("text", text)] if text else []

    def _in_text(self, text: str, out: list[Piece]) -> str:
        found = self._scan.openings.search(text)
        if found is None:
            keep = self._scan.held_suffix(text)
            if len(text) > keep:
                out.append(("text", text[: len(text) - keep]))
            self._held = text[len(text) - keep:]
            return ""
        if found.start():
            out.append(("text", text[:found.start()]))
        self._opening, self._scanned = found.group(), len(found.group())
        return text[found.start():]

    def _in_envelope(self, text: str, out: list[Piece]) -> str:
        assert self._opening is not None
        ends = [(at, tag) for tag in self._scan.closings[self._opening]
                if (at := text.find(tag, self._scanned)) >= 0]
        if not ends:
            if len(text) > MAX_ENVELOPE_CHARS:
                self._opening, self._scanned = None, 0
                out.append(("text", text))
                return ""
            self._held = text
            self._scanned = max(self._scanned,
                                len(text) - self._scan.longest_closing[self._opening] + 1)
            return ""
        at, tag = min(ends)
        end = at + len(tag)
        self._opening, self._scanned = None, 0
        if self._tail:
            self._pending = text[:end]
        else:
            out.extend(self._read(text[:end]))
        return text[end:]

    def _after_pending(self, text: str, out: list[Piece]) -> str:
        """`tail`: whitespace after a closed envelope is held with it; anything else gives
        the envelope back as text, and is read on."""
        rest = text.lstrip()
        self._pending += text[: len(text) - len(rest)]
        if rest:
            out.extend(self.give_back())
        return rest

    def _read(self, raw: str) -> list[Piece]:
        envelope = raw.rstrip() if self._tail else raw
        calls = self._calls(envelope)
        if calls is None:
            return [("text", raw)] if raw else []
        return [("call", call) for call in calls]

    def _calls(self, raw: str) -> list[TextCall] | None:
        """The envelope's calls as the check accepts them; None unless every one passes."""
        opening = self._scan.openings.match(raw)
        if opening is None:
            return None
        for read in self._scan.readers[opening.group()]:
            proposed = read(raw, self._declared)
            if proposed is None:
                continue
            accepted = [self._check(call.name, call.arguments) for call in proposed]
            if any(arguments is None for arguments in accepted):
                return None
            return [TextCall(call.name, arguments, call.id)
                    for call, arguments in zip(proposed, accepted, strict=True)
                    if arguments is not None]
        return None


@dataclass(frozen=True)
class TextCallPlan:
    """What to read from one answer: the tools the request offered (name → schema), the
    format families on for its model, whether the reasoning is read too, and the check a
    call must pass (None: `declared_check` of `tools`)."""

    tools: Mapping[str, Schema]
    formats: tuple[str, ...]
    in_reasoning: bool = False
    check: Check | None = None


class TextCallParser:
    """An upstream API's parser whose text deltas go through a splitter: calls written as
    text come out as tool calls, the rest as the text it was.

    With `in_reasoning`, the reasoning is read too, but only a tool section it ends in (the
    model went from thinking straight into its call, as vLLM's KimiK2ReasoningParser
    expects) and only while the answer has nothing else: any text or tool call gives the
    section back as reasoning. Calls read from text take keys below zero, so they never
    meet the keys the wrapped parser gives its own calls."""

    def __init__(self, parser: WireParser, plan: TextCallPlan) -> None:
        self._parser = parser
        self._text = TextToolCallSplitter(plan.tools, plan.formats, check=plan.check)
        self._reasoning = TextToolCallSplitter(plan.tools, plan.formats, check=plan.check,
                                               tail=True) if plan.in_reasoning else None
        self._visible = True
        self._next_key = -1

    def parse(self, chunk: dict[str, Any]) -> list[Delta]:
        return self._read(self._parser.parse(chunk))

    def flush(self) -> list[Delta]:
        out = self._read(self._parser.flush())
        out.extend(self._deltas(self._text.flush()))
        if self._reasoning is not None:
            out.extend(self._deltas(self._reasoning.flush(), reasoning=True))
        return out

    def _read(self, deltas: list[Delta]) -> list[Delta]:
        out: list[Delta] = []
        for delta in deltas:
            if isinstance(delta, Text):
                if self._reasoning is not None and delta.text.strip():
                    self._answer_goes_on(out)
                if self._text.passes(delta.text):
                    out.append(delta)
                else:
                    out.extend(self._deltas(self._text.feed(delta.text)))
            elif isinstance(delta, ReasoningText) and self._reasoning is not None:
                self._visible = delta.visible
                out.extend(self._deltas(self._reasoning.feed(delta.text), reasoning=True))
            elif isinstance(delta, ToolCall):
                self._answer_goes_on(out)
                out.extend(self._deltas(self._text.flush()))  # a real call ends any envelope
                out.append(delta)
            else:
                out.append(delta)
        return out

    def _answer_goes_on(self, out: list[Delta]) -> None:
        """The answer has text or a call of its own: the reasoning's section, if any, was
        a plan and stays reasoning; the reasoning is not read from here on."""
        if self._reasoning is not None:
            out.extend(self._deltas(self._reasoning.give_back(), reasoning=True))
            self._reasoning = None

    def _deltas(self, pieces: list[Piece], *, reasoning: bool = False) -> list[Delta]:
        out: list[Delta] = []
        for piece in pieces:
            if piece[0] == "text":
                out.append(ReasoningText(piece[1], self._visible) if reasoning
                           else Text(piece[1]))
                continue
            call = piece[1]
            out.append(ToolCall(self._next_key, id=call.id, name=call.name,
                                arguments=orjson.dumps(call.arguments).decode()))
            self._next_key -= 1
        return out


def reading_text_calls(parser: WireParser, plan: TextCallPlan | None) -> WireParser:
    """`parser`, reading tool calls written as text when a plan says so."""
    return parser if plan is None else TextCallParser(parser, plan)


def declared_tools(body: dict[str, Any]) -> dict[str, Schema]:
    """Name → parameters schema of the function tools an upstream request offers, in Chat
    Completions' form (`function.parameters`), the Responses API's (`name`, `parameters`)
    or the Messages API's (`name`, `input_schema`; server tools have none and are left out)."""
    tools: dict[str, Schema] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        spec: dict[str, Any] = function if isinstance(function, dict) else tool
        name = spec.get("name")
        if not isinstance(name, str) or not (tool.get("type") == "function"
                                             or "input_schema" in spec):
            continue
        schema = spec.get("parameters", spec.get("input_schema"))
        tools[name] = schema if isinstance(schema, dict) else {}
    return tools
