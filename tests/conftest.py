"""Fixtures: the scripted upstream and real proxy servers, both uvicorn on loopback."""

from __future__ import annotations

import json
import logging
import os
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

from claude_proxy.app import create_app
from claude_proxy.config import Settings
from claude_proxy.logs import LOG_FORMAT, RedactingFilter
from tests.scripted_upstream import ScriptedUpstream, bind_loopback, serve_in_thread, stop_server
from tests.search_backend import SearchBackendServer

UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"
CLIENT_KEY = "sk-ant-client-secret-0123456789"
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
    secrets test reads both at the end (tests/test_zz_no_secrets.py)."""

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
        server, thread = serve_in_thread(RecordingApp(app), sock)
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
    env.update({"LOG_FILE": str(tmp_path / "logs" / "claude-proxy.log"), **extra})
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
