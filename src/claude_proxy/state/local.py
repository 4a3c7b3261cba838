"""The in-process store: today's behaviour, the default, and the fallback when Redis fails.

State lives in this process only: with several workers or replicas each keeps its own (and
says so where shown). Expiry is checked on read; bounded logs are deques.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from claude_proxy.state.store import Record, StateStore

SWEEP_EVERY = 1024
"""Writes with a TTL between two sweeps of expired keys."""

_SCALARS = (str, int, float, bool, type(None))


def _flat(value: Record) -> bool:
    """Whether a record holds scalars only: then a shallow copy is a full one (a deep copy
    of a small record costs ~2.6 µs, and several are read on every request)."""
    return all(isinstance(item, _SCALARS) for item in value.values())


class LocalStore(StateStore):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._records: dict[str, Record] = {}
        self._expiry: dict[str, float] = {}
        self._logs: dict[str, deque[Record]] = {}
        self._fields: dict[str, dict[str, float]] = {}
        self._flat: set[str] = set()
        self._writes = 0

    def _expired(self, key: str) -> bool:
        until = self._expiry.get(key)
        if until is None or self.clock() < until:
            return False
        self._forget(key)
        return True

    def _forget(self, key: str) -> None:
        self._counters.pop(key, None)
        self._records.pop(key, None)
        self._flat.discard(key)
        self._fields.pop(key, None)
        self._expiry.pop(key, None)

    def _set_expiry(self, key: str, ttl: float | None) -> None:
        if ttl is not None:
            self._expiry[key] = self.clock() + ttl
            self._writes += 1
            if self._writes % SWEEP_EVERY == 0:
                self._sweep()

    def _sweep(self) -> None:
        """Forgets expired keys nobody reads any more (expiry is otherwise checked on read),
        so that memory follows the TTLs, not the traffic."""
        now = self.clock()
        for key in [key for key, until in self._expiry.items() if until <= now]:
            self._forget(key)

    def add(self, key: str, amount: float = 1.0, ttl: float | None = None) -> None:
        with self._lock:
            self._expired(key)
            fresh = key not in self._counters
            self._counters[key] = self._counters.get(key, 0.0) + amount
            if fresh or ttl is not None:
                self._set_expiry(key, ttl)

    def total(self, key: str) -> float:
        with self._lock:
            if self._expired(key):
                return 0.0
            return self._counters.get(key, 0.0)

    def put(self, key: str, value: Record, ttl: float | None = None) -> None:
        self.keep(key, dict(value) if _flat(value) else copy.deepcopy(value), ttl)

    def keep(self, key: str, value: Record, ttl: float | None = None) -> None:
        """`put` without the copy, for a value nobody else holds (one just parsed)."""
        with self._lock:
            self._records[key] = value
            if _flat(value):
                self._flat.add(key)
            else:
                self._flat.discard(key)
            self._expiry.pop(key, None)
            self._set_expiry(key, ttl)

    def get(self, key: str) -> Record | None:
        with self._lock:
            if self._expired(key):
                return None
            value = self._records.get(key)
            if value is None:
                return None
            return dict(value) if key in self._flat else copy.deepcopy(value)

    def delete(self, key: str) -> None:
        with self._lock:
            self._forget(key)

    def set_total(self, key: str, value: float, ttl: float | None = None) -> None:
        """Sets a counter outright (a shared backend's copy of the fleet's total)."""
        with self._lock:
            self._counters[key] = value
            self._expiry.pop(key, None)
            self._set_expiry(key, ttl)

    def add_fields(self, key: str, amounts: dict[str, float], ttl: float) -> None:
        with self._lock:
            self._expired(key)
            fields = self._fields.setdefault(key, {})
            for name, amount in amounts.items():
                fields[name] = fields.get(name, 0.0) + amount
            self._set_expiry(key, ttl)

    async def read_fields(self, keys: list[str]) -> list[dict[str, float]]:
        with self._lock:
            return [{} if self._expired(key) else dict(self._fields.get(key, {}))
                    for key in keys]

    def append(self, log: str, entry: Record, maxlen: int) -> None:
        with self._lock:
            entries = self._logs.get(log)
            if entries is None or entries.maxlen != maxlen:
                entries = self._logs[log] = deque(entries or (), maxlen=maxlen)
            entries.append(entry)

    async def read_log(self, log: str, count: int) -> list[Record]:
        with self._lock:
            entries = list(self._logs.get(log, ()))
        return entries[-count:] if count > 0 else []

    async def claim(self, key: str, ttl: float) -> bool:
        with self._lock:
            if not self._expired(key) and key in self._records:
                return False
            self._records[key] = {"claimed": True}
            self._flat.add(key)
            self._expiry[key] = self.clock() + ttl
            return True

    def describe(self) -> dict[str, Any]:
        return {"backend": "in-process", "state": "ok", "shared": False}
