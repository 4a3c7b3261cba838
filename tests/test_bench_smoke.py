"""The benchmark at 5% scale, as a subprocess: it must run end to end from the production
install, cover every scenario with numbers for DIRECT, PROXY, FLOOR and MESSAGES, and see no failed
request. Speed is not asserted here; that is the benchmark's
own report (`make bench`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

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


def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "bench", "--scale", "0.05", "--repeats", "1",
                          "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads(out.read_text())
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
