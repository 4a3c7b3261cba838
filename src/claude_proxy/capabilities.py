"""What the proxy has learned about upstream models while running (in memory only).

A model that answered 400 to a field the proxy added (the reasoning fields, or one of the
optional OpenAI fields below) is remembered, so later requests leave that field out instead of
failing and retrying every time.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from claude_proxy.conversion.structured import StructuredMode

REASONING = "reasoning"
# Fields the proxy adds that some OpenAI-compatible servers do not know (older Azure
# api-versions and vLLM/Ollama builds reject stream_options, some reject user).
OPTIONAL_FIELDS = ("stream_options", "parallel_tool_calls", "user", "top_k")
# Structured outputs step down instead of disappearing: a model that refused
# `response_format: json_schema` gets `json_object` (plus the schema in the system prompt),
# one that refused that too gets the prompt alone.
STRUCTURED = "response_format"
STRUCTURED_JSON_OBJECT = "response_format:json_object"
_ABOUT_STRUCTURED = re.compile(r"response_format|json_schema|json_object|structured output",
                               re.IGNORECASE)

# Words a refusal of the reasoning fields names, besides the field names themselves
# (Ollama: '"x" does not support thinking').
_REFUSAL_WORDS = ("thinking", "reasoning")
_ABOUT_A_FIELD = re.compile(r"argument|parameter|field|propert|not permitted|unrecognized|"
                            r"unknown|extra|unsupported|not supported|invalid", re.IGNORECASE)


def names_added_field(message: str, extras: dict[str, Any]) -> bool:
    """Whether an upstream error message is about one of the reasoning fields we added."""
    lowered = message.lower()
    return any(name.lower() in lowered for name in (*extras, *_REFUSAL_WORDS))


def refused_optional_fields(message: str, body: dict[str, Any]) -> list[str]:
    """The optional fields of `body` that an upstream error message rejects."""
    if not _ABOUT_A_FIELD.search(message):
        return []
    return [name for name in OPTIONAL_FIELDS
            if name in body and re.search(rf"\b{name}\b", message)]


def refused_structured(message: str, body: dict[str, Any]) -> list[str]:
    """[STRUCTURED] or [STRUCTURED_JSON_OBJECT] when an upstream error message rejects the
    `response_format` we sent, else []."""
    sent = body.get("response_format")
    if not isinstance(sent, dict) or not _ABOUT_STRUCTURED.search(message):
        return []
    return [STRUCTURED if sent.get("type") == "json_schema" else STRUCTURED_JSON_OBJECT]


def structured_mode(refusals: Refusals, model: str) -> StructuredMode:
    """How to ask this model for a JSON schema, given what it refused before."""
    if refusals.refuses(model, STRUCTURED_JSON_OBJECT):
        return "prompt"
    if refusals.refuses(model, STRUCTURED):
        return "json_object"
    return "json_schema"


class Refusals:
    """(upstream model, field) pairs known to be refused; `REASONING` stands for all the
    reasoning fields of a dialect."""

    def __init__(self) -> None:
        self._refused: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def refuses(self, model: str, field: str) -> bool:
        return (model, field) in self._refused

    def remember(self, model: str, field: str) -> None:
        with self._lock:
            self._refused.add((model, field))
