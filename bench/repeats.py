"""The bench's runs, said as what they saw: each figure the median of repeated runs, with its
spread (the lowest and the highest run), and the machine's load during each run.

On a shared 2-core machine one run of a phase moves by 5 to 30 % from the next; a median of
three says what the code costs, and the spread says how far to trust it. A target is
checked on the median of each run's own value (a ratio within one run compares sides that
saw the same machine), and its spread is shown beside it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.report import Target


def _numbers(values: list[Any]) -> list[float]:
    return [float(value) for value in values
            if isinstance(value, int | float) and not isinstance(value, bool)
            and not math.isnan(value)]


def combine(runs: list[Any]) -> Any:
    """The runs as one: each number the median of the runs' (NaN when none has it), `errors`
    their sum; anything else the first run's."""
    first = runs[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(key for run in runs if isinstance(run, dict) for key in run)
        return {key: (sum(run.get(key, 0) for run in runs) if key == "errors"
                      else combine([run[key] for run in runs
                                    if isinstance(run, dict) and key in run]))
                for key in keys}
    numbers = _numbers(runs)
    if isinstance(first, int | float) and not isinstance(first, bool):
        return round(statistics.median(numbers), 4) if numbers else math.nan
    return first


def spread(runs: list[Any]) -> Any:
    """The lowest and the highest of each number across the runs (`[low, high]`)."""
    first = runs[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(key for run in runs if isinstance(run, dict) for key in run)
        found = {key: spread([run[key] for run in runs if isinstance(run, dict) and key in run])
                 for key in keys if key != "errors"}
        return {key: value for key, value in found.items() if value is not None}
    numbers = _numbers(runs)
    if numbers and isinstance(first, int | float) and not isinstance(first, bool):
        return [round(min(numbers), 4), round(max(numbers), 4)]
    return None


def targets(per_run: list[list[Target]]) -> list[Target]:
    """Each target once: its median over the runs it was checked in, with their spread."""
    named: dict[str, list[Target]] = {}
    for checked in per_run:
        for target in checked:
            named.setdefault(target.name, []).append(target)
    found = []
    for name, seen in named.items():
        values = _numbers([target.value for target in seen])
        first = seen[0]
        if not values:
            found.append(first)
            continue
        found.append(Target(name, statistics.median(values), first.limit, first.at_most,
                            first.unit, low=min(values), high=max(values), runs=len(values)))
    return found
