"""Optional profiling (`--profile DIR`): py-spy samples the proxy during each PROXY phase, and
the collapsed stacks are summed into hotspots (self time per function and per library), so a
bench run says not only how fast the proxy is but where its CPU goes.

py-spy runs outside the proxy with `--nonblocking` (no pauses: pausing biases samples toward
syscalls). The price is that some stacks are read torn, so only self (leaf) time is summarised
here; for call paths load DIR/<phase>.txt (collapsed stacks) into speedscope or flamegraph.pl.
Time spent in C (a socket write, orjson) is charged to the Python function that called it.
py-spy also takes CPU from the others on a small machine: a profiled run is not for comparison.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

# Library groups, matched against the file path of a frame (first match wins).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("claude_proxy (our code)", ("claude_proxy/",)),
    ("sse-starlette", ("sse_starlette/",)),
    # uvicorn[standard] serves with httptools; h11 is httpcore's parser (the upstream side).
    ("uvicorn/httptools", ("uvicorn/", "httptools/")),
    ("httpx/httpcore/h11/httpx-sse", ("httpx/", "httpcore/", "h11/", "httpx_sse/")),
    ("starlette/fastapi", ("starlette/", "fastapi/")),
    ("anyio/asyncio/uvloop", ("anyio/", "asyncio/", "uvloop/", "sniffio/")),
    ("pydantic", ("pydantic",)),
    ("logging", ("logging/",)),
)


def find_py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def group_of(path: str) -> str:
    for name, needles in GROUPS:
        if any(needle in path for needle in needles):
            return name
    return "other (stdlib, native)"


_LIBRARY_ROOT = re.compile(r".*(?:site-packages|/src|/lib/python3\.\d+)/")


def short_path(path: str) -> str:
    """`.../site-packages/httpcore/_async/http11.py` → `httpcore/_async/http11.py`."""
    return _LIBRARY_ROOT.sub("", path, count=1)


def parse_frame(frame: str) -> tuple[str, str]:
    """`func (path:line)` → (`func (short path)`, path)."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({short_path(path)})", path


class Hotspots:
    """Sample counts from py-spy's raw (collapsed stack) output."""

    def __init__(self, raw: str) -> None:
        self.total = 0
        self.self_time: Counter[str] = Counter()
        self.groups: Counter[str] = Counter()
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                self.add(stack.split(";"), int(count))

    def add(self, frames: list[str], count: int) -> None:
        self.total += count
        parsed = [parse_frame(frame) for frame in frames if " (" in frame]
        if not parsed:
            return
        leaf, leaf_path = parsed[-1]
        self.self_time[leaf] += count
        self.groups[group_of(leaf_path)] += count

    def pct(self, count: int) -> str:
        return f"{100 * count / self.total:5.1f}%" if self.total else "  -  "

    def render(self, top: int = 15) -> str:
        lines = [f"  samples: {self.total}", "  self time by library:"]
        lines += [f"    {self.pct(n)}  {name}" for name, n in self.groups.most_common()]
        lines.append(f"  top {top} functions by self time:")
        lines += [f"    {self.pct(n)}  {name}" for name, n in self.self_time.most_common(top)]
        return "\n".join(lines)


class Profiler:
    """Starts py-spy against the proxy for each PROXY phase and summarises what it saw."""

    def __init__(self, outdir: Path, log: Callable[[str], None], rate: int = 250) -> None:
        self.outdir = outdir
        self.log = log
        self.rate = rate
        self.pid = 0
        self.executable = find_py_spy()
        self.recorded: dict[str, Path] = {}
        if self.executable is None:
            log("warning: py-spy not found (pip install py-spy); --profile is ignored")

    def attach_to(self, pid: int) -> None:
        self.pid = pid
        self.outdir.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def record(self, phase: str) -> AsyncIterator[None]:
        """py-spy running against the proxy (and its workers) for the body of the block."""
        if self.executable is None or not self.pid:
            yield
            return
        out = self.outdir / f"{phase}.txt"
        log_path = self.outdir / f"{phase}.py-spy.log"
        with log_path.open("wb") as log_file:
            spy = subprocess.Popen(
                [self.executable, "record", "--pid", str(self.pid), "--format", "raw",
                 "--rate", str(self.rate), "--nonblocking", "--subprocesses", "-o", str(out)],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            await self._wait_started(log_path)
            try:
                yield
            finally:
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
        if out.exists():
            self.recorded[phase] = out
        else:
            self.log(f"warning: py-spy wrote nothing for {phase}; see {log_path}")

    @staticmethod
    async def _wait_started(log_path: Path, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"Sampling process" in log_path.read_bytes():
                return
            await asyncio.sleep(0.05)

    def summary(self) -> str:
        """Hotspots per profiled phase, also written to DIR/hotspots.txt."""
        parts = [f"proxy profile (py-spy, {self.rate} Hz; raw stacks in {self.outdir}):"]
        for phase, path in self.recorded.items():
            parts.append(f"[{phase}]\n{Hotspots(path.read_text()).render()}")
        text = "\n".join(parts)
        if self.recorded:
            (self.outdir / "hotspots.txt").write_text(text + "\n")
        return text
