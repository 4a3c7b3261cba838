"""The benchmark's session figure, as a subprocess (`python -m bench --only session`): the
recorded 10-turn Claude Code session through the proxy reads at least 90% of its input from
cache after the first turn, on a prefix-caching and a breakpoint-caching upstream, within a
point of a direct connection; with PROMPT_CACHE=off (the control) nothing is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_session_cache_share(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "bench", "--only", "session", "--scale", "0.05",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    session = json.loads(out.read_text())["scenarios"]["session"]
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
    assert "session cache share, openai" in run.stdout
