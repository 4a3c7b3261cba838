"""Tool calls that a model wrote as text: Qwen3-Coder and Qwen 3.5 served by vLLM, SGLang or
llama.cpp sometimes put their call in `content` and end with `finish_reason: stop`.

Two shapes (docs/text-tool-calls.md names the threads they come from):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

(Qwen3-Coder's XML; `</parameter>` or `</function>` are sometimes missing, and the
`<tool_call>` envelope too) and the Hermes JSON of Qwen 2.5 / Qwen3:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A splitter for one response: text in, text and calls out, in order. Text outside an envelope
streams through at once (a possible start of a marker is held back, as the `<think>` splitter
does); an envelope is held whole, then becomes calls only when every call in it names a tool
the request declared and its arguments fit that tool's schema (its required properties, no
unknown ones where the schema forbids them). Otherwise the envelope is given back as the text
it was. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from claude_proxy.conversion.think_tags import held_suffix

Schema = dict[str, Any]

OPENINGS = ("<tool_call>", "<function=")
_CLOSING = {"<tool_call>": "</tool_call>", "<function=": "</function>"}
MAX_ENVELOPE_CHARS = 1_000_000
"""An envelope that grows past this is not a call the proxy will hold: it goes out as text."""

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
# A parameter ends at its closing tag, or where the next parameter or the function ends.
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)",
                        re.DOTALL)


@dataclass(frozen=True)
class TextCall:
    """One tool call read from the text: the declared tool's name and its arguments."""

    name: str
    arguments: dict[str, Any]


Piece = tuple[Literal["text"], str] | tuple[Literal["call"], TextCall]


class TextToolCallSplitter:
    """Feed content pieces in; get ("text", str) and ("call", TextCall) pieces out."""

    def __init__(self, declared: Mapping[str, Schema]) -> None:
        self._declared = declared
        self._held = ""
        self._closing: str | None = None
        """Inside an envelope: the tag that ends it."""
        self._scanned = 0
        """How much of the held envelope is known not to hold its closing tag (a long call
        fed in small pieces is then searched once, not once per piece)."""

    def feed(self, piece: str) -> list[Piece]:
        text = self._held + piece
        self._held = ""
        out: list[Piece] = []
        while text:
            text = self._in_envelope(text, out) if self._closing else self._in_text(text, out)
        return out

    def flush(self) -> list[Piece]:
        """The end of the answer: an envelope never closed is read as far as it goes (vLLM's
        parser does the same); a held partial marker is text."""
        held, self._held = self._held, ""
        if self._closing is None:
            return [("text", held)] if held else []
        self._closing, self._scanned = None, 0
        return self._envelope(held)

    def _in_text(self, text: str, out: list[Piece]) -> str:
        found = min(((text.find(tag), tag) for tag in OPENINGS if tag in text), default=None)
        if found is None:
            keep = held_suffix(text, OPENINGS)
            if len(text) > keep:
                out.append(("text", text[: len(text) - keep]))
            self._held = text[len(text) - keep:]
            return ""
        position, tag = found
        if position:
            out.append(("text", text[:position]))
        self._closing, self._scanned = _CLOSING[tag], 0
        self._held = ""
        return self._in_envelope(text[position:], out)

    def _in_envelope(self, text: str, out: list[Piece]) -> str:
        assert self._closing is not None
        end = text.find(self._closing, self._scanned)
        if end < 0:
            if len(text) > MAX_ENVELOPE_CHARS:
                self._closing, self._scanned = None, 0
                out.append(("text", text))
                return ""
            self._held = text
            self._scanned = max(0, len(text) - len(self._closing) + 1)
            return ""
        end += len(self._closing)
        self._closing, self._scanned = None, 0
        out.extend(self._envelope(text[:end]))
        return text[end:]

    def _envelope(self, raw: str) -> list[Piece]:
        calls = parse_envelope(raw, self._declared)
        if calls is None:
            return [("text", raw)] if raw else []
        return [("call", call) for call in calls]


def parse_envelope(raw: str, declared: Mapping[str, Schema]) -> list[TextCall] | None:
    """The calls in one envelope, or None when it is not a call to declared tools."""
    inner = raw.strip()
    if inner.startswith("<tool_call>"):
        inner = inner[len("<tool_call>"):]
    if inner.endswith("</tool_call>"):
        inner = inner[: -len("</tool_call>")]
    inner = inner.strip()
    if inner.startswith("{"):
        calls = _hermes_call(inner)
    else:
        calls = [_xml_call(name, body, declared.get(name.strip()))
                 for name, body in _FUNCTION.findall(inner)]
    if not calls or not all(call is not None and fits(call, declared) for call in calls):
        return None
    return [call for call in calls if call is not None]


def _hermes_call(inner: str) -> list[TextCall | None]:
    try:
        data = orjson.loads(inner)
    except orjson.JSONDecodeError:
        return [None]
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return [None]
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return [None]
    if not isinstance(arguments, dict):
        return [None]
    return [TextCall(data["name"], arguments)]


def _xml_call(name: str, body: str, schema: Schema | None) -> TextCall | None:
    """Qwen3-Coder's XML: each `<parameter=NAME>` value loses one leading and one trailing
    newline, then takes the type the tool's schema gives it."""
    if schema is None:
        return None
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    arguments: dict[str, Any] = {}
    for key, value in _PARAMETER.findall(body):
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[key.strip()] = typed_value(value, properties.get(key.strip()))
    return TextCall(name.strip(), arguments)


def typed_value(value: str, schema: Any) -> Any:
    """A parameter's text as the type its schema names (a string when it names none, or the
    text does not read as that type)."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if value.strip() == "null" and ("null" in kinds or not kinds):
        return None
    if not kinds or "string" in kinds:
        return value
    text = value.strip()
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return value
    wanted: dict[str, type | tuple[type, ...]] = {
        "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
    for kind in kinds:
        expected = wanted.get(kind)
        if expected is not None and isinstance(parsed, expected) and not (
                kind in ("integer", "number") and isinstance(parsed, bool)):
            return parsed
    return value


def fits(call: TextCall, declared: Mapping[str, Schema]) -> bool:
    """Whether a call names a declared tool and its arguments fit that tool's schema: every
    required property there, and no unknown one where the schema forbids extras."""
    schema = declared.get(call.name)
    if schema is None:
        return False
    required = schema.get("required")
    if isinstance(required, list) and not all(key in call.arguments for key in required):
        return False
    properties = schema.get("properties")
    if schema.get("additionalProperties") is False and isinstance(properties, dict):
        return all(key in properties for key in call.arguments)
    return True


def declared_tools(body: dict[str, Any]) -> dict[str, Schema]:
    """Name → parameters schema of the function tools an upstream request declares."""
    tools: dict[str, Schema] = {}
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            tools[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return tools
