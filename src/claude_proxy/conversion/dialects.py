"""Each provider's own quirks on top of the generic reasoning dialects (reasoning.py), one
section per provider, chosen by the provider profile. Pure functions.

The generic dialect says how thinking is switched on or off; these say what a provider's
newer models want instead (Kimi K3, GLM-5.x), what it refuses together with thinking
(DeepSeek V4 and Qwen on DashScope: a forced tool), and what it needs back on the next turn
(MiniMax: `reasoning_details`; Gemini 3: the thought signature on each tool-call turn).
Sources for every rule: docs/provider-dialects.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from claude_proxy.config.settings import matches_prefix
from claude_proxy.conversion.messages import AssistantTurn
from claude_proxy.conversion.reasoning import ReasoningRequest, our_thinking

logger = logging.getLogger("claude_proxy.conversion")

Body = dict[str, Any]


def forced_tool(body: Body) -> bool:
    """Whether the request forces a tool call (`required`, or one named function)."""
    choice = body.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


# ---------------------------------------------------------------- DeepSeek V4, DashScope

FORCED_TOOL_REFUSED = frozenset({"deepseek", "dashscope"})
"""Providers whose thinking mode refuses a forced `tool_choice` with a 400 (DeepSeek V4:
"Thinking mode does not support this tool_choice"; DashScope: "The tool_choice parameter does
not support being set to required or object in thinking mode")."""


def for_provider(wanted: ReasoningRequest, body: Body, provider: str) -> ReasoningRequest:
    """The reasoning a provider can do for this body: thinking off for one request when the
    client forces a tool where thinking mode refuses that (the forced call matters more)."""
    if wanted.level is not None and provider in FORCED_TOOL_REFUSED and forced_tool(body):
        logger.info("thinking turned off for this request: %s refuses a forced tool_choice "
                    "in thinking mode", provider)
        return ReasoningRequest(None)
    return wanted


# ---------------------------------------------------------------- Kimi K3

KIMI_K3 = ("kimi-k3",)


def kimi_fields(fields: Body, wanted: ReasoningRequest, model: str) -> Body:
    """K3 always reasons and takes a top-level `reasoning_effort` of low, high or max, and no
    K2.x `thinking` object; K2.x models keep the `thinking` switch."""
    if not matches_prefix(model, KIMI_K3):
        return fields
    return {"reasoning_effort": kimi_k3_effort(wanted)}


def kimi_k3_effort(wanted: ReasoningRequest) -> str:
    """The client's effort or budget on K3's scale: `max`/`xhigh` (or a budget above 16K) →
    max, medium and high → high, minimal and low → low. Off is `low`: K3 cannot stop."""
    if wanted.effort in ("max", "xhigh") or (wanted.budget or 0) > 16384:
        return "max"
    if wanted.level in ("medium", "high"):
        return "high"
    return "low"


# ---------------------------------------------------------------- GLM-5.x

_GLM_5 = re.compile(r"glm-5(?:\.(\d+))?")


def glm_fields(fields: Body, wanted: ReasoningRequest, model: str) -> Body:
    """GLM-5.x: thinking on keeps earlier turns' reasoning (`clear_thinking: false`,
    "preserved thinking", fed by the `reasoning_content` given back); thinking off is left
    unsaid for the always-thinking 5.2+ models, which refuse `disabled` with a 400."""
    match = _GLM_5.match(model.lower().rsplit("/", 1)[-1])
    if match is None:
        return fields
    if wanted.level is not None:
        return {"thinking": {"type": "enabled", "clear_thinking": False}}
    if int(match.group(1) or 0) >= 2:
        logger.debug("%s always thinks; thinking off is not sent (it is refused)", model)
        return {}
    return fields


# ---------------------------------------------------------------- MiniMax

MINIMAX_DETAIL = {"type": "reasoning.text", "id": "reasoning-text-1",
                  "format": "MiniMax-response-v1", "index": 0}
"""The shape MiniMax gives its reasoning in (`reasoning_split: true`) and wants back."""


def attach_reasoning_details(messages: list[Body], turns: list[tuple[int, AssistantTurn]],
                             is_ours: Callable[[Body], bool]) -> None:
    """MiniMax's interleaved thinking: each earlier turn's reasoning goes back as its
    `reasoning_details`, the proxy's own thinking text in MiniMax's shape."""
    for position, turn in turns:
        text = our_thinking(turn, is_ours)
        if text:
            messages[position]["reasoning_details"] = [{**MINIMAX_DETAIL, "text": text}]


# ---------------------------------------------------------------- Gemini 3

SKIP_SIGNATURE = "skip_thought_signature_validator"
"""Google's documented stand-in for a tool call without a thought signature (a compacted
conversation, another model's turn)."""


def sign_gemini_history(messages: list[Body]) -> None:
    """Every earlier tool-call turn without a thought signature gets the skip value on its
    first call: Gemini 3 refuses the turn otherwise (`Function call is missing a
    thought_signature`). Signatures of the proxy's own turns were put back before this."""
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list) or not calls:
            continue
        if any(isinstance(call, dict) and "extra_content" in call for call in calls):
            continue
        first = calls[0]
        if isinstance(first, dict):
            first["extra_content"] = {"google": {"thought_signature": SKIP_SIGNATURE}}


# ---------------------------------------------------------------- the table

FieldRule = Callable[[Body, ReasoningRequest, str], Body]
FIELD_RULES: dict[str, FieldRule] = {"kimi": kimi_fields, "glm": glm_fields}
"""Per provider profile: the dialect's fields → the fields this model really takes."""


def provider_fields(fields: Body, wanted: ReasoningRequest, *, provider: str,
                    model: str) -> Body:
    rule = FIELD_RULES.get(provider)
    return rule(fields, wanted, model) if rule is not None else fields
