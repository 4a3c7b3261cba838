"""Pre-flight: does the request fit the chosen model's window, before anything is sent?

Pure: candidates and a measure (the calibrated input estimate and the model's known window, per
candidate) in; the candidates to try, or Anthropic's `prompt is too long` 400, out. Over the
chosen model's window the `long_context` route takes the request when one of its models fits
(no failed upstream call first); otherwise the client is answered at once and nothing is sent,
which makes Claude Code compact. Later candidates (failover) that are known to be too small are
dropped. A model whose window is unknown is never refused here (no pre-flight for it).
When the input fits but input + max_tokens does not, max_tokens is clamped to what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from claude_proxy.routing.router import Candidate
from claude_proxy.upstream.overflow import too_long


@dataclass(frozen=True)
class Fit:
    """One candidate measured against its model's limits."""

    candidate: Candidate
    tokens: int
    """The calibrated input estimate for this model."""
    raw: int
    """The estimate before calibration (what the calibration record keeps)."""
    window: int | None
    max_output: int | None = None

    @property
    def fits(self) -> bool:
        return self.window is None or self.tokens <= self.window

    def max_tokens(self, requested: int) -> int:
        """`requested`, clamped to the room the window leaves and the model's output limit."""
        allowed = requested
        if self.window is not None:
            allowed = min(allowed, max(self.window - self.tokens, 1))
        if self.max_output is not None:
            allowed = min(allowed, self.max_output)
        return allowed


Measure = Callable[[Candidate], Fit]


def plan(candidates: list[Candidate], long_context: list[Candidate],
         measure: Measure) -> list[Fit]:
    """The candidates to try, each measured; raises the 400 when the chosen one is too small
    and no long_context model fits."""
    measured = [measure(candidate) for candidate in candidates]
    if not measured:
        return []
    chosen = measured[0]
    if chosen.fits:
        return [chosen, *(fit for fit in measured[1:] if fit.fits)]
    seen = {(fit.candidate.provider, fit.candidate.model) for fit in measured}
    bigger = [measure(c) for c in long_context if (c.provider, c.model) not in seen]
    bigger += [fit for fit in measured if fit.candidate.route == "long_context"]
    roomy = [fit for fit in bigger if fit.fits]
    if not roomy:
        assert chosen.window is not None
        raise too_long(chosen.tokens, chosen.window)
    rest = [fit for fit in measured[1:] if fit.fits and fit not in roomy]
    return [*roomy, *rest]


def clamped(body: dict[str, Any], fit: Fit) -> dict[str, Any]:
    """The body with max_tokens clamped for this candidate (the same body if it fits)."""
    requested = body.get("max_tokens")
    if not isinstance(requested, int):
        return body
    allowed = fit.max_tokens(requested)
    return body if allowed == requested else {**body, "max_tokens": allowed}
