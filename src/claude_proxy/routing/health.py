"""A provider's health: a circuit breaker that keeps failing providers out of the way.

`cooldown_failures` retriable failures in a row open it for `cooldown_seconds` (never shorter
than a 429's `retry-after`); once that passes, one request probes the provider: a success closes
the breaker, a failure opens it again at once for twice as long (at most 300 s). Credential
failures (401/402/403) do not count: they flag the provider as misconfigured instead.

What the fleet must agree on lives in the state store (state/): the failures in a row (a
counter), and the breaker's record (when the cooldown ends, its length, the last error, the
"misconfigured" flag). With a shared store every worker and replica honours a cooldown one of
them opened, and one of them sends the probe: the first to claim it (`take`). Whether this
process is sending the probe now, and its own success and failure counts, stay per process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import StateStore

MAX_COOLDOWN_SECONDS = 300.0
KEPT_SECONDS = 3600.0
"""How long a breaker's record and failure count outlive their last change."""

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
                 clock: Callable[[], float] = time.time, store: StateStore | None = None,
                 name: str = "provider") -> None:
        self.failures_to_open = failures
        self.base_cooldown = cooldown
        self.clock = clock
        """Wall-clock seconds: a cooldown's end is compared across processes and hosts."""
        self.store = store or LocalStore()
        self.key = f"health:{name}"
        self._probing = False
        self._successes = 0
        self._failures = 0

    # ------------------------------------------------------------ the shared record

    def _record(self) -> dict[str, Any]:
        return self.store.get(self.key) or {}

    def _open_until(self) -> float | None:
        until = self._record().get("open_until")
        return float(until) if until is not None else None

    def _write(self, **changes: Any) -> None:
        self.store.put(self.key, {**self._record(), **changes}, ttl=KEPT_SECONDS)

    def _consecutive(self) -> int:
        return int(self.store.total(f"{self.key}:failures"))

    # ------------------------------------------------------------ routing asks

    def reopens_at(self) -> float:
        """When the provider may be tried again (now or earlier when it is not cooling)."""
        until = self._open_until()
        return until if until is not None else float("-inf")

    def is_cooling(self) -> bool:
        """Open and not yet due for its probe, or due but a probe is already under way."""
        until = self._open_until()
        if until is None:
            return False
        return self.clock() < until or self._probing

    def acquire(self) -> bool:
        """Whether this request may use the provider now; the first request after the
        cooldown becomes the probe (and others keep away until it ends)."""
        until = self._open_until()
        if until is None:
            return True
        if self.clock() < until or self._probing:
            return False
        self._probing = True
        return True

    async def take(self) -> bool:
        """`acquire`, with the probe claimed for the fleet: of all the processes that find
        the cooldown over, one sends the probe, the others keep away."""
        if not self.acquire():
            return False
        if not self._probing:  # healthy: the record is not read a second time
            return True
        until = self._open_until()
        if until is None:
            return True
        if await self.store.claim(f"{self.key}:probe:{until:.3f}", self._claim_ttl()):
            return True
        self._probing = False
        return False

    def _claim_ttl(self) -> float:
        cooldown = float(self._record().get("cooldown", self.base_cooldown))
        return max(cooldown * 2, 30.0)

    def force(self) -> None:
        """Every candidate is cooling: this one (the soonest to reopen) is tried anyway, as
        its probe."""
        if self._open_until() is not None:
            self._probing = True

    def release(self) -> None:
        """A probe that ended in neither success nor failure (the client left): the next
        request probes instead."""
        self._probing = False

    # ------------------------------------------------------------ outcomes

    def record_success(self) -> None:
        self._successes += 1
        self._probing = False
        record = self._record()
        if record.get("open_until") is not None or record.get("misconfigured"):
            self.store.delete(self.key)
        if self._consecutive():
            self.store.delete(f"{self.key}:failures")

    def record_failure(self, message: str, retry_after: float | None = None) -> None:
        """A retriable failure (connection, timeout, 408/429/5xx/529, an error event)."""
        self.store.add(f"{self.key}:failures", 1, ttl=KEPT_SECONDS)
        self._after_failure(self._consecutive(), message, retry_after)

    async def failed(self, message: str, retry_after: float | None = None) -> None:
        """`record_failure`, counted against the fleet's failures in a row."""
        consecutive = await self.store.add_total(f"{self.key}:failures", 1, ttl=KEPT_SECONDS)
        self._after_failure(int(consecutive), message, retry_after)
        await self.store.sync()  # a cooldown just opened reaches the fleet before we answer

    def _after_failure(self, consecutive: int, message: str,
                       retry_after: float | None) -> None:
        self._failures += 1
        cooldown = float(self._record().get("cooldown", self.base_cooldown))
        if self._probing:
            self._open(min(cooldown * 2, MAX_COOLDOWN_SECONDS), message, retry_after)
        elif consecutive >= self.failures_to_open:
            self._open(cooldown, message, retry_after)
        else:
            self._write(last_error=message)

    def record_misconfigured(self, message: str) -> None:
        """The credential was refused: not the provider's health, but worth showing."""
        self._failures += 1
        self._probing = False
        self._write(misconfigured=True, last_error=message)

    def _open(self, cooldown: float, message: str, retry_after: float | None) -> None:
        seconds = max(cooldown, retry_after or 0.0)
        self._write(open_until=self.clock() + seconds, cooldown=cooldown, last_error=message)
        self._probing = False

    def snapshot(self) -> HealthSnapshot:
        record = self._record()
        until = record.get("open_until")
        state: State = "healthy"
        shown = None
        if until is not None:
            state = "probing" if self._probing else "cooling"
            shown = time.time() + max(0.0, float(until) - self.clock())
        return HealthSnapshot(state, self._consecutive(), shown, record.get("last_error"),
                              bool(record.get("misconfigured")), self._successes,
                              self._failures)
