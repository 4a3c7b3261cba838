"""A provider's health: a circuit breaker that keeps failing providers out of the way.

`cooldown_failures` retriable failures in a row open it for `cooldown_seconds` (never shorter
than a 429's `retry-after`); once that passes, one request probes the provider: a success closes
the breaker, a failure opens it again at once for twice as long (at most 300 s). Credential
failures (401/402/403) do not count: they flag the provider as misconfigured instead.

State is per process: with several workers each keeps its own (and says so where shown).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

MAX_COOLDOWN_SECONDS = 300.0

State = Literal["healthy", "cooling", "probing"]


@dataclass(frozen=True)
class HealthSnapshot:
    state: State
    consecutive_failures: int
    cooling_until: float | None
    """Wall-clock time (time.time()) when the cooldown ends, for display."""
    last_error: str | None
    misconfigured: bool
    successes: int
    failures: int


class CircuitBreaker:
    def __init__(self, failures: int = 3, cooldown: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures_to_open = failures
        self.base_cooldown = cooldown
        self.clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until: float | None = None
        self._cooldown = cooldown
        self._probing = False
        self._last_error: str | None = None
        self._misconfigured = False
        self._successes = 0
        self._failures = 0

    def reopens_at(self) -> float:
        """When the provider may be tried again (now or earlier when it is not cooling)."""
        return self._open_until if self._open_until is not None else float("-inf")

    def is_cooling(self) -> bool:
        """Open and not yet due for its probe, or due but a probe is already under way."""
        if self._open_until is None:
            return False
        return self.clock() < self._open_until or self._probing

    def acquire(self) -> bool:
        """Whether this request may use the provider now; the first request after the
        cooldown becomes the probe (and others keep away until it ends)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self.clock() < self._open_until or self._probing:
                return False
            self._probing = True
            return True

    def force(self) -> None:
        """Every candidate is cooling: this one (the soonest to reopen) is tried anyway, as
        its probe."""
        with self._lock:
            if self._open_until is not None:
                self._probing = True

    def release(self) -> None:
        """A probe that ended in neither success nor failure (the client left): the next
        request probes instead."""
        with self._lock:
            self._probing = False

    def record_success(self) -> None:
        with self._lock:
            self._consecutive = 0
            self._open_until = None
            self._cooldown = self.base_cooldown
            self._probing = False
            self._misconfigured = False
            self._successes += 1

    def record_failure(self, message: str, retry_after: float | None = None) -> None:
        """A retriable failure (connection, timeout, 408/429/5xx/529, an error event)."""
        with self._lock:
            self._failures += 1
            self._consecutive += 1
            self._last_error = message
            if self._probing:
                self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN_SECONDS)
                self._open(retry_after)
            elif self._consecutive >= self.failures_to_open:
                self._open(retry_after)

    def record_misconfigured(self, message: str) -> None:
        """The credential was refused: not the provider's health, but worth showing."""
        with self._lock:
            self._failures += 1
            self._misconfigured = True
            self._last_error = message
            self._probing = False

    def _open(self, retry_after: float | None) -> None:
        seconds = max(self._cooldown, retry_after or 0.0)
        self._open_until = self.clock() + seconds
        self._probing = False

    def snapshot(self) -> HealthSnapshot:
        now = self.clock()
        until = None
        state: State = "healthy"
        if self._open_until is not None:
            state = "probing" if self._probing else "cooling"
            until = time.time() + max(0.0, self._open_until - now)
        return HealthSnapshot(state, self._consecutive, until, self._last_error,
                              self._misconfigured, self._successes, self._failures)
