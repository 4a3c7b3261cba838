"""The production install the benchmark measures: a venv holding `pip install .` and nothing
else (no editable install, no test extras; only FLOOR's SSE decoders beside, which the proxy
never imports), what `make run`, the container and every user get.

The dev venv is not what users run: the test extras pull in packages (sniffio, through the
anthropic SDK) that change the hot path of libraries which only look for them. The venv lives
in `.cache/bench-prod-venv` and is rebuilt when `pyproject.toml` or anything under `src/`
changes (a hash of them is stamped inside it). A lock keeps two benches (the smoke test and a
`make bench`) from building it at the same time.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.procs import ROOT, StartupError

VENV = ROOT / ".cache" / "bench-prod-venv"
FLOOR_NEEDS = ("httpx-sse>=0.4,<0.5",)
"""What FLOOR (bench/floor.py, run from this install) uses that the proxy does not: the
proxy reads SSE itself; FLOOR keeps the stack's decoders. Never imported by the proxy."""
STAMP = "claude-proxy-source.sha256"


def source_files(source: Path) -> Iterator[Path]:
    """What the installed package is built from."""
    yield source / "pyproject.toml"
    for path in sorted((source / "src").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def source_hash(source: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for path in source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def venv_for(source: Path, extras: str = "") -> Path:
    """This tree's production venv, or a separate one per other source tree (`--source`)
    and per extras (`otel`: the team column's)."""
    suffix = f"-{extras}" if extras else ""
    if source.resolve() == ROOT:
        return VENV.with_name(VENV.name + suffix)
    name = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:10]
    return VENV.with_name(f"{VENV.name}-{name}{suffix}")


def python_of(directory: Path) -> Path:
    return directory / "bin" / "python"


def production_python(log: Callable[[str], None], source: Path = ROOT,
                      extras: str = "") -> Path:
    """The interpreter of an up-to-date production venv of `source` (a checkout of
    claude-proxy; default this one) with `extras` (e.g. `otel`), (re)built first if
    needed."""
    directory = venv_for(source, extras)
    wanted = source_hash(source)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with (directory.parent / f"{directory.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = directory / STAMP
        if python_of(directory).exists() and stamp.exists() and stamp.read_text() == wanted:
            return python_of(directory)
        spec = f"{source.resolve()}[{extras}]" if extras else str(source.resolve())
        log(f"building the production install in {directory} "
            f"(pip install .{f'[{extras}]' if extras else ''})")
        shutil.rmtree(directory, ignore_errors=True)
        # From the base interpreter, not the dev venv's (venv uses sys._base_executable).
        venv.EnvBuilder(with_pip=True).create(directory)
        run = subprocess.run([str(python_of(directory)), "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", spec, *FLOOR_NEEDS],
                             capture_output=True, text=True, cwd=directory)
        if run.returncode != 0:
            shutil.rmtree(directory, ignore_errors=True)
            raise StartupError(f"pip install . failed in {directory}:\n"
                               f"{(run.stdout + run.stderr)[-3000:]}")
        stamp.write_text(wanted)
        return python_of(directory)


def installed_location(python: Path) -> str:
    """Where `python` imports claude_proxy from (to show it is not the source tree)."""
    run = subprocess.run([str(python), "-c", "import claude_proxy; print(claude_proxy.__file__)"],
                         capture_output=True, text=True, cwd=python.parent, timeout=60)
    return run.stdout.strip() or run.stderr.strip()[-300:]


def dev_python() -> Path:
    return Path(sys.executable)
