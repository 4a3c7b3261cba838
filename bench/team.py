"""The team column: what a team's deployment costs a request, against the bare proxy.

A team runs the proxy with its state shared through Redis (`REDIS_URL`), each person's key
with a budget and limits (`[keys]`), the INFO access log, and OpenTelemetry exporting traces
and metrics to a collector (the Docker image's `otel` extra). Both proxies here run from one
production install with that extra (`pip install .[otel]`: OpenTelemetry is not imported
where it is off), against the fast upstream:

- BARE: as the main scenarios run it (one client key, the INFO access log);
- TEAM: the same, plus REDIS_URL on a local redis-server (persistence off), a `[keys]` table
  whose key has a budget (its check asks Redis for the fleet's spend on every request), an
  rpm and a tpm limit, and OTEL_EXPORTER_OTLP_ENDPOINT on a local OTLP/HTTP receiver.

Both get the same sequential small non-streaming requests on one kept-alive connection in
one Claude Code session, in rounds taking turns (each round's ratio compares sides that saw
the same machine). Reported: p50 latency, the proxy process's CPU per request (Redis's and
the receiver's own apart), their ratio and the added p50, each the median of the rounds with
their range. Targets (issue 45): CPU <= 1.15x the bare proxy's, p50 <= +0.3 ms over it.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.install import production_python
from bench.procs import (
    AS_USERS_RUN_IT,
    ROOT,
    UPSTREAM_KEY,
    Managed,
    free_port,
    start_proxy,
    start_upstream,
)
from bench.redis_column import measure, start_redis

TEAM_KEY = "sk-team-bench-key-0123456789"
ROUNDS = 5
REQUESTS = 200
WARMUP = 30


def config(upstream_url: str) -> str:
    """The team's config file: the bench's provider with a price, and one key with a budget
    (never reached) and limits (never reached: they are counted all the same)."""
    return f"""
[providers.bench]
openai_base_url = "{upstream_url}"
openai_api_key = "{UPSTREAM_KEY}"
provider = "openai"
big_model = "gpt-4o"
middle_model = "gpt-4o"
small_model = "gpt-4o-mini"
context_window = 1000000
price_input = 2.5
price_output = 10

[keys.team]
key = "env:TEAM_KEY"
budget_usd = 1000000
budget_period = "month"
rpm = 1000000
tpm = 1000000000
"""


def start_receiver(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A local OTLP/HTTP receiver (bench/telemetry_cost.py's): answers 200 to every export."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.telemetry_cost", "receive",
                                str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    return process, f"http://127.0.0.1:{port}"


def run(workdir: Path, log: Callable[[str], None], source: Path = ROOT) -> dict[str, Any]:
    """Both proxies from `source`'s production install (`--source`, as the other scenarios),
    measured in turn; `{"note": ...}` when redis-server is missing."""
    if shutil.which("redis-server") is None:
        log("  team column skipped: redis-server is not installed (make redis)")
        return {"note": "redis-server is not installed"}
    python = production_python(log, source, extras="otel")
    upstream = start_upstream(workdir, name="team-upstream")
    redis, redis_url = start_redis(workdir)
    receiver, collector = start_receiver(workdir)
    path = workdir / "team.toml"
    path.write_text(config(upstream.url))
    bare = start_proxy(workdir, upstream.url, python=python, name="bare", env=AS_USERS_RUN_IT)
    team = start_proxy(workdir, upstream.url, python=python, name="team", env={
        **AS_USERS_RUN_IT, "CONFIG_FILE": str(path), "TEAM_KEY": TEAM_KEY,
        "REDIS_URL": redis_url, "REDIS_PREFIX": "bench-team:",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_SERVICE_NAME": "claude-proxy-bench"})
    try:
        log(f"  team column: {ROUNDS} rounds of {REQUESTS} requests to each of bare, team")
        scripts = Scripts(redis_url)
        measured = asyncio.run(_rounds(bare, team, [redis.pid, receiver.pid]))
        measured["team"]["redis_scripts"] = scripts.per_request(
            measured["rounds"] * (REQUESTS + WARMUP))
        return measured
    finally:
        for process in (bare, team, upstream):
            process.stop()
        for helper in (redis, receiver):
            helper.kill()
            helper.wait()


class Scripts:
    """Redis's count of the team proxy's script calls (EVALSHA: each flush of its writes,
    the budget check's read included, is one), from INFO commandstats."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.before = self.count()

    def count(self) -> int:
        stats = self.client.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0))

    def per_request(self, requests: int) -> float:
        return round((self.count() - self.before) / requests, 2)


async def _rounds(bare: Managed, team: Managed, helpers: list[int]) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {"bare": [], "team": []}
    for _ in range(ROUNDS):  # in turn, so that a change of the machine's speed hits both
        rounds["bare"].append(await measure(bare.url, [bare.pid], REQUESTS, WARMUP))
        rounds["team"].append(await measure(team.url, [team.pid, *helpers], REQUESTS, WARMUP,
                                            key=TEAM_KEY))
    return summarise(rounds)


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each figure the median of the rounds; the ratio and the added p50 each round's own,
    then their median and range."""
    def median(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    cpu = {side: [run["cpu_ms_per_request"][0] for run in runs] for side, runs in rounds.items()}
    p50 = {side: [run["p50_ms"] for run in runs] for side, runs in rounds.items()}
    ratios = [team / bare for team, bare in zip(cpu["team"], cpu["bare"], strict=True)]
    added = [team - bare for team, bare in zip(p50["team"], p50["bare"], strict=True)]
    helpers = [run["cpu_ms_per_request"][1:] for run in rounds["team"]]
    return {
        "rounds": len(ratios), "requests": REQUESTS,
        "bare": {"p50_ms": median(p50["bare"]), "proxy_cpu_ms": median(cpu["bare"])},
        "team": {"p50_ms": median(p50["team"]), "proxy_cpu_ms": median(cpu["team"]),
                 "redis_cpu_ms": median([h[0] for h in helpers]),
                 "collector_cpu_ms": median([h[1] for h in helpers])},
        "cpu_ratio": median(ratios), "cpu_ratio_range": [round(min(ratios), 3),
                                                         round(max(ratios), 3)],
        "added_p50_ms": median(added), "added_p50_range": [round(min(added), 3),
                                                           round(max(added), 3)],
    }


def table(measured: dict[str, Any]) -> str:
    if "note" in measured:
        return f"team column: {measured['note']}"
    bare, team = measured["bare"], measured["team"]
    low, high = measured["cpu_ratio_range"]
    first, last = measured["added_p50_range"]
    return "\n".join([
        f"team deployment (Redis, [keys] with a budget, access log, OpenTelemetry to a "
        f"collector), {measured['rounds']} rounds of {measured['requests']} requests",
        f"{'':<28} {'bare':>8} {'team':>8}",
        f"{'p50 (ms)':<28} {bare['p50_ms']:>8.3f} {team['p50_ms']:>8.3f}   added "
        f"{measured['added_p50_ms']:+.3f} ms ({first:+.3f} to {last:+.3f})",
        f"{'proxy CPU per request (ms)':<28} {bare['proxy_cpu_ms']:>8.3f} "
        f"{team['proxy_cpu_ms']:>8.3f}   x{measured['cpu_ratio']:.3f} ({low:.3f}–{high:.3f})",
        f"{'redis-server, collector (ms)':<28} {'':>8} {team['redis_cpu_ms']:>4.3f}, "
        f"{team['collector_cpu_ms']:.3f}",
        f"{'Redis script calls a request':<28} {'':>8} {team.get('redis_scripts', '?'):>8}"])

