"""OpenAI usage → Anthropic usage, and character-based estimates when there is none.

Cache reads and writes come back in a different place per upstream (see docs/caching.md);
Anthropic's `input_tokens` excludes both, and Claude Code adds the three up to know how full
the context is.
"""

from __future__ import annotations

import math
from typing import Any

CHARS_PER_TOKEN = 4


def estimate_tokens(characters: int) -> int:
    """A tokenizer-free estimate: about four characters a token, never zero for some text."""
    return math.ceil(characters / CHARS_PER_TOKEN) if characters > 0 else 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def find_usage(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The usage object of a chunk wherever the provider put it (Groq: `x_groq.usage`;
    Moonshot, streaming: `choices[0].usage`)."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        extra = chunk.get("x_groq")
        usage = extra.get("usage") if isinstance(extra, dict) else None
    if not isinstance(usage, dict):
        choices = chunk.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        usage = first.get("usage") if isinstance(first, dict) else None
    return usage if isinstance(usage, dict) else None


def _details(usage: dict[str, Any]) -> dict[str, Any]:
    details = usage.get("prompt_tokens_details")
    return details if isinstance(details, dict) else {}


def cached_tokens(usage: dict[str, Any]) -> int:
    """Prompt tokens read from the cache: `prompt_tokens_details.cached_tokens` (OpenAI,
    OpenRouter, DashScope, Z.AI, xAI, vLLM), DeepSeek's `prompt_cache_hit_tokens`, Moonshot's
    top-level `cached_tokens`."""
    return (_int(usage.get("cache_read_input_tokens"))
            or _int(_details(usage).get("cached_tokens"))
            or _int(usage.get("prompt_cache_hit_tokens"))
            or _int(usage.get("cached_tokens")))


def cache_write_tokens(usage: dict[str, Any]) -> int:
    """Prompt tokens written to the cache: OpenRouter's `prompt_tokens_details.
    cache_write_tokens`, DashScope's `prompt_tokens_details.cache_creation_input_tokens`."""
    details = _details(usage)
    return (_int(usage.get("cache_creation_input_tokens"))
            or _int(details.get("cache_write_tokens"))
            or _int(details.get("cache_creation_input_tokens")))


def reasoning_tokens(usage: dict[str, Any]) -> int:
    details = usage.get("completion_tokens_details")
    return _int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0


def output_tokens(usage: dict[str, Any]) -> int:
    """Completion tokens, with reasoning added where the provider counted it apart (xAI)."""
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    reasoning = reasoning_tokens(usage)
    if reasoning and _int(usage.get("total_tokens")) == prompt + completion + reasoning:
        return completion + reasoning
    return completion


def anthropic_usage(usage: dict[str, Any]) -> dict[str, int]:
    """`input_tokens` excludes cache reads and writes, as Anthropic counts them (every
    upstream above counts both inside `prompt_tokens`)."""
    read, written = cached_tokens(usage), cache_write_tokens(usage)
    return {
        "input_tokens": max(_int(usage.get("prompt_tokens")) - read - written, 0),
        "output_tokens": output_tokens(usage),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def summed(usage: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """An answer's Anthropic usage with an earlier answer's added, count by count (what the
    client is told it paid for when one answer replaced another: TOOL_GUARD_REASK)."""
    return {kind: value + earlier.get(kind, 0) if isinstance(value, int) else value
            for kind, value in usage.items()}
