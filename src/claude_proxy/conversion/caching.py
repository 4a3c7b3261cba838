"""Prompt caching across the translation (pure functions, dict in, dict out).

Claude Code marks `cache_control` breakpoints and re-sends its whole prefix on every turn.
Upstreams cache in one of two ways: on explicit breakpoints (OpenRouter's `anthropic/*`,
`qwen/*` and `google/*` models, DashScope), or automatically on byte-identical prefixes
(OpenAI, Azure, DeepSeek, Kimi, GLM, vLLM, SGLang). `PROMPT_CACHE` says which per provider:

- `breakpoints`: each marker stays on the content part the client marked (the converter keeps
  marked content as parts), at most 4, the last 4 in the order tools → system → messages;
- `last_breakpoint`: only the last marker (OpenRouter `google/*` uses only that one);
- `automatic`: no marker; a `prompt_cache_key` (a hash of the session) where it is taken;
- `off`: neither.

Automatic caching hits only while each request begins with the bytes of the one before, so
the converter is deterministic (orjson, order kept), keeps mid-conversation system messages in
place and leaves the billing header out; where a template refuses a later system message it is
sent in place as a user message (`system_messages_as_user`, learned as a refusal), and so it is
where a template would move it to the front (DeepSeek's).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

from claude_proxy.config.settings import CacheMode, ProviderSettings, matches_prefix

MAX_BREAKPOINTS = 4
# TTLs OpenRouter passes to Anthropic; everywhere else the marker is just `ephemeral`.
ANTHROPIC_TTLS = ("5m", "1h")
# Profiles whose API takes `prompt_cache_key`, and hosts behind those profiles that refuse it
# (unknown hosts get the `generic` profile, which sends it as `openai` does: Groq and Gemini
# answer 400 to the field).
CACHE_KEY_PROFILES = frozenset({"openai", "generic", "azure", "openrouter"})
CACHE_KEY_REFUSING_HOSTS = ("groq.com", "googleapis.com")
SYSTEM_REMINDER = ("<system-reminder>\n", "\n</system-reminder>")

Part = dict[str, Any]


# ---------------------------------------------------------------- modes


def cache_mode(settings: ProviderSettings, model: str) -> CacheMode:
    """PROMPT_CACHE, else the default for the profile and the upstream model."""
    if settings.prompt_cache is not None:
        return settings.prompt_cache
    profile = settings.provider_name
    if profile == "dashscope":
        return "breakpoints"
    if profile == "openrouter":
        vendor = model.lower().split("/", 1)[0]
        if vendor in ("anthropic", "qwen"):
            return "breakpoints"
        if vendor == "google":
            return "last_breakpoint"
    return "automatic"


def keeps_breakpoints(mode: CacheMode) -> bool:
    return mode in ("breakpoints", "last_breakpoint")


def takes_cache_key(settings: ProviderSettings) -> bool:
    host = settings.openai_base_url.lower()
    return (settings.provider_name in CACHE_KEY_PROFILES
            and not any(refusing in host for refusing in CACHE_KEY_REFUSING_HOSTS))


def takes_ttl(settings: ProviderSettings, model: str) -> bool:
    return settings.provider_name == "openrouter" and model.lower().startswith("anthropic/")


def takes_tool_breakpoints(settings: ProviderSettings, mode: CacheMode) -> bool:
    """OpenRouter takes `cache_control` on function tools (not on the Gemini route)."""
    return settings.provider_name == "openrouter" and mode == "breakpoints"


def session_cache_key(session_header: str | None, request: dict[str, Any]) -> str | None:
    """A stable per-session key: a hash of the `X-Claude-Code-Session-Id` header, else of
    `metadata.user_id` (never the raw value, which names a device and an account)."""
    source = session_header
    if not source:
        metadata = request.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        source = user_id if isinstance(user_id, str) else None
    if not source:
        return None
    return "cc-" + hashlib.sha256(source.encode()).hexdigest()[:40]


# ---------------------------------------------------------------- the upstream body


def apply_prompt_cache(body: dict[str, Any], client_tools: Any, settings: ProviderSettings,
                       mode: CacheMode, cache_key: str | None,
                       fresh: list[dict[str, Any]] | None = None) -> None:
    """Leave in `body` the breakpoints (and cache key) that this upstream takes. `fresh`:
    the messages converted for this request, the system prompt first, when the others were
    converted before (conversion/reuse.py: they hold no marker, or none is kept in this
    mode, and their system messages were placed already): only these are looked at."""
    messages = (body.get("messages") or []) if fresh is None else fresh
    if keeps_breakpoints(mode):
        if takes_tool_breakpoints(settings, mode):
            mark_tools(body, client_tools)
        keep_ttl = takes_ttl(settings, body["model"])
        holders = list(_holders(body.get("tools"), messages))
        for holder in holders:
            holder["cache_control"] = clean_marker(holder["cache_control"], keep_ttl)
        limit = 1 if mode == "last_breakpoint" else MAX_BREAKPOINTS
        for holder in holders[:max(len(holders) - limit, 0)]:
            del holder["cache_control"]
    else:
        for holder in list(_holders(body.get("tools"), messages)):
            del holder["cache_control"]
    if cache_key and mode != "off" and takes_cache_key(settings):
        body["prompt_cache_key"] = cache_key
    if mode != "off" and hoists_system_messages(settings, body["model"]):
        _later_system_messages_as_user(messages)


def clean_marker(marker: dict[str, Any], keep_ttl: bool) -> dict[str, Any]:
    """`{"type": "ephemeral"}`, plus a known `ttl` where the upstream takes one; `scope` and
    any other key dropped (strict validators refuse them)."""
    clean: dict[str, Any] = {"type": "ephemeral"}
    if keep_ttl and marker.get("ttl") in ANTHROPIC_TTLS:
        clean["ttl"] = marker["ttl"]
    return clean


def mark_tools(body: dict[str, Any], client_tools: Any) -> None:
    """The client's tool breakpoints onto the converted function tools, matched by name."""
    markers = {tool["name"]: tool["cache_control"] for tool in client_tools or []
               if isinstance(tool, dict) and isinstance(tool.get("cache_control"), dict)
               and isinstance(tool.get("name"), str)}
    for tool in body.get("tools") or []:
        marker = markers.get(tool["function"]["name"])
        if marker is not None:
            tool["cache_control"] = dict(marker)


def breakpoint_holders(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every object carrying `cache_control`, in prompt order: tools, then the messages'
    content parts (the system message is the first message)."""
    return _holders(body.get("tools"), body.get("messages") or [])


def _holders(tools: Any, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for tool in tools or []:
        if isinstance(tool.get("cache_control"), dict):
            yield tool
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # most converted turns are a string: nothing to look at
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("cache_control"), dict):
                    yield part


def has_cache_control(body: dict[str, Any]) -> bool:
    return next(breakpoint_holders(body), None) is not None


def strip_cache_control(body: dict[str, Any]) -> None:
    """Remove every breakpoint (content parts keep their shape)."""
    for holder in list(breakpoint_holders(body)):
        del holder["cache_control"]


# ---------------------------------------------------------------- system messages in place


def hoists_system_messages(settings: ProviderSettings, model: str) -> bool:
    """DeepSeek's chat template gathers every system message into the first one, so a later
    one (Claude Code's reminders) lands at the front and changes the cached prefix on every
    turn it appears (reported: 0% cache hits, against 97% with those messages as user)."""
    return settings.provider_name == "deepseek" or matches_prefix(model, ("deepseek",))


def has_system_after_first(body: dict[str, Any]) -> bool:
    # (A /responses body has `input`, not `messages`: nothing to refuse there.)
    return any(message.get("role") == "system" for message in (body.get("messages") or [])[1:])


def system_messages_as_user(body: dict[str, Any]) -> None:
    """Every `system` message after the first becomes a `user` message at the same place,
    its text wrapped in `<system-reminder>` (for templates that refuse a later system
    message). Never moved to the front: that would change every later prefix."""
    _later_system_messages_as_user(body.get("messages") or [])


def _later_system_messages_as_user(messages: list[dict[str, Any]]) -> None:
    for message in messages[1:]:
        if message.get("role") == "system":
            message["role"] = "user"
            message["content"] = _as_reminder(message.get("content"))


def _as_reminder(content: Any) -> Any:
    opening, closing = SYSTEM_REMINDER
    if isinstance(content, str):
        return content if content.startswith(opening) else f"{opening}{content}{closing}"
    parts: list[Part] = [dict(part) for part in content or []]
    texts = [part for part in parts if part.get("type") == "text"]
    if texts and not texts[0]["text"].startswith(opening):
        texts[0]["text"] = opening + texts[0]["text"]
        texts[-1]["text"] = texts[-1]["text"] + closing
    return parts


_SYSTEM_POSITION = re.compile(
    r"system\W+(message|role|prompt)s?\b[^.\n]*\b(beginning|first|start|only|not (supported|"
    r"allowed))|\b(first|only one)\b[^.\n]*\bsystem\b", re.IGNORECASE)


def names_system_position(message: str) -> bool:
    """Whether an upstream error is a chat template refusing a later system message
    ("System message must be at the beginning.")."""
    return _SYSTEM_POSITION.search(message) is not None
