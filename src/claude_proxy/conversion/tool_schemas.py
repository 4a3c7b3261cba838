"""The tools a request offers, and whether a call of one of them is valid, repairable or
neither: checked against that tool's `input_schema` (JSON Schema, draft 2020-12 unless the
schema names another, by `jsonschema_rs`).

`OfferedTools.check(name, arguments)` runs the repair ladder (`tool_repair.py`, and R8 on the
name here) on one call's argument text or value and says what came of it: valid as it is,
repaired (the value and the kinds of repair), invalid (with the original's first validation
error) or unchecked (no such tool, no schema, or a schema keyword the validator does not
implement: nothing is repaired then). `accept` is the same as a callable `(name, arguments)
-> dict | None` for the parsers of tool calls written as text.

A schema's validator is compiled once per process and schema: `compiled` is a pure function
of the schema's bytes behind an `lru_cache` (Claude Code sends the same dozen schemas with
every request; a miss costs the compile again, never another answer), as `matches_prefix`
keeps its answers in config/settings.py. It is no run-time state of the fleet, so not the
state layer's (a compiled validator cannot cross a process anyway).

`jsonschema_rs` by measurement (pyproject.toml): 0.2 µs to validate a Bash call where the
pure-Python `jsonschema` took 15 µs, which alone was half the 30 µs a valid call may cost.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from claude_proxy.conversion import tool_repair
from claude_proxy.conversion.census import holds
from claude_proxy.conversion.tool_repair import Schema
from claude_proxy.conversion.tools import is_server_tool, referenced_tool_names

if TYPE_CHECKING:
    from jsonschema_rs import Validator

Outcome = Literal["valid", "repaired", "invalid", "unchecked"]

KNOWN_KEYWORDS = frozenset({
    # core (a `$ref` only within the document; `$dynamicRef`, `$recursiveRef` are not followed)
    "$schema", "$id", "$comment", "$anchor", "$dynamicAnchor", "$defs", "definitions",
    "$vocabulary", "$ref",
    # applicators
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems",
    "items", "additionalItems", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "dependencies",
    # validation
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired",
    # annotations: they assert nothing (`format` included, as 2020-12 has it)
    "format", "title", "description", "default", "examples", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema"})
"""The keywords of drafts 4 to 2020-12 that `jsonschema_rs` implements: a schema with any
other (a vendor's own rule) is not one the guard may repair against."""
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_NAME_TOKEN = re.compile(r"<\|[^|<>]{0,40}\|>")
_NAME_INDEX = re.compile(r":\d+\Z")


@dataclass(frozen=True)
class Check:
    """What came of one call. `value` is what to send (the original, or the repair) when it
    is an object that validates; None when the text is not JSON. `name` is the offered tool's
    name (R8 may have changed it), else the name as sent. `error`: where the original
    first fails and which keyword, with none of its values (for logs and traces), or why it
    was not checked; `detail`: the validator's own words, values included."""

    outcome: Outcome
    name: str
    value: Any = None
    kinds: tuple[str, ...] = ()
    error: str | None = None
    detail: str | None = None

    @property
    def passes(self) -> bool:
        return self.outcome in ("valid", "repaired")


@functools.lru_cache(maxsize=512)
def compiled(schema_json: bytes) -> Validator | None:
    """The validator of one schema (its JSON bytes), or None when a keyword in it is one the
    validator does not implement, or the schema is not one (then nothing is repaired)."""
    # Imported at the first schema, not with the module: its 4 MiB of resident pages are
    # the idle server's otherwise, in a process that is never offered a tool.
    import jsonschema_rs

    schema = orjson.loads(schema_json)
    if not isinstance(schema, dict) or not knows_every_keyword(schema):
        return None
    try:  # the schema itself is checked too (a `pattern` that is no regex, ...)
        return jsonschema_rs.validator_for(schema, validate_formats=False, offline=True)
    except ValueError:  # jsonschema_rs.ValidationError: the schema is not one
        return None


def knows_every_keyword(schema: Any, known: frozenset[str] = KNOWN_KEYWORDS) -> bool:
    """Whether every keyword of a schema and its subschemas is one the validator implements
    or an annotation (a `$ref` only within the document)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key not in known:
            return False
        if key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            return False
        if key in _SCHEMA_MAPS:
            subschemas: Iterable[Any] = value.values() if isinstance(value, dict) else [None]
        elif key == "dependencies" and isinstance(value, dict):  # draft 7: schemas or names
            subschemas = [sub for sub in value.values() if not isinstance(sub, list)]
        elif key in _SCHEMA_LISTS or (key in _SCHEMA_ONE and isinstance(value, list)):
            subschemas = value if isinstance(value, list) else [None]
        elif key in _SCHEMA_ONE:
            subschemas = [value]
        else:
            continue
        if not all(knows_every_keyword(sub, known) for sub in subschemas):
            return False
    return True


NAMES_ONLY = ("required", "additionalProperties", "dependentRequired")
"""Keywords whose messages name keys, never the values (they may be shown as they are)."""


def first_error(validator: Validator, value: Any) -> tuple[str, str]:
    """The first validation error without the values (`$.offset: fails "type"`, what logs
    and traces may carry) and in the validator's own words (`$.offset: "5" is not of type
    "integer"`, what the model may be told)."""
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return "valid", "valid"
    path = "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                         for part in error.instance_path)
    keyword = str(error.schema_path[-1]) if error.schema_path else "schema"
    detail = f"{path}: {error.message}"
    return (detail if keyword in NAMES_ONLY else f'{path}: fails "{keyword}"'), detail


class RequestSchemas(Mapping[str, Any]):
    """The schemas of the tools a request offers, by name, found in its `tools` as they are
    asked for: a request offers a dozen, a reply calls one or two (a dict of them all costs
    5 µs a request). Iterating (R8) reads them all once.

    It keeps the request's `tools`, and its messages only when a `tool_reference` among them
    may load a deferred tool: the guard lives as long as the stream, and the parsed
    conversation would live with it (the record keeps the request as bytes only, once the
    answer has begun: `RequestRecord.release_parsed`)."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._tools: list[Any] = body.get("tools") or []
        messages = body.get("messages") or []
        self._messages: list[Any] | None = (
            messages if holds(messages, "tool_reference") else None)
        self._loaded: set[str] | None = None
        self._all: dict[str, Any] | None = None
        self._found: dict[str, Any] = {}

    def _offered(self, tool: Any) -> bool:
        if not isinstance(tool, dict) or is_server_tool(tool) or not isinstance(
                tool.get("name"), str):
            return False
        if not tool.get("defer_loading"):
            return True
        if self._loaded is None:
            self._loaded = referenced_tool_names(self._messages or [])
            self._messages = None
        return tool["name"] in self._loaded

    def __getitem__(self, name: str) -> Any:
        if name in self._found:
            return self._found[name]
        for tool in self._tools:
            if isinstance(tool, dict) and tool.get("name") == name and self._offered(tool):
                self._found[name] = tool.get("input_schema")
                return self._found[name]
        raise KeyError(name)

    def _every(self) -> dict[str, Any]:
        if self._all is None:
            self._all = {tool["name"]: tool.get("input_schema")
                         for tool in self._tools if self._offered(tool)}
        return self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._every())

    def __len__(self) -> int:
        return len(self._every())


class OfferedTools:
    """Name → input schema of the custom tools one request offers (a deferred tool only once
    a `tool_reference` has loaded it: the model cannot know its schema before)."""

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.schemas = schemas
        self._validators: dict[str, Validator | None] = {}
        """This request's own: each tool's validator, looked up once."""

    @classmethod
    def of_request(cls, body: Mapping[str, Any]) -> OfferedTools:
        return cls(RequestSchemas(body))

    def offers(self, name: str) -> bool:
        return name in self.schemas

    def validator(self, name: str) -> Validator | None:
        if name not in self._validators:
            schema = self.schemas.get(name)
            self._validators[name] = compiled(orjson.dumps(schema)) if isinstance(
                schema, dict) else None
        return self._validators[name]

    def resolve(self, name: str) -> str | None:
        """R8: the offered tool a name means, when it is not one exactly: without a
        `functions.` prefix, a `:N` suffix or harmony tokens, then the one offered tool with
        that name in another case. None when no single tool is meant."""
        if name in self.schemas:
            return name
        found = {tool for part in _NAME_TOKEN.split(name) if part.strip()
                 for tool in [self._resolved_part(part)] if tool is not None}
        return found.pop() if len(found) == 1 else None

    def _resolved_part(self, part: str) -> str | None:
        cleaned = _NAME_INDEX.sub("", part.strip().removeprefix("functions."))
        if cleaned in self.schemas:
            return cleaned
        matches = [tool for tool in self.schemas if tool.lower() == cleaned.lower()]
        return matches[0] if len(matches) == 1 else None

    # ------------------------------------------------------------ the ladder

    def check(self, name: str, arguments: Any, *, truncated: bool = False) -> Check:
        """One call's outcome. `arguments`: its text as the upstream sent it, or a value (a
        text markup's parser's); `truncated`: the output limit cut the answer (nothing is
        repaired then)."""
        if isinstance(arguments, str):
            try:
                value = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                return self._check_text(name, arguments, truncated)
        else:
            value = arguments
        return self.check_value(name, value, truncated=truncated)

    def check_value(self, name: str, value: Any, *, truncated: bool = False,
                    kinds: tuple[str, ...] = ()) -> Check:
        """R0 on a parsed value, then the value rungs (R5–R8) when it does not validate."""
        tool = self.resolve(name)
        validator = self.validator(tool) if tool is not None else None
        if tool is None or validator is None:
            why = "no such tool" if tool is None else "no schema the validator knows"
            return Check("unchecked", name, value, kinds, why)
        if tool == name and validator.is_valid(value):
            return Check("valid" if not kinds else "repaired", name, value, kinds)
        if truncated:
            return Check("invalid", name, value, (*kinds, "truncated"),
                         *first_error(validator, value))
        if tool != name:
            kinds = (*kinds, "R8:name")
            if validator.is_valid(value):
                return Check("repaired", tool, value, kinds)
        return self._value_rungs(name, tool, validator, value, kinds)

    def _value_rungs(self, name: str, tool: str, validator: Validator, value: Any,
                     kinds: tuple[str, ...]) -> Check:
        schema = self.schemas[tool]
        original = value
        for rung in (_double_encoded, _wrapped, _coerced):
            changed, kind = rung(value, tool, schema)
            if kind:
                value, kinds = changed, (*kinds, *kind)
                if validator.is_valid(value):
                    return Check("repaired", tool, value, kinds)
        return Check("invalid", name, original, (), *first_error(validator, original))

    def _check_text(self, name: str, text: str, truncated: bool) -> Check:
        """Text that is not JSON: the text rungs (R1–R4), then the value rungs."""
        tool = self.resolve(name)
        validator = self.validator(tool) if tool is not None else None
        if validator is None:
            why = "no such tool" if tool is None else "no schema the validator knows"
            return Check("unchecked", name, None, (), why)
        if truncated:
            return Check("invalid", name, None, ("truncated",), "not valid JSON")
        for value, kind in _text_readings(text):
            check = self.check_value(name, value, kinds=(kind,))
            if check.passes:
                return check
        return Check("invalid", name, None, (), "not valid JSON")

    def accept(self, name: str, arguments: Any) -> dict[str, Any] | None:
        """The arguments to send for a call, when the named tool is offered (or R8 finds it)
        and they validate as they are or once repaired; None otherwise. The shape the text
        markup parsers take as their check."""
        check = self.check(name, arguments)
        return check.value if check.passes and isinstance(check.value, dict) else None


def _text_readings(text: str) -> Iterable[tuple[Any, str]]:
    """R1–R4, lazily: each reading of a text that is not JSON, with its rung's kind."""
    if not text.strip():
        yield {}, "R1:empty"
        return
    try:
        yield tool_repair.loads_lenient(text), "R2:control_chars"
        return
    except ValueError:
        pass
    found = tool_repair.fenced_or_leading(text)
    if found is not None:
        yield found
        return
    repaired = tool_repair.syntax_repaired(text)
    if repaired is not None:
        yield repaired, "R4:json_repair"


def _double_encoded(value: Any, tool: str, schema: Schema) -> tuple[Any, tuple[str, ...]]:
    inner = tool_repair.unwrapped_string(value)
    return (inner, ("R5:double_encoded",)) if inner is not None else (value, ())


def _wrapped(value: Any, tool: str, schema: Schema) -> tuple[Any, tuple[str, ...]]:
    inner = tool_repair.unwrapped_object(value, tool, schema)
    return (inner, ("R6:wrapper",)) if inner is not None else (value, ())


def _coerced(value: Any, tool: str, schema: Schema) -> tuple[Any, tuple[str, ...]]:
    changed, kinds = tool_repair.coerced(value, schema)
    return changed, tuple(kinds)


def metric_kind(kind: str) -> str:
    """A repair kind without its path (`R7:$.todos:string->array` → `R7:string->array`): the
    label of a counter, whose values must be few."""
    rung, _, rest = kind.partition(":")
    return f"{rung}:{rest.rsplit(':', 1)[-1]}" if rest else rung
