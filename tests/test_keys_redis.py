"""Team keys across replicas: two proxies on one real Redis keep one budget, whichever serves
the requests, and a Redis pause loses no spend (counted locally, added back after)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("claude_proxy.state.redis")

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app
from tests.conftest import (
    CLIENT_KEY,
    TEAM_KEYS,
    RedisServer,
    eventually,
    serving,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    completion,
    serve_in_thread,
    stop_server,
)
from tests.test_keys import ALPHA, FakeClock, config_text, openai_usage, priced

REQUEST = openai_usage(40_000, 8_000)
"""Each request's usage: 40,000 input and 8,000 output tokens on alpha, $0.24."""
COST = priced(ALPHA, 40_000, 8_000)
BUDGETED = """
[keys.carol]
key = "env:CAROL_PROXY_KEY"
budget_usd = {budget}
budget_period = "day"

[keys.alice]
key = "env:ALICE_PROXY_KEY"
"""


@pytest.fixture
def replicas(tmp_path: Path, upstream: ScriptedUpstream,
             redis_server: RedisServer) -> Iterator[Callable[..., list[str]]]:
    """Starts `count` replicas (two) on one Redis prefix; called again, more of the same
    fleet (a replica started later)."""
    servers: list[Any] = []
    prefix = f"keys-{uuid.uuid4().hex[:8]}:"
    clock = FakeClock()

    def start(budget: float, count: int = 2) -> list[str]:
        path = tmp_path / "proxy.toml"
        path.write_text(config_text(upstream, BUDGETED.format(budget=budget)))
        urls = []
        for _ in range(count):
            settings = Settings(log_file=str(tmp_path / "proxy.log"), anthropic_api_key=CLIENT_KEY,
                                redis_url=redis_server.url, redis_prefix=prefix,
                                data_dir=str(tmp_path / "unused"))
            config = load_config_file(path, settings, environ={
                "CAROL_PROXY_KEY": TEAM_KEYS["carol"], "ALICE_PROXY_KEY": TEAM_KEYS["alice"]})
            sock = bind_loopback()
            server, thread = serve_in_thread(create_app(settings, config=config, clock=clock),
                                             sock)
            servers.append((server, thread))
            urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
            assert eventually(lambda url=urls[-1]: serving(url))
        return urls

    yield start
    for server, _ in servers:
        server.should_exit = True
    for server, thread in servers:
        stop_server(server, thread)


def ask(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", headers={"x-api-key": key}, timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}]})


def spent(url: str, key: str) -> float:
    answer = httpx.get(f"{url}/v1/usage/me", headers={"x-api-key": key}, timeout=10).json()
    return float(answer["period_usd"])


def priced_replies(upstream: ScriptedUpstream) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        return completion({"content": "ok"}, usage=REQUEST)
    upstream.responder = respond


def test_a_budget_holds_across_two_replicas(replicas: Callable[[float], list[str]],
                                            upstream: ScriptedUpstream) -> None:
    """A budget of five requests' worth; both replicas serve one request at a time together
    (two in flight), and wait until each sees the other's spend before the next pair."""
    urls = replicas(5 * COST - 0.001)
    priced_replies(upstream)
    carol = TEAM_KEYS["carol"]
    served = 0
    with ThreadPoolExecutor(2) as pool:
        for _ in range(6):
            answers = list(pool.map(lambda url: ask(url, carol), urls))
            served += sum(answer.status_code == 200 for answer in answers)
            refused = [a for a in answers if a.status_code != 200]
            assert all(a.status_code == 429 and a.json()["error"]["type"] == "billing_error"
                       and a.headers["x-should-retry"] == "false" for a in refused)
            total = served * COST
            assert all(eventually(lambda url=url, total=total: abs(spent(url, carol) - total)
                                  < 1e-6) for url in urls)
    assert len(upstream.requests) == served
    assert 5 <= served <= 5 + 1, "the budget was exceeded by more than the requests in flight"
    # Both replicas answer usage for the fleet.
    rows = httpx.get(f"{urls[1]}/v1/usage", headers={"x-api-key": CLIENT_KEY}).json()["data"]
    assert [(r["key"], r["requests"]) for r in rows] == [("carol", served)]


def test_redis_paused_requests_are_served_counted_and_added_back(
        replicas: Callable[[float], list[str]], upstream: ScriptedUpstream,
        redis_server: RedisServer) -> None:
    first, second = replicas(100)
    priced_replies(upstream)
    alice = TEAM_KEYS["alice"]
    assert ask(first, alice).status_code == 200
    assert eventually(lambda: abs(spent(second, alice) - COST) < 1e-6)
    redis_server.pause()
    try:
        assert [ask(first, alice).status_code for _ in range(3)] == [200] * 3
        assert abs(spent(first, alice) - 4 * COST) < 1e-6, "counted locally"
    finally:
        redis_server.resume()
    # Added back: the other replica sees the three requests served while Redis was away.
    # A write that timed out as Redis stopped may still be applied when it resumes (SIGSTOP
    # keeps the bytes in the socket); sent again under the same batch id, it counts once.
    assert eventually(lambda: spent(second, alice) >= 4 * COST - 1e-6, timeout=30), \
        "the local spend was added back to Redis"
    assert abs(spent(second, alice) - 4 * COST) < 1e-6, "counted once"
    assert eventually(lambda: abs(spent(first, alice) - spent(second, alice)) < 1e-6)


def test_a_replica_started_after_the_budget_was_spent_refuses_at_once(
        replicas: Callable[..., list[str]], upstream: ScriptedUpstream) -> None:
    """Its first request already knows the fleet's spend (read as the store starts), not
    only after its first refresh: a restarted replica admitted a spent key for a second
    (`make soak` found 14 requests past the budget)."""
    first, = replicas(2 * COST - 0.001, count=1)
    priced_replies(upstream)
    carol = TEAM_KEYS["carol"]
    assert [ask(first, carol).status_code for _ in range(3)] == [200, 200, 429]
    assert eventually(lambda: abs(spent(first, carol) - 2 * COST) < 1e-6)
    later, = replicas(2 * COST - 0.001, count=1)
    refused = ask(later, carol)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "billing_error"
    assert len(upstream.requests) == 2
