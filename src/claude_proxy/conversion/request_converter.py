"""Anthropic Messages request → OpenAI Chat Completions request (pure functions)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from claude_proxy.config.settings import Dialect, ProviderSettings, Tier, matches_prefix
from claude_proxy.conversion.caching import apply_prompt_cache, cache_mode, keeps_breakpoints
from claude_proxy.conversion.census import holds
from claude_proxy.conversion.dialects import (
    attach_reasoning_details,
    for_provider,
    provider_fields,
    sign_gemini_history,
)
from claude_proxy.conversion.messages import (
    AssistantTurn,
    Part,
    convert_assistant_turn,
    convert_system,
    convert_system_turn,
    convert_user_turn,
    system_parts,
)
from claude_proxy.conversion.reasoning import (
    OpaqueFor,
    attach_opaque_details,
    attach_passback,
    attach_tool_call_extras,
    dialect_parameters,
    effective_reasoning,
)
from claude_proxy.conversion.reuse import (
    Context,
    Converted,
    Prefix,
    Prewritten,
    Slot,
    first_holding,
    first_marked,
    reusable,
)
from claude_proxy.conversion.stop_sequences import STOP_REPORTING_PROFILES
from claude_proxy.conversion.structured import (
    StructuredMode,
    apply_structured_output,
    requested_schema,
)
from claude_proxy.conversion.text_tool_calls import TextCallPlan
from claude_proxy.conversion.tool_groups import (
    disabled_groups,
    groups_with_extensions,
    remove_tool_groups,
)
from claude_proxy.conversion.tools import (
    convert_tool_choice,
    convert_tools,
    expand_tool_references,
)

logger = logging.getLogger("claude_proxy.conversion")

_TIERS: tuple[tuple[str, Tier], ...] = (("opus", "big"), ("fable", "big"), ("mythos", "big"),
                                        ("sonnet", "middle"), ("haiku", "small"))
"""Claude family names → tiers, first match wins. Fable and Mythos stand above Opus
(Claude Code 2.1.332 knows `claude-fable-5-2` and `claude-mythos-5`, and offers `fable` to
its Agent tool), so they take the biggest model."""
# Profiles whose servers take `top_k` (SGLang runs with the vllm profile); the OpenAI-style
# APIs of the others have no such field.
TOP_K_PROFILES = frozenset({"vllm", "llamacpp", "ollama"})


def map_model(requested: str, settings: ProviderSettings) -> str:
    """Claude names → BIG/MIDDLE/SMALL_MODEL: the aliases (`opus`, `sonnet`, `haiku`), the
    canonical and dated ids (`claude-opus-4-5`, `claude-opus-4-5-20251101`) and the opus
    id Claude Code re-asks under after a refusal all name their family; fable and mythos map
    to BIG. Any other name passes unchanged (the router strips a `[1m]` marker first)."""
    lowered = requested.lower()
    for marker, tier in _TIERS:
        if marker in lowered:
            return settings.model_for_tier(tier)
    return requested


def convert_messages(
    messages: list[dict[str, Any]], system: str | list[Part] | None = None,
    keep_parts: bool = False, ends: list[int] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[int, AssistantTurn]]]:
    """The OpenAI messages (the system prompt first), and each assistant turn with its
    position in that list, so the reasoning layer can attach earlier thinking to it.
    `keep_parts` keeps marked content as parts (an upstream that takes breakpoints); `ends`
    gets, per message, how many OpenAI messages (the system prompt's left out) it and the
    ones before it made (each message is converted alone: conversion/reuse.py)."""
    converted: list[dict[str, Any]] = []
    if system is not None:
        converted.append({"role": "system", "content": system})
    first = len(converted)
    assistant_turns: list[tuple[int, AssistantTurn]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "assistant":
            turn = convert_assistant_turn(content, keep_parts)
            if turn.message is not None:
                assistant_turns.append((len(converted), turn))
                converted.append(turn.message)
        elif role == "system":
            system_message = convert_system_turn(content, keep_parts)
            if system_message is not None:
                converted.append(system_message)
        else:
            converted.extend(convert_user_turn(content, keep_parts))
        if ends is not None:
            ends.append(len(converted) - first)
    return converted, assistant_turns


MEDIA_PLACEHOLDER = "[{kind} omitted: this model does not accept images or documents]"


def without_media(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with every image and document (tool results included) replaced by a
    short text placeholder, for a provider configured with `vision = false`. A message
    without any stays the very object it was (conversion/reuse.py), and so does the list
    when none has any."""
    if not holds(messages, "image", "document"):
        return messages
    replaced = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = _media_as_text(content)
            if texts is not content:
                message = {**message, "content": texts}
        replaced.append(message)
    return replaced


def _media_as_text(content: list[Any]) -> list[Any]:
    """`content` with its media as placeholders (itself when it holds none)."""
    replaced = []
    for block in content:
        if isinstance(block, dict) and block.get("type") in ("image", "document"):
            block = {"type": "text", "text": MEDIA_PLACEHOLDER.format(kind=block["type"])}
        elif (isinstance(block, dict) and block.get("type") == "tool_result"
              and isinstance(block.get("content"), list)):
            inner = _media_as_text(block["content"])
            if inner is not block["content"]:
                block = {**block, "content": inner}
        replaced.append(block)
    if all(new is old for new, old in zip(replaced, content, strict=True)):
        return content
    return replaced


def clamp_max_tokens(requested: int, limit: int) -> int:
    return max(1, min(requested, limit))


@dataclass
class UpstreamRequest:
    """The upstream body and what the rest of the pipeline needs to know about it."""

    body: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)
    """Reasoning fields the proxy added (logged at DEBUG; a 400 naming one triggers the
    fallback)."""
    thinking: bool = False
    """Whether the answer's reasoning is wanted (the client's intent after the tools rule);
    inline `<think>` text is removed from the answer when it is not."""
    think_tags: bool = False
    """Split `<think>` tags out of the content of this model's answer."""
    text_calls: TextCallPlan | None = None
    """What to read as tool calls from this model's text (the `*_TOOL_CALL_PREFIXES`; set
    for every API by upstream/api.py)."""
    buffered: bool = False
    """Fetched without streaming and replayed as a stream (BUFFER_STREAM_MODEL_PREFIXES)."""
    api: Literal["chat", "responses", "messages"] = "chat"
    """The upstream API the body is for (upstream/api.py): /chat/completions, /responses or
    /v1/messages."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers of this request besides the endpoint's own (a Messages upstream's
    `anthropic-beta`)."""


def convert_request(
    request: dict[str, Any],
    settings: ProviderSettings,
    *,
    model: str | None = None,
    is_ours: Callable[[dict[str, Any]], bool] = lambda block: False,
    opaque_for: OpaqueFor = lambda block: [],
    without_reasoning: bool = False,
    structured: StructuredMode = "json_schema",
    cache_key: str | None = None,
    slot: Slot | None = None,
) -> UpstreamRequest:
    """The upstream request for a validated Anthropic request.

    `model` is the upstream model the router chose (default: the tier mapping); `is_ours`
    tells the proxy's own thinking blocks (passed back upstream) from foreign ones;
    `opaque_for` gives a block's opaque reasoning that this provider, model and key produced
    (it goes back as `reasoning_details`); `without_reasoning` leaves every reasoning field
    out (a model known to refuse them); `structured` is how a requested JSON schema is asked
    for (see `structured.py`); `cache_key` is the session's prompt-cache key
    (`caching.session_cache_key`); `slot`: the conversation's last conversion, whose
    converted messages this one reuses where its messages are the same (conversion/reuse.py:
    the steps after the conversion then work on the new messages and the system prompt).
    """
    model = model or map_model(request["model"], settings)
    request = expand_tool_references(request)  # ToolSearch's results, as it promises them
    mode = cache_mode(settings, model)
    keep_parts = keeps_breakpoints(mode)
    system = (system_parts if keep_parts else convert_system)(request.get("system"))
    source = request["messages"] if settings.vision else without_media(request["messages"])
    context = Context(settings, model, without_reasoning, system is not None)
    prefix = reusable(slot, source, context)
    shared = prefix.count if prefix is not None else 0
    ends: list[int] = []
    fresh, assistant_turns = convert_messages(source[shared:] if shared else source, system,
                                              keep_parts, ends)
    messages = fresh if prefix is None else [fresh[0], *prefix.messages, *fresh[1:]]

    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": clamp_max_tokens(int(request["max_tokens"]), settings.max_output_tokens),
    }
    buffered = bool(request.get("stream")) and matches_prefix(model, settings.buffered_models)
    if request.get("stream") and not buffered:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    _copy_sampling(request, body, settings)
    _add_tools(request, body, settings)
    schema = requested_schema(request)
    if schema is not None:
        apply_structured_output(body, schema, structured)
    result = UpstreamRequest(body, buffered=buffered)
    carried: tuple[str, ...] = ()
    if without_reasoning:
        result.thinking = effective_reasoning(request, settings, "tools" in body).level is not None
    else:
        result.extras, result.thinking = apply_reasoning_parameters(body, request, settings)
        passback = settings.passback
        if passback == "reasoning_details":
            attach_reasoning_details(fresh, assistant_turns, is_ours)
        else:
            attach_passback(fresh, assistant_turns, passback, is_ours)
        if passback != "none" and ((prefix is not None and prefix.carries(passback))
                                   or any(passback in message for message in fresh)):
            result.extras[passback] = "<history>"
        if attach_opaque_details(fresh, assistant_turns, opaque_for) or (
                prefix is not None and prefix.carries("reasoning_details")):
            result.extras["reasoning_details"] = "<history>"
        carried = tuple(name for name in (passback, "reasoning_details") if name != "none")
    attach_tool_call_extras(fresh, assistant_turns, opaque_for)
    if settings.dialect == "gemini":
        sign_gemini_history(fresh)
    result.think_tags = matches_prefix(model, settings.think_tag_models)
    kept = (_converted(context, source, ends, prefix, fresh, keep_parts, carried)
            if slot is not None and system is not None else None)
    apply_prompt_cache(body, request.get("tools"), settings, mode, cache_key, fresh)
    if slot is not None and kept is not None:
        result.body = Prewritten(body, kept, prefix, slot)
    return result


def _converted(context: Context, source: list[Any], ends: list[int], prefix: Prefix | None,
               fresh: list[dict[str, Any]], keep_parts: bool,
               carried: tuple[str, ...]) -> Converted:
    """This conversion as the next request may reuse it: `fresh` (the system prompt first)
    converted from the messages after the prefix, each ending at `ends`. Taken before the
    cache step, which may drop a marker that `marked` must see."""
    shared = prefix.count if prefix is not None else 0
    made = fresh[1:]
    if prefix is None:
        all_ends, messages = ends, made
    else:
        before = prefix.converted.ends[:shared]
        all_ends = [*before, *(end + before[-1] for end in ends)]
        messages = [*prefix.messages, *made]
    carrying = {}
    for name in carried:
        if prefix is not None and prefix.carries(name):
            carrying[name] = prefix.converted.carrying[name]
            continue
        found = first_holding(made, ends, name)
        carrying[name] = len(source) if found is None else shared + found
    marked = len(source)  # a prefix ends before the first marked message (`reusable`)
    if keep_parts:
        found = first_marked(made, ends)
        marked = marked if found is None else shared + found
    return Converted(context, source, all_ends, messages, carrying, marked)


def apply_reasoning_parameters(
    body: dict[str, Any], request: dict[str, Any], settings: ProviderSettings
) -> tuple[dict[str, Any], bool]:
    """Turn thinking on or off upstream, in the upstream's dialect.

    Returns the fields added and whether thinking is wanted. Only models matching
    REASONING_CHAT_PREFIXES or REASONING_MODEL_PREFIXES get any field: other upstreams
    (Azure among them) reject fields they do not know.
    """
    model = body["model"]
    wanted = for_provider(effective_reasoning(request, settings, "tools" in body), body,
                          settings.provider_name)
    on = wanted.level is not None
    is_reasoning_model = matches_prefix(model, settings.model_prefixes)
    if not is_reasoning_model and not matches_prefix(model, settings.chat_prefixes):
        return {}, on
    if is_reasoning_model:
        # OpenAI reasoning models: max_completion_tokens, and no sampling parameters.
        body["max_completion_tokens"] = body.pop("max_tokens")
        for name in ("temperature", "top_p", "top_k"):
            body.pop(name, None)
        dialect: Dialect = "reasoning_effort"
    else:
        dialect = settings.dialect
    extras = dialect_parameters(dialect, wanted, provider=settings.provider_name,
                                verbosity=settings.reasoning_verbosity)
    if not is_reasoning_model:
        extras = provider_fields(extras, wanted, provider=settings.provider_name, model=model)
    body.update(extras)
    if on:
        limit_key = "max_completion_tokens" if is_reasoning_model else "max_tokens"
        body[limit_key] = clamp_max_tokens(int(request["max_tokens"]),
                                           settings.reasoning_max_output_tokens)
    return extras, on


def _without_disabled_groups(tools: list[dict[str, Any]], model: str,
                             settings: ProviderSettings) -> list[dict[str, Any]]:
    if not tools or not settings.tool_groups_disabled:
        return tools
    match = disabled_groups(settings.tool_groups_disabled, settings.provider_name, model)
    if match is None:
        return tools
    suffix, groups = match
    patterns = groups_with_extensions(settings.tool_group_patterns)
    kept, removed = remove_tool_groups(tools, groups, patterns)
    if removed:
        logger.info("TOOL_GROUPS_DISABLED_%s (%s) removed %d tools for %s: %s", suffix,
                    ",".join(groups), len(removed), model, ", ".join(removed))
    return kept


def _copy_sampling(request: dict[str, Any], body: dict[str, Any],
                   settings: ProviderSettings) -> None:
    names = ("temperature", "top_p", "top_k") if settings.provider_name in TOP_K_PROFILES else (
        "temperature", "top_p")
    for name in names:
        if request.get(name) is not None:
            body[name] = request[name]
    stop = request.get("stop_sequences")
    if stop and settings.provider_name in STOP_REPORTING_PROFILES:
        body["stop"] = list(stop)  # elsewhere the proxy matches them (stop_sequences.py)
    metadata = request.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        body["user"] = anonymous_user(metadata["user_id"])


def anonymous_user(user_id: str) -> str:
    """`metadata.user_id` as the upstream's `user`: a stable hash, never the raw value
    (Claude Code's names a device, an account and a session)."""
    return "user-" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def _add_tools(request: dict[str, Any], body: dict[str, Any], settings: ProviderSettings) -> None:
    body.update(chat_tool_fields(request, body["model"], settings))


def chat_tool_fields(request: dict[str, Any], model: str,
                     settings: ProviderSettings) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` in Chat Completions' form (disabled
    tool groups removed); nothing when no tool is left. `request` has been through
    `expand_tool_references`: the deferred tools its references load have lost their
    `defer_loading`, and the others are left out."""
    tools = _without_disabled_groups(convert_tools(request.get("tools")), model, settings)
    if not tools:
        return {}
    fields: dict[str, Any] = {"tools": tools}
    available = {tool["function"]["name"] for tool in tools}
    choice, parallel = convert_tool_choice(request.get("tool_choice"), available)
    if choice is not None:
        fields["tool_choice"] = choice
    if parallel is not None:
        fields["parallel_tool_calls"] = parallel
    return fields
