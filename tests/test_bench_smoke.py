"""The benchmark at 5% scale, as a subprocess run once for the module: it must run end to end
from the production install, cover every scenario with numbers for DIRECT, PROXY, FLOOR and
MESSAGES, and see no failed request. Speed is not asserted here; that is the benchmark's own
report (`make bench`). Its session figure is asserted: the recorded 10-turn Claude Code session
through the proxy reads at least 90% of its input from cache after the first turn, on a
prefix-caching and a breakpoint-caching upstream, within a point of a direct connection; with
PROMPT_CACHE=off (the control) nothing is read."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = {
    "nonstream_latency": ("p50_ms", "p99_ms", "server_cpu_ms"),
    "first_token": ("ttfb_p50_ms", "ttft_p50_ms", "server_cpu_ms"),
    "long_stream": ("chunks_per_s",),
    "concurrent_streams": ("wall_s", "chunks_per_s"),
    "idle_streams": ("rss_idle_mib", "rss_during_mib", "per_stream_kib", "cpu_pct_while_open"),
    "peak_rss": ("idle_hwm_mib", "after_load_hwm_mib"),
}


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Run:
    document: dict[str, Any]
    stdout: str


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    run = subprocess.run([sys.executable, "-m", "bench", "--scale", "0.05", "--repeats", "1",
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return Run(json.loads(out.read_text()), run.stdout)


def test_bench_smoke(bench_run: Run) -> None:
    document = bench_run.document
    scenarios = document["scenarios"]
    for scenario, metrics in SCENARIOS.items():
        for side in ("direct", "proxy", "floor", "messages"):
            result = scenarios[scenario][side]
            for metric in metrics:
                assert is_number(result[metric]), (scenario, side, metric, result)
            assert result.get("errors", 0) == 0, (scenario, side, result)
    assert is_number(scenarios["nonstream_latency"]["added_p50_ms"])
    rows = {key: row for key, row in scenarios["long_conversation"].items()
            if key.endswith(("kb_nonstream", "kb_stream"))}
    assert len(rows) == 4, sorted(scenarios["long_conversation"])
    for key, row in rows.items():
        for side in ("proxy", "floor"):
            assert is_number(row[side]["server_cpu_ms"]), (key, side, row)
            assert row[side]["errors"] == 0, (key, side, row)
    # The proxy and FLOOR ran from the production venv, not from the source tree.
    assert document["meta"]["install"] == "production"
    assert "bench-prod-venv" in document["meta"]["proxy_package"], document["meta"]
    assert {target["name"] for target in document["targets"]} >= {
        "added median latency", "long stream rate vs direct", "concurrent wall time vs direct",
        "peak RSS after load", "memory per open stream", "non-stream server CPU vs floor",
        "added first text delta", "messages server CPU vs chat",
        "messages long stream vs direct", "session next turn 100 KB nonstream CPU vs floor",
        "session next turn 850 KB stream CPU vs floor"}
    assert document["meta"]["load_average_runs"] and len(document["runs"]) == 1
    assert all(is_number(spent["wall_s"]) for spent in document["cpu"].values())


def test_session_cache_share(bench_run: Run) -> None:
    session = bench_run.document["scenarios"]["session"]
    assert session["turns"] == 10
    for name in ("openai", "deepseek", "openrouter-anthropic", "openrouter-google",
                 "dashscope"):
        proxy, direct = session[name]["proxy"], session[name]["direct"]
        assert proxy["share_after_first"] >= 0.9, (name, proxy)
        assert proxy["share_after_first"] >= direct["share_after_first"] - 0.01, (name, proxy)
        assert proxy["per_turn"][0] == 0 and min(proxy["per_turn"][1:]) >= 0.9, (name, proxy)
    breakpoint_writes = session["openrouter-anthropic"]["proxy"]["cache_write_total"]
    assert breakpoint_writes > 0 and session["openai"]["proxy"]["cache_write_total"] == 0
    control = session["control:cache-off"]["proxy"]
    assert control["share_after_first"] == 0 and control["cache_write_total"] == 0
    assert "session cache share, openai" in bench_run.stdout
