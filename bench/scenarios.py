"""The benchmark scenarios. Each runs once against DIRECT and once against PROXY (same client
code, alternating) and returns plain numbers, with the CPU time every process spent on it so
the report can show that neither the client nor the upstream was the bottleneck."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    nullcontext,
)
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from bench.client import (
    StreamTiming,
    Target,
    lanes,
    new_client,
    request_message,
    request_stream,
    spec,
)
from bench.conversation import SIZES_KB, session_turns
from bench.procs import Managed, Usage, machine_busy_seconds

Result = dict[str, Any]


@dataclass
class Bench:
    """Everything a scenario needs: the targets, the processes to watch and the scale."""

    direct: Target
    proxy: Target
    upstream: Managed
    proxy_process: Managed
    scale: float = 1.0
    log: Callable[[str], None] = print
    cpu: dict[str, dict[str, Any]] = field(default_factory=dict)
    recorder: Callable[[str], AbstractAsyncContextManager[None]] | None = None
    """Wraps each PROXY phase (the profiler), when profiling."""
    floor: Target | None = None
    """The FLOOR translator (bench/floor.py), run through the same phases when present."""
    floor_process: Managed | None = None
    messages: Target | None = None
    """The proxy in front of a Messages API upstream, run through the same phases."""
    messages_process: Managed | None = None
    io_floor: Target | None = None
    """IO_FLOOR (bench/io_floor.py): the long conversations' bodies passed on unchanged,
    measured in that phase only, beside FLOOR."""
    io_floor_process: Managed | None = None

    def count(self, full: int, minimum: int = 1) -> int:
        """A count from the issue, scaled by --scale."""
        return max(minimum, round(full * self.scale))

    def targets(self) -> tuple[Target, ...]:
        return ((self.direct, self.proxy) + ((self.floor,) if self.floor is not None else ())
                + ((self.messages,) if self.messages is not None else ()))

    def processes(self) -> dict[str, Managed]:
        """The servers by the name their CPU is recorded under."""
        found = {"upstream": self.upstream, "proxy": self.proxy_process}
        if self.floor_process is not None:
            found["floor"] = self.floor_process
        if self.messages_process is not None:
            found["messages"] = self.messages_process
        if self.io_floor_process is not None:
            found["io_floor"] = self.io_floor_process
        return found

    def server_name(self, target: Target) -> str:
        """Whose CPU a target's requests cost: the upstream for DIRECT (it answers them
        itself), the proxy for PROXY, the floor translator for FLOOR, the Messages-upstream
        proxy for MESSAGES."""
        return "upstream" if target is self.direct else target.name

    def server_for(self, target: Target) -> Managed:
        """The process answering `target`."""
        return self.processes()[self.server_name(target)]

    def recording(self, key: str) -> AbstractAsyncContextManager[None]:
        if self.recorder is None or not key.endswith(".proxy"):
            return nullcontext()
        return self.recorder(key)

    def server_cpu_ms(self, key: str, target: Target, requests: int) -> float:
        """Server CPU milliseconds per request in the phase `key` (NaN without requests)."""
        spent = self.cpu.get(key, {}).get(f"{self.server_name(target)}_cpu_s", math.nan)
        return round(1000 * spent / requests, 3) if requests else math.nan


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (exact for the small samples used here)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@asynccontextmanager
async def accounted(bench: Bench, key: str) -> AsyncIterator[None]:
    """Record wall time and the CPU seconds of client, upstream and proxy for one phase."""
    async with bench.recording(key):
        before = cpu_reading(bench)
        try:
            yield
        finally:
            bench.cpu[key] = cpu_spent(before, cpu_reading(bench))


def cpu_reading(bench: Bench) -> dict[str, float]:
    """Wall clock and CPU seconds so far: client, each server and the whole machine."""
    reading = {"wall": time.perf_counter(), "client": time.process_time(),
               "machine": machine_busy_seconds()}
    for name, process in bench.processes().items():
        reading[name] = process.usage().cpu
    return reading


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Wall time, CPU seconds and busy % (100 = one core) between two readings. `other` is
    every other process on the machine: when it is high, the numbers are not to be trusted."""
    wall = after["wall"] - before["wall"]
    spent = {"wall_s": wall}
    ours = [name for name in before if name not in ("wall", "machine")]
    for name in ours:
        spent[f"{name}_cpu_s"] = after[name] - before[name]
    mine = sum(spent[f"{name}_cpu_s"] for name in ours)
    spent["other_cpu_s"] = max(0.0, after["machine"] - before["machine"] - mine)
    for name in (*ours, "other"):
        spent[f"{name}_busy_pct"] = 100 * spent[f"{name}_cpu_s"] / wall if wall else 0.0
    return {name: round(value, 4) for name, value in spent.items()}


async def gather_outcomes(jobs: list[Awaitable[Any]]) -> tuple[list[Any], list[str]]:
    """Results of the jobs that succeeded, and a message per failure."""
    outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    good = [o for o in outcomes if not isinstance(o, BaseException)]
    bad = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    return good, bad


def with_errors(result: Result, errors: list[str]) -> Result:
    result["errors"] = len(errors)
    if errors:
        result["first_error"] = errors[0][:300]
    return result


# ---------------------------------------------------------------- 1. non-streaming latency


async def nonstream_latency(bench: Bench) -> Result:
    """Sequential small non-streaming requests on one kept-alive connection."""
    count, warmup = bench.count(300, 5), bench.count(30, 3)
    result: Result = {"requests": count}
    for target in bench.targets():
        bench.log(f"  1. {count} sequential non-streaming requests ({target.name})")
        async with new_client() as client:
            for _ in range(warmup):
                await request_message(client, target, 8)
            latencies, errors = [], []
            async with accounted(bench, f"nonstream_latency.{target.name}"):
                for _ in range(count):
                    try:
                        latencies.append(await request_message(client, target, 8))
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
        result[target.name] = with_errors({
            "p50_ms": ms(percentile(latencies, 0.50)), "p99_ms": ms(percentile(latencies, 0.99)),
            "mean_ms": ms(statistics.fmean(latencies)) if latencies else math.nan,
            "server_cpu_ms": bench.server_cpu_ms(f"nonstream_latency.{target.name}", target,
                                                 len(latencies))}, errors)
    for stat in ("p50", "p99"):
        added = result["proxy"][f"{stat}_ms"] - result["direct"][f"{stat}_ms"]
        result[f"added_{stat}_ms"] = round(added, 3)
    return result


# ---------------------------------------------------------------- 2. first byte / first token


async def first_token(bench: Bench) -> Result:
    """Sequential short streams: time to response headers and to the first text delta."""
    count, chunks = bench.count(100, 5), 20
    result: Result = {"streams": count, "chunks": chunks}
    for target in bench.targets():
        bench.log(f"  2. {count} sequential streams, time to first byte/token ({target.name})")
        async with new_client() as client:
            for _ in range(bench.count(10, 2)):
                await request_stream(client, target, chunks)
            ttfb, ttft, errors = [], [], []
            async with accounted(bench, f"first_token.{target.name}"):
                for _ in range(count):
                    try:
                        timing = await request_stream(client, target, chunks)
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    ttfb.append(timing.ttfb)
                    ttft.append(timing.ttft)
        result[target.name] = with_errors({
            "ttfb_p50_ms": ms(percentile(ttfb, 0.5)), "ttfb_p99_ms": ms(percentile(ttfb, 0.99)),
            "ttft_p50_ms": ms(percentile(ttft, 0.5)), "ttft_p99_ms": ms(percentile(ttft, 0.99)),
            "server_cpu_ms": bench.server_cpu_ms(f"first_token.{target.name}", target,
                                                 len(ttft))}, errors)
    result["added_ttft_p50_ms"] = round(
        result["proxy"]["ttft_p50_ms"] - result["direct"]["ttft_p50_ms"], 3)
    return result


# ---------------------------------------------------------------- 3. one long stream


async def long_stream(bench: Bench) -> Result:
    """One stream of many chunks (20,000: a long answer), repeated a few times; the median
    rate is reported."""
    chunks, repeats = bench.count(20000, 50), 3
    result: Result = {"chunks": chunks, "repeats": repeats}
    for target in bench.targets():
        bench.log(f"  3. one stream of {chunks} chunks, x{repeats} ({target.name})")
        async with new_client() as client:
            await request_stream(client, target, max(10, chunks // 10))
            rates, errors = [], []
            async with accounted(bench, f"long_stream.{target.name}"):
                for _ in range(repeats):
                    try:
                        timing = await request_stream(client, target, chunks)
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    rates.append(chunks / timing.total)
        result[target.name] = with_errors({
            "chunks_per_s": round(statistics.median(rates), 1) if rates else math.nan,
            "best_chunks_per_s": round(max(rates), 1) if rates else math.nan}, errors)
    return result


# ---------------------------------------------------------------- 4. concurrent streams


async def concurrent_streams(bench: Bench, only: tuple[Target, ...] | None = None,
                             key: str = "concurrent_streams") -> Result:
    """Many streams at once; wall time from the first request to the last byte."""
    streams, chunks = bench.count(200, 2), bench.count(200, 10)
    result: Result = {"streams": streams, "chunks": chunks}
    for target in only or bench.targets():
        bench.log(f"  4. {streams} concurrent streams x {chunks} chunks ({target.name})")
        async with lanes(streams) as clients:
            # Open the connections first (client→server and proxy→upstream), so connection
            # setup is the same for both sides and is not what is measured.
            await gather_outcomes([request_stream(client, target, 1) for client in clients])
            async with accounted(bench, f"{key}.{target.name}"):
                started = time.perf_counter()
                timings, errors = await gather_outcomes(
                    [request_stream(client, target, chunks) for client in clients])
                wall = time.perf_counter() - started
        totals = [timing.total for timing in timings]
        result[target.name] = with_errors({
            "wall_s": round(wall, 4), "chunks_per_s": round(streams * chunks / wall, 1),
            "stream_p50_ms": ms(percentile(totals, 0.5)),
            "stream_p99_ms": ms(percentile(totals, 0.99))}, errors)
    return result


# ---------------------------------------------------------------- 5. idle-ish streams


class OpenCounter:
    """Counts streams that have shown their first text (or failed), to know when all are open."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen = 0
        self.all_open = asyncio.Event()

    def tick(self) -> None:
        self.seen += 1
        if self.seen >= self.expected:
            self.all_open.set()


async def idle_streams(bench: Bench) -> Result:
    """Many open streams from a slow upstream (one chunk every 0.5–1 s): memory per open
    stream and CPU of the server while they are all open. For DIRECT the server measured is
    the upstream itself, a floor to compare with."""
    streams = bench.count(1000, 10)
    duration = max(2.5, 10.0 * min(1.0, bench.scale))
    result: Result = {"streams": streams, "duration_s": duration}
    for target in bench.targets():
        bench.log(f"  5. {streams} concurrent idle-ish streams for ~{duration:.0f}s "
                  f"({target.name})")
        async with accounted(bench, f"idle_streams.{target.name}"):
            result[target.name] = await idle_run(bench, target, streams, duration)
    return result


async def idle_run(bench: Bench, target: Target, streams: int, duration: float) -> Result:
    server = bench.server_for(target)
    idle = server.usage()
    counter = OpenCounter(streams)
    rng = random.Random(42)

    async def one(client: httpx.AsyncClient) -> StreamTiming:
        interval = rng.uniform(0.5, 1.0)
        try:
            return await request_stream(client, target, max(2, int(duration / interval)),
                                        interval, on_first_text=counter.tick)
        except BaseException:
            counter.tick()
            raise

    async with lanes(streams) as clients:
        started = time.perf_counter()
        jobs = asyncio.gather(*(gather_outcomes([one(client)]) for client in clients))
        samples = await sample_while_open(server, counter, started, duration)
        outcomes = await jobs
        wall = time.perf_counter() - started
    errors = [error for _, bad in outcomes for error in bad]
    during = max(sample.rss_mib for sample in samples) if samples else math.nan
    return with_errors({
        "open_all_s": round(samples[0].at - started, 3) if samples else math.nan,
        "wall_s": round(wall, 3),
        "rss_idle_mib": round(idle.rss_mib, 2), "rss_during_mib": round(during, 2),
        "per_stream_kib": round((during - idle.rss_mib) * 1024 / streams, 2),
        "cpu_pct_while_open": round(cpu_percent(samples), 2)}, errors)


@dataclass(frozen=True)
class Sample:
    at: float
    rss_mib: float
    cpu: float


async def sample_while_open(server: Managed, counter: OpenCounter, started: float,
                            duration: float) -> list[Sample]:
    """Once every stream is open, sample the server's RSS and CPU until the first streams
    start finishing (a little before `duration` after the start)."""
    try:
        await asyncio.wait_for(counter.all_open.wait(), timeout=duration + 60)
    except TimeoutError:
        return []
    samples = []
    while True:
        usage: Usage = server.usage()
        now = time.perf_counter()
        samples.append(Sample(now, usage.rss_mib, usage.cpu))
        if now - started > duration * 0.8 and len(samples) >= 2:
            return samples
        await asyncio.sleep(0.2)


def cpu_percent(samples: list[Sample]) -> float:
    if len(samples) < 2 or samples[-1].at <= samples[0].at:
        return math.nan
    return 100 * (samples[-1].cpu - samples[0].cpu) / (samples[-1].at - samples[0].at)


# ---------------------------------------------------------------- 7. long conversations


SESSION_HEADER = "x-claude-code-session-id"
LONG_TOKENS = 8
"""Tokens in each answer: the phase measures the request, not the answer."""


LONG_ROUNDS = 4
"""Each side's requests are sent in this many rounds, taking turns with the other sides, so
that a change in the machine's speed during the phase falls on every side alike."""


async def long_conversation(bench: Bench) -> Result:
    """A Claude Code session's next turns: the recorded request grown by file-read turns to
    about 100 and 850 KB (bench/conversation.py), each request one turn longer than the last
    and sent with the session's header, non-streamed and streamed, to PROXY and FLOOR (DIRECT
    has no conversation to translate), the sides taking turns in rounds. Reported: server CPU
    per request, and its ratio. 40 requests a size (after 4 that pay the session's first
    parse and conversion): the conversation grows by 170 KB over them. IO_FLOOR, when
    running, takes its turn too: what reading the body and writing it upstream unchanged
    costs, the least any proxy on this stack pays for these bodies."""
    count, warmup = bench.count(40, 4), bench.count(4, 1)
    rounds = min(LONG_ROUNDS, count)
    result: Result = {"requests": count, "rounds": rounds, "sizes_kb": list(SIZES_KB)}
    session = {SESSION_HEADER: f"bench-long-{random.getrandbits(32):08x}"}
    sides = [target for target in bench.targets() if target is not bench.direct]
    if bench.io_floor is not None:
        sides.append(bench.io_floor)
    for size in SIZES_KB:
        for stream in (False, True):
            way = "stream" if stream else "nonstream"
            bodies = session_turns(size, warmup + count, spec(LONG_TOKENS, 0.0), stream)
            row: Result = {"kb": round(len(bodies[warmup]) / 1000, 1)}
            bench.log(f"  7. {count} {way} requests of {row['kb']} KB to each of "
                      f"{', '.join(t.name for t in sides)}, in {rounds} rounds")
            key = f"long_conversation.{size}.{way}"
            sent = [replace(target, headers={**target.headers, **session}) for target in sides]
            outcome = await _conversation(bench, sent, bodies, warmup, stream, rounds, key)
            for target, (done, errors) in zip(sides, outcome, strict=True):
                row[target.name] = with_errors(
                    {"server_cpu_ms": bench.server_cpu_ms(f"{key}.{target.name}", target,
                                                          done)}, errors)
            row["proxy_over_floor"] = _over(row, "proxy", "floor")
            if bench.io_floor is not None:
                row["io_floor_over_floor"] = _over(row, "io_floor", "floor")
            result[f"{size}kb_{way}"] = row
    return result


async def _conversation(bench: Bench, targets: list[Target], bodies: list[bytes],
                        warmup: int, stream: bool, rounds: int,
                        key: str) -> list[tuple[int, list[str]]]:
    """The session's requests to each target on its own connection, the first `warmup` not
    counted, the rest in `rounds` turns; each target's CPU summed over its turns."""
    async def send(client: httpx.AsyncClient, target: Target, body: bytes) -> None:
        if stream:
            await request_stream(client, target, LONG_TOKENS, body=body)
        else:
            await request_message(client, target, LONG_TOKENS, body=body)

    measured = bodies[warmup:]
    outcome: list[tuple[int, list[str]]] = [(0, []) for _ in targets]
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(new_client()) for _ in targets]
        for client, target in zip(clients, targets, strict=True):
            for body in bodies[:warmup]:
                await send(client, target, body)
        for turn in range(rounds):
            part = measured[turn * len(measured) // rounds:(turn + 1) * len(measured) // rounds]
            for index, (client, target) in enumerate(zip(clients, targets, strict=True)):
                done, errors = outcome[index]
                async with accounted(bench, f"{key}.r{turn}.{target.name}"):
                    for body in part:
                        try:
                            await send(client, target, body)
                            done += 1
                        except Exception as exc:
                            errors.append(f"{type(exc).__name__}: {exc}")
                outcome[index] = (done, errors)
    for target in targets:
        _merge_turns(bench, key, target.name, rounds)
    return outcome


def _merge_turns(bench: Bench, key: str, side: str, rounds: int) -> None:
    """One CPU entry for a side out of its rounds' entries: seconds summed, busy % again."""
    turns = [bench.cpu.pop(f"{key}.r{turn}.{side}") for turn in range(rounds)]
    merged = {name: sum(turn[name] for turn in turns)
              for name in turns[0] if not name.endswith("_busy_pct")}
    for name in [name for name in merged if name.endswith("_cpu_s")]:
        merged[name.removesuffix("_cpu_s") + "_busy_pct"] = (
            100 * merged[name] / merged["wall_s"] if merged["wall_s"] else 0.0)
    bench.cpu[f"{key}.{side}"] = {name: round(value, 4) for name, value in merged.items()}


def _over(row: Result, side: str, other: str) -> float:
    mine = row.get(side, {}).get("server_cpu_ms", math.nan)
    theirs = row.get(other, {}).get("server_cpu_ms", math.nan)
    return round(mine / theirs, 3) if theirs else math.nan
