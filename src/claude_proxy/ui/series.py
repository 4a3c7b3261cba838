"""Per-minute numbers for the dashboard's charts, in a fixed number of minute buckets.

Each finished request adds to the bucket of its minute: requests by status, tokens by kind,
errors by type, retries, and per provider its count, successes and a first-byte histogram
(fixed log-spaced bounds, so a percentile costs no stored samples). Keys are statuses, token
kinds, error types and providers: small fixed sets, none chosen by a client.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# 1 ms to ~8 minutes, each bound 30% above the one before: a percentile is within 30%.
TTFB_BOUNDS_MS = tuple(1.3 ** power for power in range(51))
TOKEN_KINDS = ("input", "output", "reasoning", "cached", "cache_write")
"""`cached` is what was read from the prompt cache, `cache_write` what was written to it."""


@dataclass
class ProviderMinute:
    requests: int = 0
    succeeded: int = 0
    ttfb: list[int] = field(default_factory=lambda: [0] * (len(TTFB_BOUNDS_MS) + 1))

    def add(self, ok: bool, ttfb_ms: float | None) -> None:
        self.requests += 1
        self.succeeded += ok
        if ttfb_ms is not None:
            self.ttfb[bisect.bisect_left(TTFB_BOUNDS_MS, ttfb_ms)] += 1


@dataclass
class Minute:
    minute: int
    """Minutes since the epoch."""
    statuses: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS, 0))
    errors: dict[str, int] = field(default_factory=dict)
    providers: dict[str, ProviderMinute] = field(default_factory=dict)


def provider_failed(status: int) -> bool:
    """A failure of the provider, not of the request (the statuses routing fails over on)."""
    return status >= 500 or status in (408, 429)


def percentile(counts: list[int], fraction: float) -> float | None:
    """The upper bound of the histogram bucket holding that fraction of the samples."""
    total = sum(counts)
    if not total:
        return None
    wanted = fraction * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= wanted:
            return TTFB_BOUNDS_MS[min(index, len(TTFB_BOUNDS_MS) - 1)]
    return TTFB_BOUNDS_MS[-1]


def merged(histograms: list[list[int]]) -> list[int]:
    return [sum(column) for column in zip(*histograms, strict=True)] if histograms else []


class MinuteSeries:
    """The last `minutes` minutes; older buckets fall off the end."""

    def __init__(self, minutes: int = 60) -> None:
        self.minutes = minutes
        self.buckets: deque[Minute] = deque(maxlen=minutes)

    def bucket(self, minute: int) -> Minute:
        if not self.buckets or self.buckets[-1].minute < minute:
            self.buckets.append(Minute(minute))
        elif self.buckets[-1].minute > minute:  # a request that finished across a minute
            return next((b for b in self.buckets if b.minute == minute), self.buckets[-1])
        return self.buckets[-1]

    def add(self, row: dict[str, Any], at: float) -> None:
        bucket = self.bucket(int(at // 60))
        status = str(row["status"])
        bucket.statuses[status] = bucket.statuses.get(status, 0) + 1
        for kind, count in row["tokens"].items():
            bucket.tokens[kind] = bucket.tokens.get(kind, 0) + count
        if row["error"]:
            bucket.errors[row["error"]] = bucket.errors.get(row["error"], 0) + 1
        if row["retries"]:
            bucket.errors["retry"] = bucket.errors.get("retry", 0) + row["retries"]
        if row["failover"]:
            bucket.errors["failover"] = bucket.errors.get("failover", 0) + len(row["failover"])
        provider = bucket.providers.setdefault(row["provider"], ProviderMinute())
        provider.add(not provider_failed(row["status"]), row["ttfb"])

    def window(self, now: float, minutes: int) -> list[Minute]:
        first = int(now // 60) - minutes + 1
        return [bucket for bucket in self.buckets if bucket.minute >= first]

    def snapshot(self, now: float) -> dict[str, Any]:
        """Every chart's lines over the whole hour, one value per minute (oldest first)."""
        last = int(now // 60)
        axis = list(range(last - self.minutes + 1, last + 1))
        by_minute = {bucket.minute: bucket for bucket in self.buckets}
        rows = [by_minute.get(minute) for minute in axis]

        def line(value: Any) -> list[Any]:
            return [value(bucket) if bucket is not None else 0 for bucket in rows]

        statuses = sorted({s for bucket in self.buckets for s in bucket.statuses})
        errors = sorted({e for bucket in self.buckets for e in bucket.errors})
        providers = sorted({p for bucket in self.buckets for p in bucket.providers})
        ttfb: dict[str, dict[str, list[float | None]]] = {}
        for name in providers:
            hists = [b.providers[name].ttfb if b is not None and name in b.providers else None
                     for b in rows]
            ttfb[name] = {
                "p50": [percentile(h, 0.5) if h else None for h in hists],
                "p95": [percentile(h, 0.95) if h else None for h in hists]}
        return {
            "minutes": [minute * 60 for minute in axis],
            "requests": {s: line(lambda b, s=s: b.statuses.get(s, 0)) for s in statuses},
            "ttfb": ttfb,
            "tokens": {k: line(lambda b, k=k: b.tokens.get(k, 0)) for k in TOKEN_KINDS},
            "errors": {e: line(lambda b, e=e: b.errors.get(e, 0)) for e in errors},
        }

    def provider_stats(self, now: float, minutes: int = 15) -> dict[str, dict[str, Any]]:
        """Per provider over the last minutes: requests, success rate, first-byte p50/p95."""
        stats: dict[str, dict[str, Any]] = {}
        recent = self.window(now, minutes)
        for name in {p for bucket in recent for p in bucket.providers}:
            parts = [b.providers[name] for b in recent if name in b.providers]
            requests = sum(p.requests for p in parts)
            histogram = merged([p.ttfb for p in parts])
            stats[name] = {
                "requests": requests,
                "success_rate": sum(p.succeeded for p in parts) / requests if requests else None,
                "p50": percentile(histogram, 0.5), "p95": percentile(histogram, 0.95)}
        return stats
