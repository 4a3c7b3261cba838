"""The shape of incoming requests, checked once per request (chunks are never validated),
the same for `/v1/messages` and `/v1/messages/count_tokens`: every field the Messages API
defines, at every depth, of its JSON type (conversion/shapes.py), or a 400 naming it before
anything is sent upstream.

Unknown fields are allowed, since Claude Code adds new ones (`context_management`,
`output_config`, anything in CLAUDE_CODE_EXTRA_BODY) often. Scalars are strict: a `"true"`
is not a boolean, nor `"0.5"` a number (the layers below get the body as it came).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    Strict,
    StrictBool,
    StrictFloat,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from typing_extensions import TypedDict

from claude_proxy.conversion import shapes
from claude_proxy.conversion.census import Conversation, checked
from claude_proxy.errors import ProxyError

StrictInt = Annotated[int, Strict()]
Blocks = list[InstanceOf[dict]]  # type: ignore[type-arg]
"""Each block an object. Checked, not copied: the validated copy is thrown away, and on a
Claude Code conversation of hundreds of KB copying every block cost more than the check."""


Role = Literal["user", "assistant", "system"]
ROLES: tuple[str, ...] = get_args(Role)


class MessageParam(TypedDict):
    """A message: a dict, not a model, for the same reason (320 model objects per request
    late in a session, and the collections they set off)."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    role: Role
    content: str | Blocks


def _conversation(messages: Any, handler: ValidatorFunctionWrapHandler) -> Conversation:
    """The client's messages as a `Conversation` (census taken), checked by the census's
    own walk; the validator runs only when that walk finds something off, to name it."""
    if isinstance(messages, list) and messages:
        conversation = checked(messages, ROLES)
        if conversation is not None:
            return conversation
    handler(messages)
    return Conversation(messages)


Messages = Annotated[list[MessageParam], Field(min_length=1), WrapValidator(_conversation)]


class CountTokensRequest(BaseModel):
    """count_tokens takes what `/v1/messages` takes, each of its type (`max_tokens` too,
    though it need not be there); the members that are objects and lists have their shapes
    in `shapes.REQUEST`."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    messages: Messages
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    stream: StrictBool | None = None
    stop_sequences: list[Annotated[str, Strict()]] | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[StrictInt, Field(ge=0)]


def validate_request(model: type[CountTokensRequest], payload: Any,
                     known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The payload itself once it fits `model` (its messages a `Conversation`, which keeps
    its census of block types); otherwise a 400 naming the first problem. `known`: members
    an earlier request checked, as they were (a session's system prompt and tools,
    server/incremental.py): a member that is the very object is not checked again, as
    `Remembered` messages are not."""
    if not isinstance(payload, dict):
        raise ProxyError(400, "request body must be a JSON object")
    try:
        validated = model.model_validate(payload)
    except ValidationError as exc:
        raise ProxyError(400, describe_validation_error(exc)) from None
    except shapes.Mismatch as exc:
        raise ProxyError(400, str(exc)) from None
    members = payload if known is None else {
        name: value for name, value in payload.items() if known.get(name) is not value}
    problem = shapes.REQUEST.inside(members)
    if problem is not None:
        raise ProxyError(400, str(shapes.mismatch(problem)))
    payload["messages"] = validated.messages
    return payload


def describe_validation_error(exc: ValidationError) -> str:
    """`messages.0.role: Input should be 'user', 'assistant' or 'system'` style messages."""
    parts = []
    for error in exc.errors(include_url=False)[:3]:
        location = ".".join(_step(item) for item in error["loc"]) or "body"
        message = (_NOT_AN_OBJECT if error["type"] == "is_instance_of" else error["msg"])
        parts.append(f"{location}: {message}")
    return "; ".join(parts)


_NOT_AN_OBJECT = "Input should be a valid dictionary"
"""A block that is not an object (checked with `InstanceOf`, whose own words name a class)."""


def _step(item: int | str) -> str:
    """A step of an error's location; a union member's tag (`list[json-or-python[…]]`) by
    its kind alone (`list`)."""
    return str(item).split("[", 1)[0]
