"""The fleet soak (tests/soak.py) for about a minute: every request answered, usage and spend
exact, the dashboard complete, the budget held, through Redis, upstream and replica faults."""

from __future__ import annotations

import shutil

import pytest

from tests.soak import run_soak


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server is not installed (make redis)")
def test_the_fleet_survives_a_minute_of_faults_and_loses_no_usage() -> None:
    report = run_soak(seconds=50, clients=4)
    print(report.figures())
    assert report.problems == []
    kinds = {outcome.kind for outcome in report.outcomes}
    assert "served" in kinds and "error" in kinds  # the upstream's outage answered errors
    assert len(report.entries) >= 50
