"""Fixtures: the scripted upstream and real proxy servers, both uvicorn on loopback."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from claude_proxy.app import create_app
from claude_proxy.config import Settings
from tests.scripted_upstream import ScriptedUpstream, bind_loopback, serve_in_thread, stop_server

UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdef"
CLIENT_KEY = "sk-ant-client-secret-0123456789"
FIXTURES = Path(__file__).parent / "data" / "fixtures"


@dataclass
class ProxyServer:
    url: str
    settings: Settings
    server: uvicorn.Server


@pytest.fixture(scope="session")
def upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").reset()


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
        server, thread = serve_in_thread(create_app(settings), sock)
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server)
        proxy.thread = thread  # type: ignore[attr-defined]
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        stop_server(proxy.server, proxy.thread)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def proxy(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    return proxy_factory()


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))
