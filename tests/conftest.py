"""Fixtures: the scripted upstream and real proxy servers, both uvicorn on loopback."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from claude_proxy.cli.command_line import http_protocol
from claude_proxy.config.settings import Settings
from claude_proxy.logs import LOG_FORMAT, RedactingFilter
from claude_proxy.server.app import create_app
from tests import secrets_scan
from tests.scripted_upstream import ScriptedUpstream, bind_loopback, serve_in_thread, stop_server
from tests.search_backend import SearchBackendServer

UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"
CLIENT_KEY = "sk-ant-client-secret-0123456789"
TEAM_KEYS = {name: f"sk-cp-{name}-secret-0123456789abcdef" for name in
             ("alice", "bob", "carol", "dave", "erin")}
"""Team keys of tests/test_keys.py: neither they nor their SHA-256 may appear anywhere."""
FIXTURES = Path(__file__).parent / "data" / "fixtures"


@dataclass
class ProxyServer:
    url: str
    settings: Settings
    server: uvicorn.Server
    app: FastAPI
    thread: threading.Thread


class SuiteRecord:
    """Every byte the proxies answered during the suite, and the suite's log file: the
    secrets scan reads both at the end (`pytest_sessionfinish`, tests/secrets_scan.py)."""

    responses: ClassVar[list[bytes]] = []
    log_file: ClassVar[Path | None] = None
    requests: ClassVar[list[tuple[str, dict[str, str]]]] = []
    """Every request's path and headers (e.g. to tell a client's retries from new requests)."""


class RecordingApp:
    """ASGI wrapper that keeps a copy of every response's headers and body."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            SuiteRecord.requests.append((scope["path"], {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in scope["headers"]}))

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                SuiteRecord.responses.append(b"\n".join(
                    name + b": " + value for name, value in message.get("headers", [])))
            elif message["type"] == "http.response.body":
                SuiteRecord.responses.append(bytes(message.get("body", b"")))
            await send(message)

        await self.app(scope, receive, recording_send)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The secrets scan, after every test has run (whatever their order, or their number):
    a secret in any response or log line fails the run."""
    if SuiteRecord.log_file is None or not SuiteRecord.log_file.exists():
        return
    problems = secrets_scan.scan(session, SuiteRecord.log_file.read_text(encoding="utf-8"),
                                 SuiteRecord.responses, [UPSTREAM_KEY, CLIENT_KEY],
                                 [*TEAM_KEYS.values()])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")  # after the progress line, which does not end in one
        reporter.write_line(f"secrets scan: {len(SuiteRecord.responses)} responses and the "
                            f"suite's log read; " + ("; ".join(problems) or "no secret found"),
                            red=bool(problems))
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def suite_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The whole suite logs at DEBUG into one file, through the production redaction filter."""
    path = tmp_path_factory.mktemp("suite-log") / "claude-proxy.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RedactingFilter([UPSTREAM_KEY, CLIENT_KEY]))
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    SuiteRecord.log_file = path
    yield path
    root.removeHandler(handler)
    root.setLevel(previous)
    handler.close()


@pytest.fixture(scope="session")
def upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def search_backend() -> Iterator[SearchBackendServer]:
    """The scripted search backend (SearXNG, Brave, Tavily and Exa shapes) on loopback."""
    server = SearchBackendServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").reset()
    if "search_backend" in request.fixturenames:
        request.getfixturevalue("search_backend").reset()


def proxy_settings(upstream: ScriptedUpstream, log_file: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url": upstream.base_url,
        "openai_api_key": UPSTREAM_KEY,
        "provider": "openai",
        "big_model": "big-upstream",
        "middle_model": "middle-upstream",
        "small_model": "small-upstream",
        "log_file": str(log_file),
        "retry_base_delay": 0,
        "max_retries": 2,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def proxy_factory(
    upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ProxyServer]]:
    """Start a proxy (a real uvicorn server) with settings overrides; stopped at the end."""
    started: list[ProxyServer] = []
    log_file = tmp_path_factory.mktemp("logs") / "claude-proxy.log"

    def start(**overrides: Any) -> ProxyServer:
        settings = proxy_settings(upstream, log_file, **overrides)
        sock = bind_loopback()
        app = create_app(settings)
        server, thread = serve_in_thread(RecordingApp(app), sock, http=http_protocol())
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server,
                            app, thread)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.server.should_exit = True
    for proxy in started:
        stop_server(proxy.server, proxy.thread)


@pytest.fixture(scope="session")
def proxy(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    return proxy_factory()


def eventually(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    """Wait (bounded) for a condition another thread brings about, e.g. a pool settling."""
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment for a `claude-proxy` subprocess, without any setting of the caller's
    that would change what is tested, and with its log in tmp_path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "BIG_", "MIDDLE_", "SMALL_", "TOOL_",
                                "REASONING_", "THINKING_", "PROVIDER", "WEB_SEARCH"))}
    env.update({"LOG_FILE": str(tmp_path / "logs" / "claude-proxy.log"),
                # SIGTERM stops at once, as before the drain (its own tests set it).
                "DRAIN_DELAY": "0", **extra})
    return env


def free_port() -> int:
    """A loopback port nobody listens on (a closed one, or one for a server to take)."""
    sock = bind_loopback()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def serving(url: str) -> bool:
    """Whether a server answers /health yet (it may still be binding its socket)."""
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


# ---------------------------------------------------------------- a real Redis


@dataclass
class RedisServer:
    """Debian's redis-server on a loopback port, persistence off unless `arguments` say
    otherwise (their `--dir` replaced by `directory`); tests pause, kill and restart it (on
    the same port) to see the proxy carry on without it."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    arguments: tuple[str, ...] = ("--save", "", "--appendonly", "no")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        pairs = zip(self.arguments[::2], self.arguments[1::2], strict=True)
        own = [item for name, value in pairs if name != "--dir" for item in (name, value)]
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", *own,
             "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert eventually(self.answers, timeout=30), "redis-server did not start"
        return self

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=15)
            self.process = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the test session (`make test` installs it: the `redis`
    target); each test keeps apart from the others with its own REDIS_PREFIX."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make redis)")
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis")).start()
    yield server
    if server.process is not None:
        server.resume()
    server.kill()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., tuple[str, subprocess.Popen[str]]]]:
    """Starts `claude-proxy` subprocesses (stopped at the end): returns its URL and process,
    with what it printed until it listened (`startup_output`) and after (`later_output`)."""
    processes: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str]) -> tuple[str, subprocess.Popen[str]]:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "claude_proxy", *args, "--host", "127.0.0.1", "--port",
             str(port)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        processes.append(process)
        assert process.stdout is not None
        output = []
        for line in process.stdout:
            output.append(line)
            if "Uvicorn running on" in line or "Finished server process" in line:
                break
        process.startup_output = "".join(output)  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}"
        process.later_output = []  # type: ignore[attr-defined]
        # Keep reading (the pipe must not fill up), and keep the lines for the test.
        threading.Thread(target=lambda: process.later_output.extend(  # type: ignore[attr-defined]
            iter(process.stdout.readline, "")), daemon=True).start()
        assert eventually(lambda: serving(url), timeout=30)
        return url, process

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=15)
