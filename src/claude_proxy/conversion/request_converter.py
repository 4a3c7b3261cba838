"""Anthropic Messages request → OpenAI Chat Completions request (pure functions)."""

from __future__ import annotations

from typing import Any

from claude_proxy.config import Settings
from claude_proxy.conversion.messages import (
    AssistantTurn,
    convert_assistant_turn,
    convert_system,
    convert_system_turn,
    convert_user_turn,
)
from claude_proxy.conversion.tools import (
    convert_tool_choice,
    convert_tools,
    referenced_tool_names,
)

_TIERS = (("opus", "big"), ("sonnet", "middle"), ("haiku", "small"))


def map_model(requested: str, settings: Settings) -> str:
    """opus/sonnet/haiku names → BIG/MIDDLE/SMALL_MODEL; any other name passes unchanged."""
    lowered = requested.lower()
    for marker, tier in _TIERS:
        if marker in lowered:
            return settings.model_for_tier(tier)  # type: ignore[arg-type]
    return requested


def convert_messages(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[tuple[int, AssistantTurn]]]:
    """The OpenAI messages, and each assistant turn with its position in that list.

    The positions let the reasoning layer attach earlier thinking to the right message.
    """
    converted: list[dict[str, Any]] = []
    assistant_turns: list[tuple[int, AssistantTurn]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "assistant":
            turn = convert_assistant_turn(content)
            if turn.message is not None:
                assistant_turns.append((len(converted), turn))
                converted.append(turn.message)
        elif role == "system":
            system_message = convert_system_turn(content)
            if system_message is not None:
                converted.append(system_message)
        else:
            converted.extend(convert_user_turn(content))
    return converted, assistant_turns


def clamp_max_tokens(requested: int, limit: int) -> int:
    return max(1, min(requested, limit))


def convert_request(request: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The upstream body for a validated Anthropic request (without reasoning parameters)."""
    messages, _ = convert_messages(request["messages"])
    system = convert_system(request.get("system"))
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})

    body: dict[str, Any] = {
        "model": map_model(request["model"], settings),
        "messages": messages,
        "max_tokens": clamp_max_tokens(int(request["max_tokens"]), settings.max_output_tokens),
    }
    if request.get("stream"):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    _copy_sampling(request, body)
    _add_tools(request, body)
    return body


def _copy_sampling(request: dict[str, Any], body: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        if request.get(name) is not None:
            body[name] = request[name]
    stop = request.get("stop_sequences")
    if stop:
        body["stop"] = list(stop)
    metadata = request.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        body["user"] = metadata["user_id"]


def _add_tools(request: dict[str, Any], body: dict[str, Any]) -> None:
    loaded = referenced_tool_names(request["messages"])
    tools = convert_tools(request.get("tools"), loaded)
    if not tools:
        return
    body["tools"] = tools
    available = {tool["function"]["name"] for tool in tools}
    choice, parallel = convert_tool_choice(request.get("tool_choice"), available)
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
