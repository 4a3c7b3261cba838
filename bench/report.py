"""Turning scenario results into the targets check, the printed tables and the JSON file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.session import TARGET_SHARE, TARGETED

Results = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One goal from the issue: `value` must be at most (or at least) `limit`. Over several
    runs, `value` is their median and `low`, `high` their spread."""

    name: str
    value: float
    limit: float
    at_most: bool = True
    unit: str = ""
    low: float = math.nan
    high: float = math.nan
    runs: int = 1

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def describe(self) -> str:
        if self.at_most and self.limit == 0:
            return "= 0"
        return f"{'≤' if self.at_most else '≥'} {self.limit:g}{self.unit}"

    def measured(self) -> str:
        """The value, and its spread over the runs when there were several."""
        shown = f"{number(self.value)}{self.unit}"
        if self.runs > 1:
            shown += f" ({number(self.low)}–{number(self.high)}, {self.runs} runs)"
        return shown

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "limit": self.limit,
                "at_most": self.at_most, "unit": self.unit, "pass": self.passed,
                "low": self.low, "high": self.high, "runs": self.runs}


def get(results: Results, *path: str) -> float:
    """A number deep in the results, NaN if that scenario did not run."""
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return math.nan
        node = node[key]
    return float(node) if isinstance(node, int | float) else math.nan


def ratio(proxy: float, direct: float) -> float:
    if math.isnan(proxy) or math.isnan(direct) or direct == 0:
        return math.nan
    return proxy / direct


def proxy_ratio(results: Results, scenario: str, key: str, side: str = "direct") -> float:
    """PROXY's figure over DIRECT's (or FLOOR's) in one scenario."""
    return ratio(get(results, scenario, "proxy", key), get(results, scenario, side, key))


def targets(results: Results) -> list[Target]:
    """The issues' targets (9, 13, 24, 31 and 45), evaluated on whichever scenarios ran."""
    found = []
    if "nonstream_latency" in results:
        found += [Target("added median latency", get(results, "nonstream_latency",
                                                     "added_p50_ms"), 0.5, unit=" ms"),
                  Target("added p99 latency", get(results, "nonstream_latency", "added_p99_ms"),
                         3.0, unit=" ms"),
                  Target("non-stream server CPU vs floor", proxy_ratio(
                      results, "nonstream_latency", "server_cpu_ms", "floor"), 0.75, unit="x")]
    found += messages_targets(results)
    if "components" in results:
        found.append(Target("routing+dashboard+inspector CPU share", get(
            results, "components", "share_pct"), 5, unit="%"))
    if "first_token" in results:
        found.append(Target("added first text delta", get(results, "first_token",
                                                          "added_ttft_p50_ms"), 0.5, unit=" ms"))
    if "long_stream" in results:
        found.append(Target("long stream rate vs direct", proxy_ratio(
            results, "long_stream", "chunks_per_s"), 1.0, at_most=False, unit="x"))
    if "concurrent_streams" in results:
        found += [Target("concurrent wall time vs direct", proxy_ratio(
            results, "concurrent_streams", "wall_s"), 1.0, unit="x"),
                  Target("concurrent errors", get(results, "concurrent_streams", "proxy",
                                                  "errors"), 0)]
    if "peak_rss" in results:
        found.append(Target("peak RSS after load", get(results, "peak_rss", "proxy",
                                                       "after_load_hwm_mib"), 100, unit=" MiB"))
    if "idle_streams" in results:
        found.append(Target("memory per open stream", get(results, "idle_streams", "proxy",
                                                          "per_stream_kib"), 30, unit=" KiB"))
    if "long_conversation" in results:
        found += [Target(f"session next turn {size} KB {way} CPU vs floor",
                         row["proxy_over_floor"], NEXT_TURN_LIMITS.get(size, 1.0), unit="x")
                  for size, way, row in conversation_rows(results["long_conversation"])]
    found += team_targets(results)
    for upstream in TARGETED if "session" in results else ():
        found.append(Target(f"session cache share, {upstream}", get(
            results, "session", upstream, "proxy", "share_after_first"), TARGET_SHARE,
            at_most=False))
    return found


NEXT_TURN_LIMITS = {100: 0.7, 850: 0.3}
"""Issue 45: a session's next turn costs what a small request costs at ~100 KB, and less
than a third of FLOOR's at ~850 KB (FLOOR parses and converts the whole conversation)."""


def team_targets(results: Results) -> list[Target]:
    """Issue 45: the team deployment (Redis, [keys] with budgets, the access log,
    OpenTelemetry to a collector) costs at most 1.15x the bare proxy's CPU, and adds at
    most 0.3 ms to its p50."""
    if "team" not in results:
        return []
    return [Target("team CPU vs bare", get(results, "team", "cpu_ratio"), 1.15, unit="x"),
            Target("team added p50 over bare", get(results, "team", "added_p50_ms"), 0.3,
                   unit=" ms")]


def messages_targets(results: Results) -> list[Target]:
    """Issue 31: a Messages upstream costs no more than the Chat Completions path (server
    CPU per request, first text; MESSAGES over PROXY in the same run), and relays a long
    stream at 0.9x DIRECT or better."""
    def over_chat(scenario: str, key: str) -> float:
        return ratio(get(results, scenario, "messages", key), get(results, scenario, "proxy", key))

    found = []
    if "messages" in results.get("nonstream_latency", {}):
        found.append(Target("messages server CPU vs chat", over_chat(
            "nonstream_latency", "server_cpu_ms"), 1.0, unit="x"))
    if "messages" in results.get("first_token", {}):
        found.append(Target("messages first text vs chat", over_chat(
            "first_token", "ttft_p50_ms"), 1.0, unit="x"))
    if "messages" in results.get("long_stream", {}):
        found.append(Target("messages long stream vs direct", ratio(
            get(results, "long_stream", "messages", "chunks_per_s"),
            get(results, "long_stream", "direct", "chunks_per_s")), 0.9, at_most=False,
            unit="x"))
    return found


# ---------------------------------------------------------------- table

# (scenario, metric key, label); each side's value comes from results[scenario][side].
ROWS: list[tuple[str, str, str]] = [
    ("nonstream_latency", "p50_ms", "1. non-stream latency p50 (ms)"),
    ("nonstream_latency", "p99_ms", "1. non-stream latency p99 (ms)"),
    ("nonstream_latency", "server_cpu_ms", "1. server CPU per request (ms)"),
    ("first_token", "ttfb_p50_ms", "2. stream first byte p50 (ms)"),
    ("first_token", "ttft_p50_ms", "2. stream first token p50 (ms)"),
    ("first_token", "ttft_p99_ms", "2. stream first token p99 (ms)"),
    ("first_token", "server_cpu_ms", "2. server CPU per stream (ms)"),
    ("long_stream", "chunks_per_s", "3. long stream (chunks/s)"),
    ("concurrent_streams", "wall_s", "4. concurrent streams wall (s)"),
    ("concurrent_streams", "chunks_per_s", "4. concurrent chunks/s"),
    ("concurrent_streams", "stream_p99_ms", "4. concurrent stream p99 (ms)"),
    ("concurrent_streams", "errors", "4. concurrent errors"),
    ("idle_streams", "open_all_s", "5. idle: time to open all (s)"),
    ("idle_streams", "rss_idle_mib", "5. idle: server RSS before (MiB)"),
    ("idle_streams", "rss_during_mib", "5. idle: server RSS open (MiB)"),
    ("idle_streams", "per_stream_kib", "5. idle: KiB per open stream"),
    ("idle_streams", "cpu_pct_while_open", "5. idle: server CPU % open"),
    ("idle_streams", "errors", "5. idle errors"),
    ("peak_rss", "idle_hwm_mib", "6. server peak RSS idle (MiB)"),
    ("peak_rss", "after_load_hwm_mib", "6. server peak RSS after (MiB)"),
    ("peak_rss", "after_all_hwm_mib", "6. peak RSS after phase 7 (MiB)"),
]

# Derived rows: (label, scenario, key, row after which it is printed), a PROXY value only.
ADDED_ROWS = [("1. added latency p50 (ms)", "nonstream_latency", "added_p50_ms", "p99_ms"),
              ("1. added latency p99 (ms)", "nonstream_latency", "added_p99_ms", "p99_ms"),
              ("2. added first token p50 (ms)", "first_token", "added_ttft_p50_ms",
               "ttft_p50_ms")]

# Which target each row shows (by label prefix).
ROW_TARGETS = {"1. added latency p50": "added median latency",
               "1. added latency p99": "added p99 latency",
               "1. server CPU per request": "non-stream server CPU vs floor",
               "2. stream first token p50": "messages first text vs chat",
               "2. added first token": "added first text delta",
               "3. long stream": "long stream rate vs direct",
               "4. concurrent streams wall": "concurrent wall time vs direct",
               "4. concurrent errors": "concurrent errors",
               "5. idle: KiB per open stream": "memory per open stream",
               "6. server peak RSS after": "peak RSS after load",
               "7. components": "routing+dashboard+inspector CPU share"}


def number(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value == int(value) and abs(value) >= 100:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def target_for(label: str, checked: list[Target]) -> str:
    """The target text and verdict that belongs to a table row, if any."""
    for prefix, name in ROW_TARGETS.items():
        if label.startswith(prefix):
            for target in checked:
                if target.name == name:
                    verdict = "PASS" if target.passed else "FAIL"
                    return f"{target.describe()} {verdict}"
    return ""


def table(results: Results, checked: list[Target], spread: Results | None = None) -> str:
    """Every figure for DIRECT, PROXY, FLOOR and MESSAGES (the proxy in front of a Messages
    API upstream), with PROXY's ratio to DIRECT and FLOOR and MESSAGES' to PROXY; over
    several runs, medians, and the range of PROXY's figure. For DIRECT, the 'server' rows
    are the upstream itself."""
    spread = spread or {}
    header = (f"{'metric':<36} {'DIRECT':>10} {'PROXY':>10} {'PROXY range':>15} {'FLOOR':>10} "
              f"{'MESSAGES':>10} {'P/D':>7} {'P/F':>7} {'M/P':>7}  target")
    lines = [header, "-" * (len(header) + 18)]
    for scenario, key, label in ROWS:
        if scenario not in results:
            continue
        direct, proxy, floor, messages = (get(results, scenario, side, key)
                                          for side in ("direct", "proxy", "floor", "messages"))
        lines.append(f"{label:<36} {number(direct):>10} {number(proxy):>10} "
                     f"{_range(spread, scenario, 'proxy', key):>15} "
                     f"{number(floor):>10} {number(messages):>10} "
                     f"{number(ratio(proxy, direct)):>7} {number(ratio(proxy, floor)):>7} "
                     f"{number(ratio(messages, proxy)):>7}  {target_for(label, checked)}")
        for added_label, added_scenario, added_key, after in ADDED_ROWS:
            if added_scenario == scenario and after == key:
                added = get(results, scenario, added_key)
                lines.append(f"{added_label:<36} {'':>10} {number(added):>10} "
                             f"{_range(spread, scenario, added_key):>15} {'':>10} "
                             f"{'':>10} {'':>7} {'':>7} {'':>7}  "
                             f"{target_for(added_label, checked)}")
    return "\n".join(lines)


def _range(spread: Results, *path: str) -> str:
    node: Any = spread
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, list):
        return ""
    return f"{number(node[0])}–{number(node[1])}"


def components_table(measured: Results, checked: list[Target]) -> str:
    """Routing, dashboard (closed) and inspector: microseconds per request, timed alone in
    the production install, and their share of the proxy's CPU per non-streaming request."""
    lines = [f"{'per request, timed alone (µs)':<36} {'routing':>8} {'dashboard':>10} "
             f"{'inspector':>10} {'total':>8} {'share':>7}  target",
             "-" * 98]
    share = get(measured, "share_pct")
    lines.append(f"{'':<36} {number(get(measured, 'routing_us')):>8} "
                 f"{number(get(measured, 'dashboard_us')):>10} "
                 f"{number(get(measured, 'inspector_us')):>10} "
                 f"{number(get(measured, 'total_us')):>8} {number(share):>6}%  "
                 f"{target_for('7. components', checked)}")
    return "\n".join(lines)


def cpu_table(cpu: dict[str, dict[str, float]]) -> str:
    """Per phase: wall time and how busy each process was (100% = one core). `other` is the
    rest of the machine; much above a few % means something else competed for the CPUs."""
    header = (f"{'phase (CPU % of one core)':<34} {'wall s':>7} {'client':>7} {'upstream':>9} "
              f"{'proxy':>7} {'floor':>7} {'messages':>9} {'other':>7}")
    lines = [header, "-" * len(header)]
    for phase, spent in cpu.items():
        floor, messages = spent.get("floor_busy_pct"), spent.get("messages_busy_pct")
        lines.append(f"{phase:<34} {spent['wall_s']:>7.2f} {spent['client_busy_pct']:>6.0f}% "
                     f"{spent['upstream_busy_pct']:>8.0f}% {spent['proxy_busy_pct']:>6.0f}% "
                     f"{'-' if floor is None else f'{floor:.0f}%':>7} "
                     f"{'-' if messages is None else f'{messages:.0f}%':>9} "
                     f"{spent.get('other_busy_pct', 0.0):>6.0f}%")
    return "\n".join(lines)


def load_line(meta: Results) -> str:
    """The machine's load (the 1-minute average: runnable tasks, 2 is both cores busy)
    before and after each run, and a warning when it was not quiet."""
    runs = meta.get("load_average_runs") or []
    shown = ", ".join(f"{run['before']:.2f}→{run['after']:.2f}" for run in runs)
    line = f"machine load (1-minute average) before→after each run: {shown or '-'}"
    if any(max(run["before"], run["after"]) > 1.0 for run in runs):
        line += ("\n  the machine was not quiet (another process used the CPUs: see 'other' "
                 "above): compare ratios within a run, not milliseconds across runs")
    return line


def workers_table(workers: dict[str, Any]) -> str:
    """Scenario 4 on a 1- and a 2-worker proxy (and DIRECT), side by side."""
    header = f"{'4. concurrent streams by workers':<36} {'wall s':>8} {'chunks/s':>9} {'errors':>7}"
    lines = [f"{header} {'P/D':>6}", "-" * (len(header) + 7)]
    for name, run in workers.items():
        if not isinstance(run, dict):
            lines.append(f"  note: {run}")
            continue
        lines.append(f"{name:<36} {number(float(run.get('wall_s', math.nan))):>8} "
                     f"{number(float(run.get('chunks_per_s', math.nan))):>9} "
                     f"{run.get('errors', 0):>7} "
                     f"{number(float(run.get('vs_direct', math.nan))):>6}")
    return "\n".join(lines)


def summary(checked: list[Target]) -> str:
    lines = ["targets:"]
    for target in checked:
        verdict = "PASS" if target.passed else "FAIL"
        lines.append(f"  [{verdict}] {target.name}: {target.measured()} "
                     f"(target {target.describe()})")
    return "\n".join(lines)


def conversation_rows(measured: Results) -> list[tuple[int, str, Results]]:
    """The long_conversation phase's rows: (size, non-stream or stream, the row)."""
    return [(size, way, measured[f"{size}kb_{way}"]) for size in measured.get("sizes_kb", [])
            for way in ("nonstream", "stream") if f"{size}kb_{way}" in measured]


def conversation_table(measured: Results, spread: Results | None = None) -> str:
    """Server CPU per request of a growing Claude Code conversation, PROXY against FLOOR:
    medians over the runs, and the spread of the ratio."""
    spread = spread or {}
    lines = ["7. a Claude Code session's next turns (grown by file reads), server CPU per "
             "request; IO_FLOOR: the body read and written upstream unchanged",
             f"{'size':>9} {'answer':>10} {'PROXY ms':>9} {'FLOOR ms':>9} {'P/F':>6} "
             f"{'P/F range':>12} {'IO ms':>7} {'IO/F':>6}"]
    for size, way, row in conversation_rows(measured):
        proxy = row.get("proxy", {}).get("server_cpu_ms", math.nan)
        floor = row.get("floor", {}).get("server_cpu_ms", math.nan)
        io = row.get("io_floor", {}).get("server_cpu_ms", math.nan)
        low, high = spread.get(f"{size}kb_{way}", {}).get("proxy_over_floor", [math.nan] * 2)
        lines.append(f"{row['kb']:>6g} KB {way:>10} {number(proxy):>9} {number(floor):>9} "
                     f"{number(row['proxy_over_floor']):>6} "
                     f"{number(low):>5}–{number(high):<6} {number(io):>7} "
                     f"{number(row.get('io_floor_over_floor', math.nan)):>6}")
    return "\n".join(lines)
