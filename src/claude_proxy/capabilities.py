"""What the proxy has learned about upstream models while running (in memory only).

A model that answered 400 to a field the proxy added (the reasoning fields, or one of the
optional OpenAI fields below) is remembered, so later requests leave that field out instead of
failing and retrying every time.
"""

from __future__ import annotations

import re
import threading
from typing import Any

REASONING = "reasoning"
SUMMARY = "reasoning.summary"
"""Responses API: reasoning summaries refused (an organisation not verified for them)."""
# Fields the proxy adds that some OpenAI-compatible servers do not know (older Azure
# api-versions and vLLM/Ollama builds reject stream_options, some reject user).
OPTIONAL_FIELDS = ("stream_options", "parallel_tool_calls", "user")

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
