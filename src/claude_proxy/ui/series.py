"""Per-minute numbers for the dashboard's charts, in a fixed number of minute buckets.

Each finished request adds to the bucket of its minute: requests by status, tokens by kind,
errors by type, retries, and per provider its count, successes and a first-byte histogram
(fixed log-spaced bounds, so a percentile costs no stored samples). Keys are statuses, token
kinds, error types and providers: small fixed sets, none chosen by a client.

A request's numbers are first written as flat named counters (`minute_fields`): that is what
a shared state store keeps per minute (one hash per minute, expiring), and what a bucket of
this process absorbs; so the fleet's minutes and this process's are summed the same way.
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

    def absorb(self, what: str, count: int) -> None:
        if what == "requests":
            self.requests += count
        elif what == "succeeded":
            self.succeeded += count
        elif what.startswith("ttfb:"):
            index = int(what[5:])
            if 0 <= index < len(self.ttfb):
                self.ttfb[index] += count


@dataclass
class Minute:
    minute: int
    """Minutes since the epoch."""
    statuses: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_KINDS, 0))
    errors: dict[str, int] = field(default_factory=dict)
    providers: dict[str, ProviderMinute] = field(default_factory=dict)
    tools: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per upstream model: its tool calls by what the guard found (valid, repaired, ...)."""

    def absorb(self, fields: dict[str, float]) -> Minute:
        """Adds named counters (`minute_fields`) to this minute."""
        for name, amount in fields.items():
            kind, _, rest = name.partition("|")
            count = int(amount)
            if kind == "status":
                self.statuses[rest] = self.statuses.get(rest, 0) + count
            elif kind == "tokens":
                self.tokens[rest] = self.tokens.get(rest, 0) + count
            elif kind == "error":
                self.errors[rest] = self.errors.get(rest, 0) + count
            elif kind == "provider":
                provider, _, what = rest.partition("|")
                self.providers.setdefault(provider, ProviderMinute()).absorb(what, count)
            elif kind == "tools":
                model, _, outcome = rest.rpartition("|")
                outcomes = self.tools.setdefault(model, {})
                outcomes[outcome] = outcomes.get(outcome, 0) + count
        return self


def minute_fields(row: dict[str, Any]) -> dict[str, float]:
    """A finished request's row as the named counters it adds to its minute."""
    fields: dict[str, float] = {f"status|{row['status']}": 1}
    for kind, count in row["tokens"].items():
        if count:
            fields[f"tokens|{kind}"] = count
    if row["error"]:
        fields[f"error|{row['error']}"] = 1
    if row["retries"]:
        fields["error|retry"] = row["retries"]
    if row["failover"]:
        fields["error|failover"] = len(row["failover"])
    provider = f"provider|{row['provider']}|"
    fields[provider + "requests"] = 1
    fields[provider + "succeeded"] = int(not provider_failed(row["status"]))
    if row["ttfb"] is not None:
        fields[f"{provider}ttfb:{bisect.bisect_left(TTFB_BOUNDS_MS, row['ttfb'])}"] = 1
    for outcome, count in (row.get("tool_calls") or {}).items():
        fields[f"tools|{row['model']}|{outcome}"] = count
    return fields


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
        self.bucket(int(at // 60)).absorb(minute_fields(row))

    @classmethod
    def of(cls, minutes: int, fields: list[tuple[int, dict[str, float]]]) -> MinuteSeries:
        """A series made of stored minutes (oldest first), e.g. the fleet's."""
        series = cls(minutes)
        for minute, named in fields:
            if named:
                series.buckets.append(Minute(minute).absorb(named))
        return series

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

    def tool_stats(self, now: float) -> list[dict[str, Any]]:
        """Per upstream model over the whole series: its tool calls, and the shares the guard
        repaired and passed on invalid (docs/tool-calls.md), most calls first."""
        totals: dict[str, dict[str, int]] = {}
        for bucket in self.window(now, self.minutes):
            for model, outcomes in bucket.tools.items():
                summed = totals.setdefault(model, {})
                for outcome, count in outcomes.items():
                    summed[outcome] = summed.get(outcome, 0) + count
        stats = []
        for model, outcomes in totals.items():
            calls = sum(outcomes.values())
            repaired = outcomes.get("repaired", 0) + outcomes.get("repairable", 0)
            stats.append({"model": model, "calls": calls, "outcomes": outcomes,
                          "repaired": repaired / calls if calls else 0.0,
                          "invalid": outcomes.get("invalid", 0) / calls if calls else 0.0})
        return sorted(stats, key=lambda stat: (-stat["calls"], stat["model"]))

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
