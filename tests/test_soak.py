"""Forty seconds of `make soak` (tests/soak.py): two replicas x two workers on one real Redis (run
with the shipped arguments), clients with team keys and a budget, streaming and not, while
Redis is killed and restarted, an upstream fails and recovers, a replica is SIGKILLed and
restarted, and both replicas are restarted one after the other with SIGTERM.

Asserted here: every request answered (a success or an Anthropic-shaped error, none hung, none
malformed, connections cut only by the SIGKILL), the rolling restart lost and cut nothing, and
nothing charged twice or for a request that was not served. The other figures (usage log and
spend against what was served, the dashboard, the budget's overshoot) are printed; `make soak`
fails on them, and docs/several-processes.md#a-soak-of-the-fleet says where they stand.
"""

from __future__ import annotations

import shutil

import pytest

from tests import soak

SECONDS = 40


@pytest.fixture(scope="module")
def figures() -> soak.Figures:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make redis)")
    return soak.soak(SECONDS)


def test_every_request_is_answered(figures: soak.Figures) -> None:
    outcomes = [attempt.outcome for attempt in figures.attempts]
    assert outcomes.count("served") > 0 and outcomes.count("error") > 0  # the budget's 429s
    assert set(outcomes) <= {"served", "error", "cut", "refused"}, figures.lines
    assert outcomes.count("cut") <= len(soak.KEYS) * soak.CLIENTS_PER_KEY
    errors = {attempt.error_type for attempt in figures.attempts if attempt.outcome == "error"}
    assert errors <= {"billing_error", "overloaded_error", "api_error"}, errors


def test_nothing_is_charged_twice_or_for_a_request_not_served(figures: soak.Figures) -> None:
    counted = {attempt.session for attempt in figures.attempts
               if attempt.outcome in ("served", "cut")}
    assert all(row["requests"] == 1 for row in figures.usage.values())
    assert set(figures.usage) <= counted


def test_the_rolling_restart_loses_nothing(figures: soak.Figures) -> None:
    during = [a for a in figures.attempts if a.phase == "rolling restart"]
    assert during and all(a.outcome in ("served", "error") for a in during), [
        line for line in figures.lines if line.startswith("rolling")]
    assert not [f for f in figures.failures if f.startswith("rolling restart")]
