"""The bench's repeated runs said as one (bench/repeats.py): each figure the median of the
runs with their spread, failed requests summed, each target checked on its median."""

from __future__ import annotations

import math

from bench import repeats
from bench.report import Target


def test_each_number_is_the_median_of_the_runs_and_errors_are_summed() -> None:
    runs = [{"proxy": {"p50_ms": 1.0, "errors": 0, "note": "a"}, "kb": 100},
            {"proxy": {"p50_ms": 3.0, "errors": 2, "note": "b"}, "kb": 100},
            {"proxy": {"p50_ms": 2.5, "errors": 1}, "kb": 100, "late": math.nan}]
    combined = repeats.combine(runs)
    assert combined["proxy"] == {"p50_ms": 2.5, "errors": 3, "note": "a"}
    assert combined["kb"] == 100 and math.isnan(combined["late"])
    assert repeats.spread(runs) == {"proxy": {"p50_ms": [1.0, 3.0]}, "kb": [100.0, 100.0]}


def test_a_target_is_checked_on_its_median_and_shows_its_spread() -> None:
    runs = [[Target("added median latency", value, 0.5, unit=" ms")] for value in
            (0.4, 0.7, 0.45)]
    (target,) = repeats.targets(runs)
    assert (target.value, target.low, target.high, target.runs) == (0.45, 0.4, 0.7, 3)
    assert target.passed
    assert target.measured() == "0.45 ms (0.4–0.7, 3 runs)"
    (failing,) = repeats.targets([[Target("x", 2.0, 1.0)], [Target("x", 0.5, 1.0)],
                                  [Target("x", 1.5, 1.0)]])
    assert not failing.passed and failing.value == 1.5
