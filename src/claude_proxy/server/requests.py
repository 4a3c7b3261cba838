"""The shape of incoming requests, checked once per request (chunks are never validated).

Only what the proxy relies on is checked; unknown fields are allowed, since Claude Code adds
new ones (`context_management`, `output_config`, anything in CLAUDE_CODE_EXTRA_BODY) often.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from claude_proxy.errors import ProxyError

StrictInt = Annotated[int, Strict()]
Blocks = list[dict[str, Any]]


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant", "system"]
    content: str | Blocks


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | Blocks | None = None
    tools: Blocks | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[StrictInt, Field(ge=0)]
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None


def validate_request(model: type[BaseModel], payload: Any) -> dict[str, Any]:
    """The payload itself once it fits `model`; otherwise a 400 naming the first problem."""
    if not isinstance(payload, dict):
        raise ProxyError(400, "request body must be a JSON object")
    try:
        model.model_validate(payload)
    except ValidationError as exc:
        raise ProxyError(400, describe_validation_error(exc)) from None
    return payload


def describe_validation_error(exc: ValidationError) -> str:
    """`messages.0.role: Input should be 'user', 'assistant' or 'system'` style messages."""
    parts = []
    for error in exc.errors(include_url=False)[:3]:
        location = ".".join(str(item) for item in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)
