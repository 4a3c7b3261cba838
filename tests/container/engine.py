"""The container engine the test drives: a working `docker`, else `podman`.

A binary on PATH is not enough (this machine has a docker client and no daemon): an engine
counts when `ENGINE info` answers. Every flag that differs between the two lives here, so
the checks read the same for both.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The stand-in base can see the host's loopback through slirp4netns' gateway address.
SLIRP_HOST = "10.0.2.2"


class NoEngine(Exception):
    """No container engine can run here; the message says why, engine by engine."""


def run(command: list[str], timeout: float = 120, check: bool = False,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """One engine command, its output captured as text."""
    if stdin is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=check)
    completed = subprocess.run(command, capture_output=True, input=stdin, timeout=timeout,
                               check=check)
    return subprocess.CompletedProcess(command, completed.returncode,
                                       completed.stdout.decode(errors="replace"),
                                       completed.stderr.decode(errors="replace"))


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"


def ulimits() -> list[str]:
    """Explicit limits no higher than this process's own: the engine's defaults (1M open
    files, 4M processes) are refused where raising limits is not allowed."""
    flags = []
    for name, limit, cap in (("nofile", resource.RLIMIT_NOFILE, 65536),
                             ("nproc", resource.RLIMIT_NPROC, 16384)):
        hard = resource.getrlimit(limit)[1]
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


@dataclass
class Engine:
    name: str
    version: str
    runtime_flags: list[str] = field(default_factory=list)

    @property
    def podman(self) -> bool:
        return self.name == "podman"

    def __call__(self, *args: str, timeout: float = 120,
                 stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        return run([self.name, *args], timeout=timeout, stdin=stdin)

    def describe(self) -> str:
        runtime = f", {' '.join(self.runtime_flags)}" if self.runtime_flags else ""
        return f"{self.name} {self.version}{runtime}"

    def build_flags(self) -> list[str]:
        """podman: Docker image format (else HEALTHCHECK is dropped), the local base only,
        and the host's CA bundle for pip where TLS is inspected. Docker builds as is."""
        if not self.podman:
            return []
        flags = ["--format", "docker", "--pull=never", *self.runtime_flags, *ulimits()]
        if HOST_CA_BUNDLE.is_file():
            flags += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
        return flags

    def network_flags(self, publish: int | None) -> tuple[list[str], str]:
        """(run flags, the host's loopback as the container sees it) for a proxy reached
        from the host at 127.0.0.1:publish (None: a command that serves nothing).

        podman: the container's own network (slirp4netns), the port published on the host's
        127.0.0.1 and the host's loopback reachable at 10.0.2.2, so that no traffic leaves
        loopback. docker: the host's network, with the proxy listening on 127.0.0.1."""
        if self.podman:
            flags = [*self.runtime_flags, *ulimits(),
                     "--network", "slirp4netns:allow_host_loopback=true"]
            if publish is not None:
                flags += ["--publish", f"127.0.0.1:{publish}:8082"]
            return flags, SLIRP_HOST
        flags = ["--network", "host"]
        if publish is not None:
            flags += ["--env", "HOST=127.0.0.1", "--env", f"PORT={publish}"]
        return flags, "127.0.0.1"

    def inspect(self, kind: str, name: str) -> dict[str, Any]:
        result = self(kind, "inspect", name)
        if result.returncode != 0:
            return {}
        found = json.loads(result.stdout)
        return found[0] if found else {}


def probe(name: str) -> Engine | str:
    """The engine, or why it cannot be used."""
    if shutil.which(name) is None:
        return f"{name}: not installed"
    try:
        info = run([name, "info", "--format", "json"], timeout=60)
    except subprocess.TimeoutExpired:
        return f"{name}: `{name} info` did not answer in 60 s"
    if info.returncode != 0:
        return f"{name}: `{name} info` failed: {last_line(info)}"
    version = run([name, "version", "--format", "{{.Client.Version}}"]).stdout.strip()
    runtime = (["--runtime", "runc"] if name == "podman" and shutil.which("runc") else [])
    return Engine(name, version or "?", runtime)


def find_engine() -> Engine:
    """docker when its daemon answers, else podman; NoEngine says why neither can run."""
    reasons = []
    for name in ("docker", "podman"):
        found = probe(name)
        if isinstance(found, Engine):
            return found
        reasons.append(found)
    raise NoEngine("; ".join(reasons))
