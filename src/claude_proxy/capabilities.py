"""What the proxy has learned about upstream models while running (in memory only).

A model that answered 400 to the reasoning fields the proxy added is remembered, so later
requests leave those fields out instead of failing and retrying every time.
"""

from __future__ import annotations

import threading
from typing import Any

# Words a refusal of the reasoning fields names, besides the field names themselves
# (Ollama: '"x" does not support thinking').
_REFUSAL_WORDS = ("thinking", "reasoning")


def names_added_field(message: str, extras: dict[str, Any]) -> bool:
    """Whether an upstream error message is about one of the fields the proxy added."""
    lowered = message.lower()
    return any(name.lower() in lowered for name in (*extras, *_REFUSAL_WORDS))


class ReasoningRefusals:
    """Upstream models known to refuse the proxy's reasoning fields."""

    def __init__(self) -> None:
        self._models: set[str] = set()
        self._lock = threading.Lock()

    def refuses(self, model: str) -> bool:
        return model in self._models

    def remember(self, model: str) -> None:
        with self._lock:
            self._models.add(model)
