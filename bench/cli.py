"""`python -m bench`: start the fast upstream and the proxy, run every scenario against DIRECT
and PROXY, print the comparison with the issue's targets, and write the results as JSON."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import orjson

from bench import count_tokens, repeats, report, scenarios, session, team, tool_calls
from bench.client import (
    direct_target,
    floor_target,
    io_floor_target,
    messages_target,
    new_client,
    proxy_target,
    request_message,
    request_stream,
)
from bench.install import dev_python, installed_location, production_python
from bench.procs import (
    AS_USERS_RUN_IT,
    ROOT,
    Managed,
    StartupError,
    WorkersUnsupported,
    load_average,
    raise_fd_limit,
    start_floor,
    start_proxy,
    start_upstream,
)
from bench.profiling import Profiler
from bench.scenarios import Bench
from bench.upstream import install_fast_loop

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"

Scenario = Callable[[Bench], Awaitable[dict[str, Any]]]
# Run order: the idle-streams memory scenario before the big concurrent one, so its
# "RSS before" is not inflated by memory the concurrent run left behind.
SCENARIOS: dict[str, Scenario] = {
    "nonstream_latency": scenarios.nonstream_latency,
    "first_token": scenarios.first_token,
    "long_stream": scenarios.long_stream,
    "idle_streams": scenarios.idle_streams,
    "concurrent_streams": scenarios.concurrent_streams,
    "long_conversation": scenarios.long_conversation,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every request/stream/chunk count (0.05 for a smoke run)")
    parser.add_argument("--workers", type=int, default=1,
                        help="run the proxy with N uvicorn workers (passed only when N > 1)")
    parser.add_argument("--compare-workers", action="store_true",
                        help="also run the concurrent scenario on a 1- and a 2-worker proxy")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, metavar="PATH",
                        help=f"where to write the results (default {DEFAULT_JSON})")
    parser.add_argument("--only", default="", metavar="NAMES",
                        help=f"comma-separated subset of: {', '.join(SCENARIOS)}, "
                             "session, count_tokens, team")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record the proxy with py-spy during each PROXY phase; "
                             "flame graphs and a hotspot list go to DIR")
    parser.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="run the scenarios N times in turn (default 3): each figure is "
                             "the median of the runs, shown with its spread")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a target is missed (errors always exit 1)")
    parser.add_argument("--install", choices=("production", "dev"), default="production",
                        help="run the proxy and FLOOR from the production venv "
                             "(.cache/bench-prod-venv, `pip install .` only; default) or from "
                             "this interpreter's (the dev venv: only to compare the two)")
    parser.add_argument("--source", type=Path, default=ROOT, metavar="DIR",
                        help="build the production install from another checkout (e.g. "
                             "`git archive main | tar -x -C DIR`) to compare before and after")
    return parser


# Scenarios that start their own upstreams and proxies (not the shared Bench).
OWN_SETUP = ("session", "count_tokens", "team", "tool_calls")


def chosen(only: str) -> list[str]:
    names = [name.strip() for name in only.split(",") if name.strip()]
    known = (*SCENARIOS, *OWN_SETUP)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}; "
                         f"choose from {', '.join(known)}")
    return [name for name in known if not names or name in names]


# ---------------------------------------------------------------- runs


async def warm_up(bench: Bench) -> None:
    """One request of each kind per side, so lazy imports and first connections are done
    before anything is measured (and before the 'idle' memory reading)."""
    async with new_client() as client:
        for target in bench.targets():
            await request_message(client, target, 8)
            await request_stream(client, target, 8)


def peak(bench: Bench) -> dict[str, float]:
    """Peak RSS so far of the server on each side (the upstream stands in for DIRECT)."""
    return {target.name: bench.server_for(target).usage().hwm_mib
            for target in bench.targets()}


MEMORY = ("idle_streams",)
"""Scenarios that measure memory: run once, in the first pass."""


async def run_passes(bench: Bench, names: list[str], passes: int,
                     meta: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The scenarios `passes` times in turn: each pass's results and CPU accounting, and the
    machine's load before and after each in `meta` (`load_average_runs`). Memory is read in
    the first pass only (the idle streams' growth, the peak RSS): later passes start from
    what the earlier left in the processes, the peak included."""
    await warm_up(bench)
    idle = peak(bench)
    runs, cpu = [], []
    meta["load_average_runs"] = []
    for number in range(passes):
        if passes > 1:
            log(f"[run {number + 1} of {passes}]")
        before = load_average()
        bench.cpu = {}
        first = not number
        runs.append(await run_scenarios(
            bench, [name for name in names if first or name not in MEMORY],
            idle if first else None))
        cpu.append(bench.cpu)
        meta["load_average_runs"].append({"before": before, "after": load_average()})
    return runs, cpu


async def run_scenarios(bench: Bench, names: list[str],
                        idle: dict[str, float] | None) -> dict[str, Any]:
    """Each scenario once; with `idle` (the first pass), the peak RSS too."""
    results: dict[str, Any] = {}
    after: dict[str, float] | None = None
    for name in names:
        if name == "long_conversation":
            # The peak the target was set for: the load phases' (the long conversations'
            # 800 KB bodies, kept whole by the dashboard's inspector, are reported apart).
            after = peak(bench)
        log(f"[{name}]")
        results[name] = await SCENARIOS[name](bench)
    if idle is None:
        return results
    final = peak(bench)
    after = after or final
    results["peak_rss"] = {
        side: {"idle_hwm_mib": round(idle[side], 2), "after_load_hwm_mib": round(after[side], 2),
               "after_load_rss_mib": round(bench.server_for(target).usage().rss_mib, 2),
               "after_all_hwm_mib": round(final[side], 2)}
        for side, target in zip(idle, bench.targets(), strict=True)}
    return results


def open_proxy(workdir: Path, upstream_url: str, workers: int,
               meta: dict[str, Any], python: Path) -> Managed:
    """The proxy with `workers` workers, or with one if its CLI has no --workers yet."""
    try:
        proxy = start_proxy(workdir, upstream_url, workers, python=python, env=AS_USERS_RUN_IT)
        meta["workers"] = workers
    except WorkersUnsupported:
        log(f"warning: the proxy does not support --workers; running 1 worker, not {workers}")
        proxy = start_proxy(workdir, upstream_url, 1, python=python, env=AS_USERS_RUN_IT)
        meta["workers"] = 1
        meta["workers_note"] = "--workers rejected by the proxy CLI"
    return proxy


def make_bench(proxy: Managed, upstream: Managed, scale: float,
               profiler: Profiler | None = None, floor: Managed | None = None,
               messages: Managed | None = None, io_floor: Managed | None = None) -> Bench:
    return Bench(direct_target(upstream.url), proxy_target(proxy.url), upstream, proxy,
                 scale=scale, log=log, recorder=profiler.record if profiler else None,
                 floor=floor_target(floor.url) if floor else None, floor_process=floor,
                 messages=messages_target(messages.url) if messages else None,
                 messages_process=messages,
                 io_floor=io_floor_target(io_floor.url) if io_floor else None,
                 io_floor_process=io_floor)


def start_io_floor(workdir: Path, upstream_url: str, python: Path,
                   names: list[str]) -> AbstractContextManager[Managed | None]:
    """IO_FLOOR (bench/io_floor.py with the proxy's own HTTP protocol, the body's pieces
    never joined: the least I/O on this stack) when the long conversations are measured."""
    if "long_conversation" not in names:
        return nullcontext()
    return start_floor(workdir, upstream_url, python, name="io_floor", args=("--pieces",))


def start_messages_proxy(workdir: Path, upstream_url: str, python: Path) -> Managed:
    """The proxy in front of the same upstream's Messages API (`UPSTREAM_API=messages`, the
    vllm profile: a hosted-style sanitised pass-through), run as users run it."""
    return start_proxy(workdir, upstream_url.removesuffix("/v1"), python=python,
                       name="messages", env={**AS_USERS_RUN_IT, "UPSTREAM_API": "messages",
                                             "PROVIDER": "vllm"})


async def compare_workers(workdir: Path, upstream: Managed, scale: float,
                          cpu: dict[str, Any], python: Path) -> dict[str, Any]:
    """Scenario 4 against a 1-worker and a 2-worker proxy (DIRECT once, for the ratio);
    the CPU accounting of those runs is added to `cpu`."""
    compared: dict[str, Any] = {}
    for workers in (1, 2):
        try:
            proxy = start_proxy(workdir, upstream.url, workers, python=python,
                                env=AS_USERS_RUN_IT)
        except WorkersUnsupported:
            log("warning: the proxy does not support --workers; 2-worker run skipped")
            compared["note"] = "--workers rejected by the proxy CLI"
            break
        with proxy:
            bench = make_bench(proxy, upstream, scale)
            sides = (bench.direct, bench.proxy) if workers == 1 else (bench.proxy,)
            run = await scenarios.concurrent_streams(bench, only=sides, key=f"workers_{workers}")
        if "direct" in run:
            compared["direct"] = run["direct"]
        label = f"{workers} worker{'s' if workers > 1 else ''}"
        compared[label] = {**run["proxy"], "vs_direct": round(
            report.ratio(run["proxy"]["wall_s"], compared["direct"]["wall_s"]), 3)}
        cpu.update(bench.cpu)
    return compared


# ---------------------------------------------------------------- output


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, text=True,
                           capture_output=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def count_errors(results: dict[str, Any]) -> int:
    """Every `errors` count anywhere in the results."""
    total = 0
    for key, value in results.items():
        if isinstance(value, dict):
            total += count_errors(value)
        elif key == "errors" and isinstance(value, int):
            total += value
    return total


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")


def print_report(document: dict[str, Any], checked: list[report.Target]) -> None:
    meta = document["meta"]
    print(f"\nclaude-proxy benchmark — scale {meta['scale']}, {meta['workers']} worker(s), "
          f"{meta['cpus']} CPUs, {meta['duration_s']:.0f}s, commit {meta['commit']}, "
          f"{meta['install']} install, {meta['repeats']} run(s): medians (and PROXY's range)")
    print(report.table(document["scenarios"], checked, document.get("spread")))
    if document["scenarios"].get("components"):
        print()
        print(report.components_table(document["scenarios"]["components"], checked))
    if "long_conversation" in document["scenarios"]:
        print()
        print(report.conversation_table(document["scenarios"]["long_conversation"],
                                        document.get("spread", {}).get("long_conversation")))
    if "session" in document["scenarios"]:
        print()
        print(session.table(document["scenarios"]["session"]))
    if "count_tokens" in document["scenarios"]:
        print()
        print(count_tokens.report(document["scenarios"]["count_tokens"]))
    if "tool_calls" in document["scenarios"]:
        print()
        print(tool_calls.report(document["scenarios"]["tool_calls"]))
    if "team" in document["scenarios"]:
        print()
        print(team.table(document["scenarios"]["team"]))
    if "workers" in document:
        print()
        print(report.workers_table(document["workers"]))
    print()
    print(report.cpu_table(document["cpu"]))
    print(report.load_line(meta))
    print()
    print(report.summary(checked))


ONCE = ("components", "session", "count_tokens", "team")
"""Results measured once, after the runs (not timed against another side in turn)."""


def checked_targets(document: dict[str, Any]) -> list[report.Target]:
    """The targets of each run (with what was measured once: components, session, team),
    each as its median over the runs with their spread."""
    scenarios = document["scenarios"]
    once = {name: value for name, value in scenarios.items() if name in ONCE}
    runs = document.get("runs") or [{name: value for name, value in scenarios.items()
                                     if name not in ONCE}]
    return repeats.targets([report.targets(run) for run in runs]) + report.targets(once)



def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = chosen(args.only)
    install_fast_loop()
    started = time.time()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "scale": args.scale, "workers_requested": args.workers, "cpus": os.cpu_count(),
        "python": platform.python_version(), "commit": git_commit(),
        "fd_limit": raise_fd_limit(8 * max(1000, round(1000 * args.scale)) + 1000),
        "load_average_before": load_average(), "repeats": args.repeats}
    if meta["load_average_before"] > 0.5:
        log(f"warning: load average {meta['load_average_before']:.2f} before the start: other "
            "processes are using the CPUs, so the results will be noisy (see 'other' below)")
    profiler = Profiler(args.profile, log) if args.profile else None
    try:
        with tempfile.TemporaryDirectory(prefix="claude-proxy-bench-") as tmp:
            document = run(Path(tmp), args, names, meta, profiler)
    except StartupError as exc:
        log(f"bench: {exc}")
        return 2
    meta["duration_s"] = round(time.time() - started, 1)
    checked = checked_targets(document)
    document["targets"] = [target.as_json() for target in checked]
    write_json(args.json, document)
    print_report(document, checked)
    if profiler is not None:
        print()
        print(profiler.summary())
    print(f"\nresults written to {args.json}")
    errors = count_errors(document["scenarios"]) + count_errors(document.get("workers", {}))
    if errors:
        log(f"bench: {errors} request(s) failed")
        return 1
    return 1 if args.strict and not all(target.passed for target in checked) else 0


def server_python(install: str, source: Path, meta: dict[str, Any]) -> Path:
    """The interpreter the proxy and FLOOR run with, noted in `meta`."""
    python = production_python(log, source) if install == "production" else dev_python()
    meta["install"] = install
    if source.resolve() != ROOT:
        meta["source"] = str(source.resolve())
    meta["proxy_package"] = installed_location(python)
    return python


def components(python: Path, nonstream: dict[str, Any]) -> dict[str, Any]:
    """Routing, dashboard and inspector per request (bench/components.py, in the same
    install), and their share of the proxy's server CPU per non-streaming request."""
    run = subprocess.run([str(python), str(ROOT / "bench" / "components.py")],
                         capture_output=True, text=True, timeout=120, cwd=python.parent)
    if run.returncode != 0:
        log(f"warning: bench/components.py failed:\n{run.stderr[-2000:]}")
        return {}
    measured: dict[str, Any] = orjson.loads(run.stdout)
    total = sum(measured.values())
    per_request = nonstream.get("proxy", {}).get("server_cpu_ms", float("nan"))
    measured["total_us"] = round(total, 2)
    measured["share_pct"] = round(100 * total / (1000 * per_request), 2)
    return measured


def run(workdir: Path, args: argparse.Namespace, names: list[str], meta: dict[str, Any],
        profiler: Profiler | None) -> dict[str, Any]:
    python = server_python(args.install, args.source, meta)
    upstream = start_upstream(workdir)
    with upstream:
        proxy = open_proxy(workdir, upstream.url, args.workers, meta, python)
        floor = start_floor(workdir, upstream.url, python)
        messages = start_messages_proxy(workdir, upstream.url, python)
        log(f"upstream pid {upstream.pid} at {upstream.url}; proxy pid {proxy.pid} at "
            f"{proxy.url} ({meta['workers']} worker(s)); floor pid {floor.pid}; "
            f"messages proxy pid {messages.pid}; "
            f"{args.install} install ({meta['proxy_package']})")
        with proxy, floor, messages, start_io_floor(workdir, upstream.url, python,
                                                    names) as io_floor:
            if profiler is not None:
                profiler.attach_to(proxy.pid)
            bench = make_bench(proxy, upstream, args.scale, profiler, floor, messages,
                               io_floor)
            runs, cpu = asyncio.run(run_passes(
                bench, [name for name in names if name in SCENARIOS], args.repeats, meta))
        results = repeats.combine(runs)
        if "nonstream_latency" in results:
            log("[components]")
            results["components"] = components(python, results["nonstream_latency"])
        if "session" in names:
            log("[session]")
            results["session"] = session.run_session(workdir, log, python)
        if "count_tokens" in names:
            log("[count_tokens]")
            results["count_tokens"] = count_tokens.results(workdir)
        if "tool_calls" in names:
            log("[tool_calls]")
            results["tool_calls"] = tool_calls.results(args.scale)
        if "team" in names:
            log("[team]")
            results["team"] = team.run(workdir, log, args.source)
        document: dict[str, Any] = {
            "meta": meta, "scenarios": results, "cpu": repeats.combine(cpu),
            "spread": repeats.spread(runs) if len(runs) > 1 else {}, "runs": runs}
        if args.compare_workers:
            log("[compare workers]")
            document["workers"] = asyncio.run(
                compare_workers(workdir, upstream, args.scale, document["cpu"], python))
    return document
