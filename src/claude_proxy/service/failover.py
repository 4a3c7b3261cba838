"""Failover before the first byte: what a failure means (`classify`), the candidates still to
try (`CandidateWalk`), and the client's error once every one failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from claude_proxy.conversion.request_converter import UpstreamRequest
from claude_proxy.errors import ProxyError
from claude_proxy.routing import preflight
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Candidate
from claude_proxy.upstream.misconfigured import MisconfiguredUpstream
from claude_proxy.upstream.overflow import ContextOverflow, context_overflow

FAILOVER_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
CREDENTIAL_STATUSES = frozenset({401, 402, 403})
Failure = Literal["retriable", "credential", "misconfigured", "overflow", "final"]


@dataclass(frozen=True)
class Attempt:
    """The candidate that answered, and what was sent to it."""

    provider: Provider
    candidate: Candidate
    upstream: UpstreamRequest
    fit: preflight.Fit
    """Its input estimate and window (the pre-flight's measure)."""
    edits: list[dict[str, Any]] = field(default_factory=list)
    """The context-management edits applied to what it was sent (`applied_edits`)."""


def classify(error: ProxyError) -> Failure:
    """What a failure before the first byte means for failover: try the next candidate
    (counting towards cooldown or, for a refused credential, not), reroute a context
    overflow, or answer the client now. A server not set up for the request (e.g. llama-server
    without --jinja) is tried no more, but another provider may be."""
    if isinstance(error, MisconfiguredUpstream):
        return "misconfigured"
    if error.status in CREDENTIAL_STATUSES:
        return "credential"
    if error.status in FAILOVER_STATUSES:
        return "retriable"
    if isinstance(error, ContextOverflow) or context_overflow(error, 0) is not None:
        return "overflow"
    return "final"


class CandidateWalk:
    """The candidates still to try: cooling providers are skipped, unless every candidate is
    cooling, when the one that reopens soonest is tried anyway."""

    def __init__(self, candidates: list[Candidate], providers: dict[str, Provider]) -> None:
        self.queue = list(candidates)
        self.providers = providers
        self.skipped: list[Candidate] = []
        self.failures: list[tuple[Candidate, ProxyError]] = []
        self.rerouted = False

    async def next(self) -> Candidate | None:
        while self.queue:
            candidate = self.queue.pop(0)
            if await self.providers[candidate.provider].health.take():
                return candidate
            self.skipped.append(candidate)
        if self.failures or not self.skipped:
            return None
        soonest = min(self.skipped,
                      key=lambda c: self.providers[c.provider].health.reopens_at())
        self.skipped.remove(soonest)
        self.providers[soonest.provider].health.force()
        return soonest

    def reroute(self, route: list[Candidate], current: Candidate) -> bool:
        """Put the long-context route first, once, when it is another route."""
        fresh = [c for c in route if (c.provider, c.model) != (current.provider, current.model)]
        if self.rerouted or not fresh:
            return False
        self.rerouted = True
        self.queue[:0] = fresh
        return True

    def all_failed(self, estimate: int) -> ProxyError:
        """The client's error once every candidate failed: a lone candidate's own error (as
        with one provider), else the overflow in Claude Code's words, else 429 until the
        soonest cooldown ends, else 529 (which lets Claude Code's fallback model act)."""
        failures = self.failures
        if len(failures) == 1 and not self.skipped:
            error = failures[0][1]
            return context_overflow(error, estimate) or error
        for _, error in failures:
            overflow = context_overflow(error, estimate)
            if overflow is not None:
                return overflow
        if failures and all(classify(e) in ("credential", "misconfigured") for _, e in failures):
            return failures[0][1]
        summary = "; ".join(f"{c.provider},{c.model}: {e.status} {e.message}"[:300]
                            for c, e in failures)
        cooling = [p.health.reopens_at() - p.health.clock() for p in self.providers.values()
                   if p.health.is_cooling()]
        if cooling:
            seconds = max(1, math.ceil(min(cooling)))
            return ProxyError(429, f"every provider failed or is cooling down ({summary})",
                              error_type="rate_limit_error",
                              headers={"retry-after": str(seconds)})
        return ProxyError(529, f"every provider failed ({summary})",
                          error_type="overloaded_error")
