"""Reasoning on the request side: the level the client asked for, and how each upstream
dialect is told. Pure functions; `apply_reasoning_parameters` in the request converter
strings them together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from claude_proxy.config.settings import Dialect, Passback, ProviderSettings
from claude_proxy.conversion.messages import AssistantTurn

logger = logging.getLogger("claude_proxy.conversion")

OpaqueFor = Callable[[dict[str, Any]], list[dict[str, Any]]]
"""A thinking block's opaque reasoning items, verified and produced by this very provider,
model and key (anything else: none)."""

_EFFORT_ALIASES = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                   "max": "high", "minimal": "minimal"}
_OLLAMA_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}


@dataclass(frozen=True)
class ReasoningRequest:
    """What the client wants: a level (None = off) and, if it gave one, a token budget or
    an effort in its own words (`max` and `xhigh` are more than `high` for Kimi K3)."""

    level: str | None
    budget: int | None = None
    effort: str | None = None


def level_for_budget(budget: int) -> str:
    if budget <= 2048:
        return "minimal"
    if budget <= 4096:
        return "low"
    if budget <= 8192:
        return "medium"
    return "high"


def requested_reasoning(request: dict[str, Any], settings: ProviderSettings) -> ReasoningRequest:
    """The client's intent first, then the configuration (reasoning.md, 'Deciding the level')."""
    thinking = request.get("thinking")
    if not isinstance(thinking, dict):
        if settings.reasoning_default_enabled:
            return ReasoningRequest(settings.reasoning_effort)
        return ReasoningRequest(None)
    kind = thinking.get("type")
    if kind == "disabled":
        return ReasoningRequest(None)
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            return ReasoningRequest(level_for_budget(budget), budget)
        return ReasoningRequest(settings.reasoning_effort)
    # "adaptive" (what Claude Code sends to a custom base URL) and newer kinds.
    output_config = request.get("output_config")
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    if isinstance(effort, str) and effort in _EFFORT_ALIASES:
        return ReasoningRequest(_EFFORT_ALIASES[effort], effort=effort)
    return ReasoningRequest(settings.reasoning_effort)


def effective_reasoning(request: dict[str, Any], settings: ProviderSettings,
                        has_tools: bool) -> ReasoningRequest:
    """The client's intent, turned off for requests with tools unless REASONING_WITH_TOOLS
    (older models cannot call functions while thinking)."""
    wanted = requested_reasoning(request, settings)
    if wanted.level is not None and has_tools and not settings.reasons_with_tools:
        logger.info("thinking turned off: the request has tools and profile %s does not "
                    "think with tools (set REASONING_WITH_TOOLS=true to keep it)",
                    settings.provider_name)
        return ReasoningRequest(None)
    return wanted


def dialect_parameters(dialect: Dialect, wanted: ReasoningRequest, *, provider: str,
                       verbosity: str | None) -> dict[str, Any]:
    """The body fields that turn reasoning on (at a level) or off, in one dialect.

    Never a contradictory pair: an effort is only sent with "on", a budget only where the
    dialect takes one, and OpenRouter gets an effort or a budget, never both.
    """
    on = wanted.level is not None
    if dialect == "enable_thinking":
        params: dict[str, Any] = {"enable_thinking": on}
        if on and wanted.budget:
            params["thinking_budget"] = wanted.budget
        return params
    if dialect == "thinking":
        return {"thinking": {"type": "enabled" if on else "disabled"}}
    if dialect == "openrouter":
        if not on:
            return {"reasoning": {"enabled": False}}
        if wanted.budget:
            return {"reasoning": {"max_tokens": wanted.budget}}
        return {"reasoning": {"effort": wanted.level}}
    if dialect == "chat_template_kwargs":
        # Qwen3 templates read enable_thinking; DeepSeek-V3.1 and Granite read thinking.
        return {"chat_template_kwargs": {"enable_thinking": on, "thinking": on}}
    if dialect == "minimax":
        # M2/M3 always reason; split, the reasoning comes as reasoning_details, not <think>.
        return {"reasoning_split": True}
    if dialect == "gemini":
        # Gemini 3 cannot stop thinking (3.x Pro refuses "none"): off leaves the default.
        return {"reasoning_effort": wanted.level} if on else {}
    return _effort_parameters(wanted, provider=provider, verbosity=verbosity)


def _effort_parameters(wanted: ReasoningRequest, *, provider: str,
                       verbosity: str | None) -> dict[str, Any]:
    if provider == "ollama":
        # Ollama takes only high|medium|low|none, and "none" is its explicit off.
        return {"reasoning_effort": _OLLAMA_EFFORTS.get(wanted.level or "", "none")}
    if wanted.level is None:
        return {}
    params: dict[str, Any] = {"reasoning_effort": wanted.level}
    if verbosity:
        params["verbosity"] = verbosity
    return params


def attach_passback(
    messages: list[dict[str, Any]],
    turns: list[tuple[int, AssistantTurn]],
    field: Passback,
    is_ours: Callable[[dict[str, Any]], bool],
) -> None:
    """Put each assistant turn's earlier thinking back on its message as `field`.

    Turns that made tool calls always get the field (`""` when they had no thinking), since
    DeepSeek and Kimi reject tool-call turns without it. Thinking blocks that are not the
    proxy's own (a foreign signature) and redacted thinking are dropped.
    """
    if field == "none":
        return
    for position, turn in turns:
        text = our_thinking(turn, is_ours)
        message = messages[position]
        if text or message.get("tool_calls"):
            message[field] = text


def our_thinking(turn: AssistantTurn, is_ours: Callable[[dict[str, Any]], bool]) -> str:
    """The text of a turn's thinking blocks that the proxy itself produced."""
    return "".join(block.get("thinking", "") for block in turn.thinking
                   if block.get("type") == "thinking" and is_ours(block))


def attach_opaque_details(
    messages: list[dict[str, Any]],
    turns: list[tuple[int, AssistantTurn]],
    opaque_for: OpaqueFor,
) -> bool:
    """Put the opaque `reasoning_details` entries (OpenRouter: encrypted reasoning, Gemini
    thought signatures, signed text) of each turn's thinking back on its message, whatever
    REASONING_PASSBACK says: the upstream that produced them needs them (Gemini 3 refuses a
    tool-call turn without its signature). Returns whether any went back."""
    attached = False
    for position, turn in turns:
        if not turn.thinking:
            continue
        entries = [entry for block in turn.thinking if block.get("type") == "thinking"
                   for entry in opaque_for(block)
                   if str(entry.get("type", "")).startswith("reasoning.")]
        if entries:
            messages[position]["reasoning_details"] = entries
            attached = True
    return attached


TOOL_CALL_EXTRA = "tool_call.extra_content"
"""The opaque item that keeps a tool call's `extra_content` (Gemini's thought signature)."""


def tool_call_extra(call_id: str, extra_content: dict[str, Any]) -> dict[str, Any]:
    return {"type": TOOL_CALL_EXTRA, "id": call_id, "extra_content": extra_content}


def attach_tool_call_extras(messages: list[dict[str, Any]],
                            turns: list[tuple[int, AssistantTurn]], opaque_for: OpaqueFor) -> None:
    """Put each kept `extra_content` back on the tool call it came with (by the upstream's
    call id; the turn's first call when the id is gone). Always, even for a model that
    refused the reasoning fields: Gemini 3 refuses a tool-call turn without its signature."""
    for position, turn in turns:
        if not turn.thinking:
            continue
        items = [item for block in turn.thinking if block.get("type") == "thinking"
                 for item in opaque_for(block) if item.get("type") == TOOL_CALL_EXTRA]
        calls = [call for call in messages[position].get("tool_calls") or []
                 if isinstance(call, dict)]
        for item in items:
            extra = item.get("extra_content")
            if not isinstance(extra, dict) or not calls:
                continue
            call = next((c for c in calls if c.get("id") == item.get("id")), calls[0])
            call["extra_content"] = extra
