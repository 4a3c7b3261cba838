"""The JSON type of every field the Messages API defines for a request's blocks and members,
checked once at the edge: a value of the wrong type anywhere is the client's 400 naming the
field, never an exception in a layer below (which reads these fields trusting their type).

Types only, as the `anthropic` SDK's request types (2.14) give them: a field may be absent
(the layers below have their defaults), null where the SDK allows None, and unknown fields
and block types pass (Claude Code adds new ones often; the conversion sends an unknown
block's text, or drops it). A known block type where the API takes none (a `tool_use`
inside a tool result) is refused, as Anthropic refuses it: nested content is of the kinds
listed for it. Numbers are JSON's: an integer field takes no float or boolean.

`Shape.inside` gives None for a container whose contents fit, and otherwise the message and
the steps to the field, innermost first (each level adds its own step on the way out: a
value that fits builds nothing). The messages' blocks are checked in the census's walk
(conversion/census.py, with `BLOCK_FIELDS`: the walk's own loop, no call for a block whose
fields fit by their type alone), the request's other members by `REQUEST`
(server/requests.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Problem = list[Any]
"""[message, innermost step, …, outermost step]."""


class Mismatch(Exception):
    """A field of the wrong type: `where` the steps to it, outermost first."""

    def __init__(self, where: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message

    def __str__(self) -> str:
        return f"{'.'.join(map(str, self.where)) or 'body'}: {self.message}"


def mismatch(problem: Problem, *outer: Any) -> Mismatch:
    """`problem` as the exception, the steps `outer` before its own."""
    return Mismatch((*outer, *reversed(problem[1:])), problem[0])


class Shape:
    """What a value must be. `accepts`: for each Python type of the JSON values it takes,
    None when a value of that type fits as it is, or the shape whose `inside` checks what
    it holds. `what`: the types' name in an error."""

    accepts: dict[type, Shape | None]
    what: str

    def problem(self, value: Any) -> Problem | None:
        """What is wrong with `value` (None: nothing)."""
        inner = self.accepts.get(type(value), WRONG)
        if inner is None:
            return None
        return inner.inside(value) if inner is not WRONG else [f"Input should be {self.what}"]

    def inside(self, value: Any) -> Problem | None:
        """What is wrong within `value`, which is of one of the container types accepted."""
        raise NotImplementedError


WRONG = Shape()
"""What `accepts` has for a type it does not take."""


class Is(Shape):
    """A JSON value of one of `kinds`, nothing asked of what it holds."""

    def __init__(self, what: str, *kinds: type) -> None:
        self.accepts, self.what = dict.fromkeys(kinds), what


STRING = Is("a valid string", str)
BOOLEAN = Is("a valid boolean", bool)
INTEGER = Is("a valid integer", int)
NUMBER = Is("a valid number", int, float)
OBJECT = Is("a valid dictionary", dict)
NULL = Is("null", type(None))


class Obj(Shape):
    """An object whose known fields have their shapes (others are let through). The loop a
    request's every block goes through: a field whose value fits by its type alone (a
    string, a number) costs two dictionary lookups and no call."""

    def __init__(self, **fields: Shape) -> None:
        self.accepts, self.what = {dict: self}, "a valid dictionary"
        self.fields = {name: shape.accepts for name, shape in fields.items()}
        self.shapes = fields

    def inside(self, value: Any) -> Problem | None:
        fields = self.fields
        for name, item in value.items():
            accepts = fields.get(name)
            if accepts is None or accepts.get(type(item), WRONG) is None:
                continue
            found = self.shapes[name].problem(item)
            if found is not None:
                found.append(name)
                return found
        return None


class ListOf(Shape):
    def __init__(self, item: Shape) -> None:
        self.accepts, self.what, self.item = {list: self}, "a valid list", item

    def inside(self, value: Any) -> Problem | None:
        accepts = self.item.accepts
        for index, item in enumerate(value):
            if accepts.get(type(item), WRONG) is not None:
                found = self.item.problem(item)
                if found is not None:
                    found.append(index)
                    return found
        return None


def either(*shapes: Shape) -> Shape:
    """One of `shapes`, told apart by the value's JSON type (no two take the same one)."""
    union = Shape()
    union.accepts = {kind: inner for shape in shapes for kind, inner in shape.accepts.items()}
    union.what = " or ".join(shape.what for shape in shapes)
    return union


def nullable(shape: Shape) -> Shape:
    return either(shape, NULL)


def optional(shape: Shape) -> Shape:
    """`shape` or null, a null being as good as absent (a request's member): an error names
    `shape`'s types alone."""
    union = nullable(shape)
    union.what = shape.what
    return union


class Tagged(Shape):
    """An object told apart by its string `type`: a listed type has its shape; another type
    the Messages API defines for blocks is refused here (it has no place here), and a type
    nobody defines passes unless `others` is false (the proxy's layers drop what they do not
    know, or send its text). Without a `type`, nothing is known to check."""

    def __init__(self, shapes: Mapping[str, Obj], others: bool = True) -> None:
        self.accepts, self.what = {dict: self}, "a valid dictionary"
        self.shapes, self.others = shapes, others

    def inside(self, value: Any) -> Problem | None:
        kind = value.get("type")
        if type(kind) is not str:
            return None if "type" not in value else ["Input should be a valid string", "type"]
        shape = self.shapes.get(kind)
        if shape is None:
            if self.others and kind not in BLOCK_TYPES:
                return None
            return [f"Input tag {kind!r} found using 'type' does not match any of the "
                    f"expected tags: {', '.join(map(repr, self.shapes))}", "type"]
        found = shape.inside(value)
        if found is not None:
            found.append(kind)
        return found


def blocks(shapes: Mapping[str, Obj], others: bool = True) -> ListOf:
    return ListOf(Tagged(shapes, others))


# ---------------------------------------------------------------- the blocks' parts

BLOCK_TYPES = frozenset({
    "text", "image", "document", "search_result", "tool_reference", "tool_use",
    "tool_result", "thinking", "redacted_thinking", "server_tool_use",
    "web_search_tool_result", "tool_search_tool_result", "web_fetch_tool_result",
    "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result", "mcp_tool_use", "mcp_tool_result",
    "container_upload", "compaction"})
"""The block types of `BLOCKS` (a nested list takes some of them, and refuses the others)."""

CACHE_CONTROL = nullable(Obj(type=STRING, ttl=STRING, scope=STRING))
CITATION = Obj(type=STRING, cited_text=STRING, document_index=INTEGER,
               document_title=nullable(STRING), file_id=nullable(STRING),
               start_char_index=INTEGER, end_char_index=INTEGER, start_page_number=INTEGER,
               end_page_number=INTEGER, start_block_index=INTEGER, end_block_index=INTEGER,
               url=STRING, title=nullable(STRING), encrypted_index=STRING,
               search_result_index=INTEGER, source=STRING)
CITATIONS = nullable(Obj(enabled=BOOLEAN))
CALLER = Obj(type=STRING, tool_id=STRING)
TEXT = Obj(text=STRING, cache_control=CACHE_CONTROL, citations=nullable(ListOf(CITATION)))
TEXTS = blocks({"text": TEXT}, others=False)
IMAGE_SOURCE = Tagged({"base64": Obj(media_type=STRING, data=STRING),
                       "url": Obj(url=STRING), "file": Obj(file_id=STRING)})
IMAGE = Obj(source=IMAGE_SOURCE, cache_control=CACHE_CONTROL, transformations=nullable(OBJECT))
DOCUMENT_SOURCE = Tagged({
    "base64": Obj(media_type=STRING, data=STRING), "text": Obj(media_type=STRING, data=STRING),
    "url": Obj(url=STRING), "file": Obj(file_id=STRING),
    "content": Obj(content=either(STRING, blocks({"text": TEXT, "image": IMAGE},
                                                 others=False)))})
DOCUMENT = Obj(source=DOCUMENT_SOURCE, cache_control=CACHE_CONTROL, citations=CITATIONS,
               context=nullable(STRING), title=nullable(STRING))
SEARCH_RESULT = Obj(source=STRING, title=STRING, content=TEXTS, cache_control=CACHE_CONTROL,
                    citations=CITATIONS)
TOOL_REFERENCE = Obj(tool_name=STRING, cache_control=CACHE_CONTROL)
TOOL_RESULT_CONTENT = {"text": TEXT, "image": IMAGE, "search_result": SEARCH_RESULT,
                       "document": DOCUMENT, "tool_reference": TOOL_REFERENCE}


def _call(input: Shape = OBJECT, **fields: Shape) -> Obj:
    """A tool call block: its id, name and input object."""
    return Obj(id=STRING, name=STRING, input=input, cache_control=CACHE_CONTROL,
               caller=CALLER, **fields)


def _server_result(content: Shape) -> Obj:
    """A server tool's result block (what a client sends back of an earlier turn)."""
    return Obj(tool_use_id=STRING, content=content, cache_control=CACHE_CONTROL, caller=CALLER)


WEB_SEARCH_RESULT = Obj(type=STRING, url=STRING, title=STRING, encrypted_content=STRING,
                        page_age=nullable(STRING))
SERVER_RESULT_ERROR = Obj(type=STRING, error_code=STRING, error_message=nullable(STRING))
# The results of the server tools the proxy does not run (web fetch, code execution) are
# sent on as text or dropped: their content is an object, whatever it holds.
SERVER_RESULT = _server_result(OBJECT)

# ---------------------------------------------------------------- the blocks

BLOCKS: dict[str, Obj] = {
    **TOOL_RESULT_CONTENT,
    # A string input too: the proxy's own answer where a model's call was not JSON (the text
    # as it came, docs/tool-calls.md), which a client sends back as it got it.
    "tool_use": _call(input=either(OBJECT, STRING), toolset_name=nullable(STRING)),
    "tool_result": Obj(tool_use_id=STRING, is_error=BOOLEAN, cache_control=CACHE_CONTROL,
                       content=either(STRING, blocks(TOOL_RESULT_CONTENT)),
                       toolset_name=nullable(STRING)),
    "thinking": Obj(thinking=STRING, signature=STRING),
    "redacted_thinking": Obj(data=STRING),
    "server_tool_use": _call(),
    "web_search_tool_result": _server_result(either(ListOf(WEB_SEARCH_RESULT),
                                                    SERVER_RESULT_ERROR)),
    "tool_search_tool_result": _server_result(Obj(
        type=STRING, error_code=STRING,
        tool_references=ListOf(Obj(type=STRING, tool_name=STRING)))),
    "web_fetch_tool_result": SERVER_RESULT,
    "code_execution_tool_result": SERVER_RESULT,
    "bash_code_execution_tool_result": SERVER_RESULT,
    "text_editor_code_execution_tool_result": SERVER_RESULT,
    "mcp_tool_use": _call(server_name=STRING),
    "mcp_tool_result": Obj(tool_use_id=STRING, is_error=BOOLEAN, cache_control=CACHE_CONTROL,
                           content=either(STRING, TEXTS)),
    "container_upload": Obj(file_id=STRING, cache_control=CACHE_CONTROL),
    "compaction": Obj(content=nullable(STRING), encrypted_content=nullable(STRING),
                      signature=nullable(STRING), cache_control=CACHE_CONTROL),
}
"""Each block type a message's content may hold, by its `type` (`BLOCK_TYPES`)."""
MESSAGE_BLOCK = Tagged(BLOCKS)
BLOCK_FIELDS = {kind: shape.fields for kind, shape in BLOCKS.items()}
"""Each block type's `Obj.fields`: what each field's JSON types take (None when a value of
that type fits as it is)."""

# ---------------------------------------------------------------- the request's members

SYSTEM = either(STRING, blocks({"text": TEXT}))
TOOL = Obj(name=STRING, description=STRING, input_schema=OBJECT, type=nullable(STRING),
           cache_control=CACHE_CONTROL, defer_loading=BOOLEAN, strict=BOOLEAN,
           eager_input_streaming=nullable(BOOLEAN), input_examples=ListOf(OBJECT),
           max_uses=nullable(INTEGER), allowed_domains=nullable(ListOf(STRING)),
           blocked_domains=nullable(ListOf(STRING)), user_location=nullable(Obj(
               type=STRING, city=nullable(STRING), country=nullable(STRING),
               region=nullable(STRING), timezone=nullable(STRING))))
"""A custom tool, or a server tool (web search, tool search, …), one object of the fields
either has: the proxy tells them apart by their `type`."""
TOOLS = ListOf(TOOL)
TOOL_CHOICE = Obj(type=STRING, name=STRING, disable_parallel_tool_use=BOOLEAN)
THINKING = Obj(type=STRING, budget_tokens=INTEGER, display=nullable(STRING))
METADATA = Obj(user_id=nullable(STRING))
FORMAT = nullable(Obj(type=STRING))
"""(What a format must be is `refuse_unknown_format`'s to say: conversion/fields.py.)"""
OUTPUT_CONFIG = Obj(effort=nullable(STRING), format=FORMAT,
                    task_budget=nullable(Obj(type=STRING, total=INTEGER, remaining=INTEGER)))
COUNTER = Obj(type=STRING, value=INTEGER)
CONTEXT_MANAGEMENT = Obj(edits=ListOf(Obj(
    type=STRING, trigger=COUNTER, keep=either(STRING, COUNTER), clear_at_least=COUNTER,
    exclude_tools=ListOf(STRING), clear_tool_inputs=either(BOOLEAN, ListOf(STRING)))))
"""The types of `context_management` (what each edit means is conversion/context_edits.py's
to check, for `/v1/messages`)."""
SAFEGUARDS = ListOf(Obj(type=STRING))
REQUEST = Obj(**{name: optional(shape) for name, shape in {
    "system": SYSTEM, "tools": TOOLS, "tool_choice": TOOL_CHOICE, "thinking": THINKING,
    "metadata": METADATA, "output_config": OUTPUT_CONFIG, "output_format": FORMAT,
    "context_management": CONTEXT_MANAGEMENT, "safeguards": SAFEGUARDS}.items()})
"""The request's members that are objects and lists (a null one is as good as absent; the
messages are the census's to check, the scalars the request model's)."""
