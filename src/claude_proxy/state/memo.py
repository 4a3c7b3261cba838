"""What this process can reuse instead of working it out again: objects, not records.

The store (store.py) keeps what the fleet knows as JSON-able records, shared through Redis
when there is one. Some of what a request works out is worth keeping only as the Python
objects themselves, in the process that made them: a session's parsed conversation, which
its next turn repeats but for the end (server/incremental.py). Such objects cannot cross a
process, and need not: a miss costs the work again, never a different answer. `Memo` keeps
them, the least recently used going first past a budget of bytes, each for a time.

Used from the event loop only (no lock): a lookup and the store that follows it are not
separated by an `await`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class Memo:
    """Objects by key within `budget` bytes (the weights their owners give), each kept
    `ttl` seconds after it was stored; a budget of 0 keeps nothing."""

    def __init__(self, budget: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.ttl = ttl
        self.clock = clock
        self.weight = 0
        self._entries: OrderedDict[str, tuple[Any, int, float]] = OrderedDict()

    def get(self, key: str) -> Any | None:
        """The object kept under `key`, or None when there is none or it has expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() >= entry[2]:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: str, value: Any, weight: int) -> None:
        """Keeps `value` under `key` (replacing what was there), then lets the least recently
        used go until the rest fit the budget; one heavier than the whole budget is not
        kept. Expired entries at the old end go first."""
        self._drop(key)
        if weight > self.budget or not self.budget:
            return
        now = self.clock()
        self._entries[key] = (value, weight, now + self.ttl)
        self.weight += weight
        while self._entries:
            oldest, (_, _, until) = next(iter(self._entries.items()))
            if self.weight <= self.budget and now < until:
                break
            self._drop(oldest)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.weight -= entry[1]

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, Any]]:
        """What is kept, least recently used first (for tests and diagnostics)."""
        return [(key, entry[0]) for key, entry in self._entries.items()]
