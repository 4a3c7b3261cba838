"""The rungs of the tool-call repair ladder (docs/tool-calls.md): pure transforms of a call's
argument text or value, each of which the caller keeps only when the original does not
validate against the tool's schema and the result does (`tool_schemas.OfferedTools.check`).

Text rungs read text that is not JSON: R1 nothing at all, R2 raw control characters, R3 one
object in a code fence or followed by prose or a special token, R4 Python literals, single
quotes, trailing commas, unquoted keys and stray escapes (`json_repair`, only for text that
ends its object, outside any string, with its brackets balanced, and at most
`REPAIR_MAX_CHARS` long). Value rungs change a parsed value: R5 arguments encoded twice, R6 a
wrapper object, R7 values the schema types otherwise (a string holding an array, a number or a
boolean; an enum member in another case; `null` or `""` for an optional field that takes
neither). None of them completes what was cut, renames or drops a key (but R7's absent
optional fields), or invents a value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

Schema = dict[str, Any]

REPAIR_MAX_CHARS = 16 * 1024
"""R4 runs `json_repair` (pure Python) on text no longer than this: measured on this machine,
2.9 ms for 2 KB of broken text, 25 ms for 16 KB, 137 ms for 64 KB, all of it on the event
loop. Longer broken text goes through as it came."""
WRAPPERS = ("arguments", "input", "parameters", "args")
"""R6: keys models wrap their arguments in (B7 of the reference note)."""
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?[ \t]*```\s*\Z", re.DOTALL)
_AMBIGUOUS_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|U[0-9a-fA-F]{8}|N\{|[av0-7])")
"""An escape that means a character in a Python literal and is a stray backslash in JSON
(`\\x41`, `\\U0002ebe1`, `\\a`): which was meant cannot be told, so R4 leaves the text."""
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>")
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]*[1-9])?")
"""A number as JavaScript's `String(n)` writes it back (no `05`, `5.0`, `1e3`): Claude Code's
own rule for the strings it turns into numbers."""


class NotJSON(ValueError):
    """`NaN` or `Infinity`: not JSON, whatever Python's reader accepts."""


def _no_constants(name: str) -> Any:
    raise NotJSON(name)


def loads_lenient(text: str) -> Any:
    """R2: JSON with raw control characters inside strings (`strict=False`); NaN refused."""
    return json.loads(text, strict=False, parse_constant=_no_constants)


_DECODER = json.JSONDecoder(strict=False, parse_constant=_no_constants)


def json_values(text: str) -> list[tuple[Any, str]] | None:
    """The JSON values a text is made of when it is two or more, separated by whitespace only
    (S2/S3: `{…}{…}`), each with its own text; None otherwise."""
    values: list[tuple[Any, str]] = []
    position, end = _skip_space(text, 0), len(text)
    try:
        while position < end:
            value, after = _DECODER.raw_decode(text, position)
            values.append((value, text[position:after]))
            position = _skip_space(text, after)
    except ValueError:
        return None
    return values if len(values) >= 2 else None


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def fenced_or_leading(text: str) -> tuple[Any, str] | None:
    """R3: the one object in a code fence, or the object a text starts with when only
    whitespace, prose or special tokens (`<|call|>`) follow it, with the rung's kind."""
    fence = _FENCE.match(text)
    if fence is not None:
        value = _parsed(fence.group(1))
        return (value, "R3:fence") if isinstance(value, dict) else None
    start = _skip_space(text, 0)
    if not text.startswith("{", start):
        return None
    try:
        value, after = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    rest = text[after:]
    if "{" in rest or "[" in rest or not isinstance(value, dict):
        return None  # a second object (or array): not one call
    return value, ("R3:special_token" if _SPECIAL_TOKEN.search(rest) else "R3:trailing_text")


def _parsed(text: str) -> Any:
    try:
        return loads_lenient(text)
    except ValueError:
        return None


def syntax_repaired(text: str) -> Any:
    """R4: Python literals, single quotes, trailing commas, unquoted keys and stray
    backslashes repaired by `json_repair` (strict mode: a missing value is an error, not
    `""`), for a text short enough and provably whole: it ends with the `}` that closes its
    first `{`, outside any string, and holds no escape Python and JSON read differently.
    None when it may not be repaired or is not an object."""
    if len(text) > REPAIR_MAX_CHARS or not text.rstrip().endswith("}") or not whole(text) or (
            _AMBIGUOUS_ESCAPE.search(text)):
        return None
    import json_repair  # the rare repair's, not every process's (0.4 MiB resident)

    try:
        value = json_repair.repair_json(text, return_objects=True, strict=True)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def whole(text: str) -> bool:
    """Whether a JSON-like text (either quote) ends outside every string with each bracket
    closed in order: what a call cut by the output limit, or one that ends inside a string,
    is not."""
    closing = {"{": "}", "[": "]"}
    expected: list[str] = []
    quote = ""
    escaped = False
    for character in text:
        if quote:
            if escaped:
                escaped = False
            elif character == "\\":
                escaped = True
            elif character == quote:
                quote = ""
        elif character in "\"'":
            quote = character
        elif character in closing:
            expected.append(closing[character])
        elif character in "}]" and (not expected or expected.pop() != character):
            return False
    return not quote and not expected


# ------------------------------------------------------------------ value rungs


def unwrapped_string(value: Any) -> dict[str, Any] | None:
    """R5: arguments that are a string holding a JSON object (encoded twice)."""
    if not isinstance(value, str):
        return None
    inner = _parsed(value.strip())
    return inner if isinstance(inner, dict) else None


def unwrapped_object(value: Any, tool: str, schema: Schema) -> dict[str, Any] | None:
    """R6: `{"arguments": {…}}` (or input, parameters, args, or the tool's own name) and
    `{"name": <this tool>, "arguments": {…}}`, where the schema declares no such key."""
    if not isinstance(value, dict):
        return None
    found = schema.get("properties")
    declared: dict[str, Any] = found if isinstance(found, dict) else {}
    if len(value) == 1:
        (key, inner), = value.items()
        if key in declared or (key not in WRAPPERS and key != tool):
            return None
    elif value.keys() == {"name", "arguments"} and value["name"] == tool and not (
            {"name", "arguments"} & set(declared)):
        inner = value["arguments"]
    else:
        return None
    if isinstance(inner, str):
        inner = unwrapped_string(inner)
    return inner if isinstance(inner, dict) else None


def coerced(value: Any, schema: Any, path: str = "$") -> tuple[Any, list[str]]:
    """R7: the value with what the schema types otherwise turned into that type, recursively
    through `properties` and `items`; the kinds of change made (`R7:$.todos:string->array`).
    Untyped fields are never touched; a string field keeps its string."""
    kinds: list[str] = []
    return _coerce(value, schema, path, kinds), kinds


def _types(schema: Schema) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    return {item for item in kind if isinstance(item, str)} if isinstance(kind, list) else set()


def _coerce(value: Any, schema: Any, path: str, kinds: list[str]) -> Any:
    if not isinstance(schema, dict):
        return value
    if isinstance(value, str):
        return _coerce_string(value, schema, path, kinds)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        return _coerce_object(value, schema, path, kinds)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = [_coerce(item, schema["items"], f"{path}[{index}]", kinds)
                 for index, item in enumerate(value)]
        return items if any(new is not old for new, old in zip(items, value, strict=True)) \
            else value
    return value


def _coerce_string(value: str, schema: Schema, path: str, kinds: list[str]) -> Any:
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        matches = [member for member in enum
                   if isinstance(member, str) and member.lower() == value.lower()]
        if len(matches) == 1:
            kinds.append(f"R7:{path}:enum_case")
            return matches[0]
    types = _types(schema)
    if not types or "string" in types:
        return value
    for kind, converted in _readings(value, types):
        kinds.append(f"R7:{path}:string->{kind}")
        return _coerce(converted, schema, path, kinds)
    return value


def _readings(value: str, types: set[str]) -> Iterator[tuple[str, Any]]:
    """What a string reads as, in the types a field takes (strict JSON for arrays and
    objects; numbers only as `String(n)` writes them; booleans in any case)."""
    if types & {"array", "object"}:
        parsed = _strict(value)
        if isinstance(parsed, list) and "array" in types:
            yield "array", parsed
        if isinstance(parsed, dict) and "object" in types:
            yield "object", parsed
    if "integer" in types and _INTEGER.fullmatch(value):
        yield "integer", int(value)
    if "number" in types and _NUMBER.fullmatch(value):
        yield "number", int(value) if _INTEGER.fullmatch(value) else float(value)
    if "boolean" in types and value.lower() in ("true", "false"):
        yield "boolean", value.lower() == "true"


def _strict(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _coerce_object(value: dict[str, Any], schema: Schema, path: str,
                   kinds: list[str]) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"]
    listed = schema.get("required")
    required: list[Any] = listed if isinstance(listed, list) else []
    result: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        field = properties.get(key)
        where = f"{path}.{key}"
        if isinstance(field, dict) and key not in required and _placeholder(item, field):
            kinds.append(f"R7:{where}:drop_{'null' if item is None else 'empty'}")
            changed = True
            continue
        new = _coerce(item, field, where, kinds) if field is not None else item
        changed = changed or new is not item
        result[key] = new
    return result if changed else value


def _placeholder(item: Any, field: Schema) -> bool:
    """`null` or `""` given for a typed field that takes neither: both mean absent."""
    types = _types(field)
    if not types:
        return False
    if item is None:
        enum = field.get("enum")
        return "null" not in types and not (isinstance(enum, list) and None in enum)
    return item == "" and "string" not in types
