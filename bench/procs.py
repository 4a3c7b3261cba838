"""The benchmark's processes: the upstream and the proxy as real subprocesses, and their CPU
time and memory read from /proc (no psutil), summed over a process tree so a proxy running
several uvicorn workers is measured whole."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_KEY = "sk-bench-upstream-key"
CLIENT_KEY = "sk-ant-bench-client-key"
AS_USERS_RUN_IT = {"ANTHROPIC_API_KEY": CLIENT_KEY, "LOG_LEVEL": "INFO",
                   "CONTEXT_WINDOW": "1000000"}
"""The proxy of the main scenarios checks a client key and writes the INFO access log. Its
models get a window a long conversation fits in (1M tokens, as GPT-5.5, Kimi K3, GLM-5.3 and
DeepSeek V4 have; gpt-4o's 128k would refuse the long_conversation phase's 800 KB)."""


class StartupError(RuntimeError):
    """A subprocess did not come up; the message carries the tail of its output."""


class WorkersUnsupported(StartupError):
    """The proxy's CLI rejected `--workers`."""


# ---------------------------------------------------------------- /proc readings


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, found by scanning /proc (works without CONFIG_PROC_CHILDREN)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(children_of(current))
    return tree


def cpu_seconds(pid: int) -> float:
    """CPU time of one process, all its threads (0 if it is gone): the scheduler's own count
    in nanoseconds (`/proc/PID/task/*/schedstat`). The user + system times of /proc/PID/stat
    are sampled at each clock tick: a process that runs in sub-millisecond bursts is charged
    whole ticks or nothing, which moved a 0.35 s phase's figure by up to ±20% between runs.
    (Threads that ended are no longer counted; the servers measured keep theirs.)"""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    total = 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except (OSError, ValueError, IndexError):
            return _ticked_cpu_seconds(pid)  # no schedstat on this kernel
    return total / 1e9


def _ticked_cpu_seconds(pid: int) -> float:
    """User + system CPU time from /proc/PID/stat, in clock ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds spent by the whole machine (all cores, every process) since boot, from
    /proc/stat: set against our three processes it shows what else was running."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def load_average() -> float:
    """The 1-minute load average (how many runnable tasks, on average)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of one process, in KiB (zeros if it is gone)."""
    values = {"VmRSS": 0, "VmHWM": 0}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        name, _, value = line.partition(":")
        if name in values:
            values[name] = int(value.split()[0])
    return values


@dataclass(frozen=True)
class Usage:
    """One reading of a process tree: CPU seconds and memory in MiB."""

    cpu: float
    rss_mib: float
    hwm_mib: float
    """Peak RSS of the largest single process in the tree."""
    hwm_total_mib: float
    """Peak RSS summed over the tree (= hwm_mib with one worker)."""


def read_usage(pid: int) -> Usage:
    pids = process_tree(pid)
    memory = [memory_kib(p) for p in pids]
    return Usage(cpu=sum(cpu_seconds(p) for p in pids),
                 rss_mib=sum(m["VmRSS"] for m in memory) / 1024,
                 hwm_mib=max((m["VmHWM"] for m in memory), default=0) / 1024,
                 hwm_total_mib=sum(m["VmHWM"] for m in memory) / 1024)


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit toward the hard one (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else max(soft, min(hard, max(wanted, soft)))
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------- subprocesses


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """A minimal environment: the user's shell may set proxy variables or proxy settings
    (ANTHROPIC_API_KEY, BIG_MODEL, ...) that would change what is measured."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    # DRAIN_DELAY 0: a proxy stopped between phases closes at once (the default keeps serving
    # for 5 s after SIGTERM, for a load balancer to notice; the bench has none).
    env.update({"PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*", "DRAIN_DELAY": "0"})
    env.update(extra)
    return env


class Managed:
    """A subprocess with its output in a log file, stopped by pid on exit."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.url = ""
        self.log = log
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log_file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.process.pid

    def output_tail(self, lines: int = 20) -> str:
        self._log_file.flush()
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def usage(self) -> Usage:
        return read_usage(self.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()

    def __enter__(self) -> Managed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_upstream(workdir: Path, timeout: float = 15.0, module: str = "bench.upstream",
                   args: tuple[str, ...] = (), name: str = "upstream") -> Managed:
    """An upstream (the fast one unless `module` says otherwise) that prints `READY <port>`,
    its `url` set to its base URL (`http://127.0.0.1:P/v1`)."""
    log = workdir / f"{name}.log"
    upstream = Managed(name, [sys.executable, "-m", module, *args], clean_env({}), log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("READY "):
                upstream.url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
                return upstream
        if upstream.process.poll() is not None:
            break
        time.sleep(0.02)
    tail = upstream.output_tail()
    upstream.stop()
    raise StartupError(f"the upstream did not start:\n{tail}")


def start_proxy(workdir: Path, upstream_url: str, workers: int = 1,
                timeout: float = 30.0, env: dict[str, str] | None = None,
                name: str = "proxy", python: Path | None = None) -> Managed:
    """`python -m claude_proxy` as a real uvicorn process, its `url` set, run by `python`
    (the production install's interpreter; default this one) from `workdir`, so the source
    tree is not on its path. `--workers` is only passed for N > 1; a CLI that rejects it
    raises WorkersUnsupported. `env` adds settings (e.g. PROVIDER, MIDDLE_MODEL)."""
    port = free_port()
    argv = [str(python or sys.executable), "-m", "claude_proxy", "--host", "127.0.0.1",
            "--port", str(port)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    label = f"{name}-w{workers}"
    settings = clean_env({"OPENAI_API_KEY": UPSTREAM_KEY, "OPENAI_BASE_URL": upstream_url,
                          "PROVIDER": "openai", "LOG_LEVEL": "WARNING",
                          # Chat Completions models: the bench measures that path (the
                          # profile's default, a GPT-5 model, would take the Responses API).
                          "BIG_MODEL": "gpt-4o", "MIDDLE_MODEL": "gpt-4o",
                          "SMALL_MODEL": "gpt-4o-mini",
                          "LOG_FILE": str(workdir / f"{label}.log"), **(env or {})})
    proxy = Managed(label, argv, settings, workdir / f"{label}.out", cwd=workdir)
    proxy.url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proxy, timeout)
    except StartupError:
        proxy.stop()
        raise
    return proxy


def start_floor(workdir: Path, upstream_url: str, python: Path | None = None,
                timeout: float = 30.0, name: str = "floor",
                args: tuple[str, ...] = ()) -> Managed:
    """The FLOOR translator (`bench/floor.py`, run as a script by `python` from `workdir`, so
    it imports only the installed stack), its `url` set; `name` "io_floor": IO_FLOOR
    (`bench/io_floor.py`, given `args`)."""
    port = free_port()
    argv = [str(python or sys.executable), str(ROOT / "bench" / f"{name}.py"),
            "--port", str(port), "--upstream", upstream_url, *args]
    floor = Managed(name, argv, clean_env({}), workdir / f"{name}.out", cwd=workdir)
    floor.url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(floor, timeout)
    except StartupError:
        floor.stop()
        raise
    return floor


def wait_healthy(proxy: Managed, timeout: float) -> None:
    """Poll GET /health until it answers 200 (the proxy logs at WARNING, so no banner)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False, timeout=1.0) as client:
        while time.monotonic() < deadline:
            code = proxy.process.poll()
            if code is not None:
                tail = proxy.output_tail()
                if "--workers" in tail and "unrecognized arguments" in tail:
                    raise WorkersUnsupported(f"the proxy CLI does not accept --workers:\n{tail}")
                raise StartupError(f"{proxy.name} exited with {code}:\n{tail}")
            try:
                if client.get(f"{proxy.url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise StartupError(f"{proxy.name} did not become healthy in {timeout:.0f}s:\n"
                       f"{proxy.output_tail()}")
