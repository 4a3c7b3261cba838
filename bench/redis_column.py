"""`python -m bench.redis_column`: what sharing state through Redis costs a request.

The same proxy twice against the fast upstream (bench/upstream.py): once with in-process
state, once with REDIS_URL pointing at a local redis-server (persistence off). Each gets the
same sequential non-streaming requests on one kept-alive connection, every one in the same
Claude Code session (`x-claude-code-session-id`), so the session size, the provider's health,
the refused-field memory and the dashboard's row, minute counters and inspector bodies all go
through the store. Reported: p50/p99 latency, the added p50, and the proxy process's CPU per
request (and Redis's own, apart). Targets (issue 20): CPU with Redis <= 1.1x without, added
p50 <= 0.3 ms.

The proxies run from this interpreter (the source tree's code), both the same way, so the
ratio compares like with like; `make bench` measures the production install.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.client import new_client, proxy_target
from bench.procs import cpu_seconds, free_port, process_tree, start_proxy, start_upstream
from bench.upstream import TOKEN

SESSION = {"x-claude-code-session-id": "bench-session-0001"}


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("redis-server did not start")


async def measure(url: str, pids: list[int], count: int, warmup: int,
                  key: str | None = None) -> dict[str, Any]:
    """`count` sequential requests after `warmup`: their p50 and p99, and each of `pids`'s
    CPU per request (its children's too). `key`: the client key sent (default the bench's)."""
    target = proxy_target(url)
    body = orjson.dumps(target.build(8, 0.0, False))
    headers = {"content-type": "application/json", **target.headers, **SESSION,
               **({"x-api-key": key} if key else {})}
    latencies = []
    async with new_client() as client:
        for _ in range(warmup):
            await client.post(target.url, content=body, headers=headers)
        cpu_before = [sum(cpu_seconds(p) for p in process_tree(pid)) for pid in pids]
        for _ in range(count):
            started = time.perf_counter()
            response = await client.post(target.url, content=body, headers=headers)
            latencies.append(time.perf_counter() - started)
            text = target.read_message(orjson.loads(response.content))
            if response.status_code != 200 or text != TOKEN * 8:
                raise RuntimeError(f"unexpected answer: {response.status_code}")
        cpu_after = [sum(cpu_seconds(p) for p in process_tree(pid)) for pid in pids]
    latencies.sort()
    cpu = [(after - before) / count * 1e3 for before, after in zip(cpu_before, cpu_after,
                                                                   strict=True)]
    return {"p50_ms": round(statistics.median(latencies) * 1e3, 3),
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 3),
            "cpu_ms_per_request": [round(value, 4) for value in cpu]}


def run(count: int, warmup: int, rounds: int) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (make redis)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    upstream = start_upstream(workdir)
    redis, redis_url = start_redis(workdir)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = {"PYTHONPATH": src}
    plain = start_proxy(workdir, upstream.url, env=env, name="plain")
    shared = start_proxy(workdir, upstream.url, name="redis",
                         env={**env, "REDIS_URL": redis_url, "REDIS_PREFIX": "bench:"})
    results: dict[str, list[dict[str, Any]]] = {"in_process": [], "redis": []}
    try:
        for _ in range(rounds):  # alternate, so that drift of the machine hits both
            results["in_process"].append(asyncio.run(
                measure(plain.url, [plain.pid], count, warmup)))
            results["redis"].append(asyncio.run(
                measure(shared.url, [shared.pid, redis.pid], count, warmup)))
    finally:
        for process in (plain, shared, upstream):
            process.stop()
        redis.kill()
        redis.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return summarise(results, count, rounds)


def summarise(results: dict[str, list[dict[str, Any]]], count: int,
              rounds: int) -> dict[str, Any]:
    def median(name: str, pick: Any) -> float:
        return round(statistics.median(pick(r) for r in results[name]), 4)

    plain_cpu = median("in_process", lambda r: r["cpu_ms_per_request"][0])
    redis_cpu = median("redis", lambda r: r["cpu_ms_per_request"][0])
    plain_p50 = median("in_process", lambda r: r["p50_ms"])
    redis_p50 = median("redis", lambda r: r["p50_ms"])
    return {
        "requests": count, "rounds": rounds,
        "in_process": {"p50_ms": plain_p50, "p99_ms": median("in_process",
                                                             lambda r: r["p99_ms"]),
                       "proxy_cpu_ms": plain_cpu},
        "redis": {"p50_ms": redis_p50, "p99_ms": median("redis", lambda r: r["p99_ms"]),
                  "proxy_cpu_ms": redis_cpu,
                  "redis_server_cpu_ms": median("redis", lambda r: r["cpu_ms_per_request"][1])},
        "cpu_ratio": round(redis_cpu / plain_cpu, 3) if plain_cpu else None,
        "added_p50_ms": round(redis_p50 - plain_p50, 3),
        "targets": {"cpu_ratio": 1.1, "added_p50_ms": 0.3},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_column")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    summary = run(args.requests, warmup=30, rounds=args.rounds)
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    ok = (summary["cpu_ratio"] is not None and summary["cpu_ratio"] <= 1.1
          and summary["added_p50_ms"] <= 0.3)
    print("targets met" if ok else "targets NOT met", file=sys.stderr)


if __name__ == "__main__":
    main()
