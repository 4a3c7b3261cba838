"""What every markup format shares: the call a reader proposes, the description of a format
(the tags that open and close its envelopes, and its reader), and the small pure helpers the
readers use to read values the way the servers' own parsers do."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

Schema = dict[str, Any]


@dataclass(frozen=True)
class TextCall:
    """One tool call read from the text: the tool's name, its arguments, and the id the
    markup gave it (Kimi's `functions.NAME:0`; empty when the format has none)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


Reader = Callable[[str, Mapping[str, Schema]], list[TextCall] | None]
"""An envelope's text (from its opening tag to its closing tag, or to the end of the answer
when it never closed) and the offered tools' schemas → the calls it holds, or None when it
is not a whole envelope of that format. A reader proposes; the splitter checks."""


@dataclass(frozen=True)
class Markup:
    """One format: each tag that opens an envelope (every one starts with `<`, which keeps
    the scan of plain text to one `in`), with the tags that may close it; and its reader."""

    name: str
    envelopes: Mapping[str, tuple[str, ...]]
    read: Reader


def whole(pattern: re.Pattern[str], text: str) -> list[re.Match[str]] | None:
    """The matches of `pattern` that make up all of `text` (whitespace between and around
    them allowed), or None when anything else is there: a reader never drops what it does
    not understand."""
    matches: list[re.Match[str]] = []
    position = 0
    for match in pattern.finditer(text):
        if text[position:match.start()].strip():
            return None
        matches.append(match)
        position = match.end()
    return matches if not text[position:].strip() else None


def every_call(matches: list[re.Match[str]] | None,
               call: Callable[[re.Match[str]], TextCall | None]) -> list[TextCall] | None:
    """The call each match reads as, or None when there is none or any does not read."""
    calls: list[TextCall] = []
    for match in matches or ():
        one = call(match)
        if one is None:
            return None
        calls.append(one)
    return calls or None


def inner(raw: str, opening: str, closing: str) -> str:
    """The envelope's text without its opening tag and (when it came) its closing tag."""
    text = raw.removeprefix(opening)
    return text[:-len(closing)] if text.endswith(closing) else text


def json_object(text: str) -> dict[str, Any] | None:
    """Arguments written as a JSON object, or as a JSON string holding one (Kimi K2 through
    SGLang, MoonshotAI/Kimi-K2#26); an empty text is no arguments. None otherwise."""
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
        if isinstance(value, str):
            value = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def properties(schema: Schema | None) -> dict[str, Any]:
    found = schema.get("properties") if isinstance(schema, dict) else None
    return found if isinstance(found, dict) else {}


_WANTED: dict[str, type | tuple[type, ...]] = {
    "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def typed_value(value: str, schema: Any) -> Any:
    """A parameter's text as the type its schema names (a string when it names none, or the
    text does not read as that type), as vLLM's qwen3_coder and glm4_moe parsers do."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if value.strip() == "null" and ("null" in kinds or not kinds):
        return None
    if not kinds or "string" in kinds:
        return value
    try:
        parsed = orjson.loads(value.strip())
    except orjson.JSONDecodeError:
        return value
    for kind in kinds:
        expected = _WANTED.get(kind)
        if expected is not None and isinstance(parsed, expected) and not (
                kind in ("integer", "number") and isinstance(parsed, bool)):
            return parsed
    return value


def typed_arguments(pairs: Iterator[tuple[str, str]],
                    schema: Schema | None) -> dict[str, Any] | None:
    """Name/text pairs as arguments typed by the tool's schema; None when a name repeats (the
    markup is then not one call the model meant)."""
    known = properties(schema)
    arguments: dict[str, Any] = {}
    for key, value in pairs:
        if key in arguments:
            return None
        arguments[key] = typed_value(value, known.get(key))
    return arguments
