"""When and how long to wait before trying the upstream again (before the first byte only)."""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
MAX_RETRY_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    base_delay: float
    max_delay: float

    def should_retry(self, attempt: int, status: int | None = None) -> bool:
        """`attempt` counts from 0; `status` None means a connection failure."""
        if attempt >= self.max_retries:
            return False
        return status is None or status in RETRYABLE_STATUSES

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Exponential backoff with jitter, or the upstream's `retry-after` (capped)."""
        hinted = parse_retry_after(retry_after)
        if hinted is not None:
            return min(hinted, MAX_RETRY_AFTER_SECONDS)
        backoff: float = min(self.base_delay * 2.0**attempt, self.max_delay)
        return backoff * (1 - 0.25 * random.random())


def parse_retry_after(value: str | None) -> float | None:
    """A `retry-after` header in seconds (None when absent, malformed or negative)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
