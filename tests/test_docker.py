"""The container without a Docker engine: read the Dockerfile, run its install and start
commands in a clean virtualenv, then hit /health and run its HEALTHCHECK command."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    joined = ROOT.joinpath("Dockerfile").read_text().replace("\\\n", " ")
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), " ".join(rest.split())))
    return pairs


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        found[-1].append((keyword, rest))
    return found


def test_dockerfile_shape() -> None:
    build, final = stages()
    assert build[0] == ("FROM", "python:3.11-slim AS build")
    assert final[0] == ("FROM", "python:3.11-slim")
    keywords = dict(final)
    assert keywords["USER"] == "proxy" and keywords["EXPOSE"] == "8082"
    assert "HEALTHCHECK" in keywords and "/health" in keywords["HEALTHCHECK"]
    assert keywords["ENTRYPOINT"] == '["claude-proxy"]' and keywords["CMD"] == '["serve"]'


def test_install_and_start_commands_in_a_clean_virtualenv(tmp_path: Path) -> None:
    build, final = stages()
    source, venv = tmp_path / "src", tmp_path / "venv"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for keyword, command in build:
        if keyword == "RUN":
            # Same commands; the pip cache is allowed here to keep the test fast.
            command = command.replace("/opt/venv", str(venv)).replace(" --no-cache-dir", "")
            command = command.replace("python -m venv", f"{sys.executable} -m venv")
            subprocess.run(command, shell=True, cwd=source, check=True, timeout=600,
                           stdout=subprocess.DEVNULL)

    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "OPENAI_API_KEY": "sk-docker-test"}
    for keyword, value in final:
        if keyword == "ENV":
            for pair in shlex.split(value):
                name, _, setting = pair.partition("=")
                env[name] = setting.replace("/opt/venv/bin:$PATH", env["PATH"])
    env["PORT"] = str(free_port())
    env["HOST"] = "127.0.0.1"
    env["LOG_FILE"] = str(tmp_path / "logs" / "claude-proxy.log")
    keywords = dict(final)
    command = [*json.loads(keywords["ENTRYPOINT"]), *json.loads(keywords["CMD"])]
    assert shutil.which(command[0], path=env["PATH"]).startswith(str(venv))  # type: ignore[union-attr]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "Uvicorn running on" in line:
                break
        threading.Thread(target=process.stdout.read, daemon=True).start()
        with urllib.request.urlopen(f"http://127.0.0.1:{env['PORT']}/health") as response:
            assert response.status == 200 and response.read() == b'{"status":"ok"}'
        healthcheck = keywords["HEALTHCHECK"].split(" CMD ", 1)[1]
        checked = subprocess.run(healthcheck, shell=True, env=env, timeout=30)
        assert checked.returncode == 0
        assert (tmp_path / "logs" / "claude-proxy.log").read_text().count("claude-proxy 0.1.0")
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_compose_and_kubernetes_examples() -> None:
    compose = ROOT.joinpath("docker-compose.yml").read_text()
    assert "env_file: .env.kimi" in compose and '"8082:8082"' in compose
    manifest = ROOT.joinpath("deploy", "kubernetes.yaml").read_text()
    assert manifest.count("httpGet: {path: /health, port: http}") == 2
    assert "readinessProbe" in manifest and "livenessProbe" in manifest
    assert "containerPort: 8082" in manifest and "runAsNonRoot: true" in manifest
    assert os.path.exists(ROOT / ".dockerignore")
