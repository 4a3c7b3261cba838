"""Team keys: spend per key from the upstream's usage, budgets, rate limits, usage answers.

Real proxies (uvicorn on loopback) built from a config file with `[keys.NAME]` tables, in
front of the scripted upstream; the budget clock is a fake one the tests move.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.config.file import ConfigurationError, load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.keys.usage_log import FILE_NAME, SqliteUsageLog
from claude_proxy.routing.reach import check_budgets
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.server.app import create_app
from claude_proxy.ui.routes import COOKIE
from tests.claude_code_pin import claude_binaries
from tests.conftest import (
    CLIENT_KEY,
    TEAM_KEYS,
    UPSTREAM_KEY,
    ProxyServer,
    RecordingApp,
    SuiteRecord,
    eventually,
    serving,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    chunk,
    completion,
    serve_in_thread,
    stop_server,
    text_stream,
)

NOON = datetime(2026, 11, 25, 12, 0, 30, tzinfo=UTC).timestamp()
"""Wednesday 25 November 2026, 12:00:30 UTC: 30 s into a minute."""
ALPHA = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}
BETA = {"input": 0.5, "output": 1.5, "cache_read": 0.5, "cache_write": 0.5}
"""Beta sets no cache prices: they are its input price."""

PROVIDERS = """
[providers.alpha]
openai_base_url = "{url}"
openai_api_key = "{upstream_key}"
provider = "openai"
big_model = "alpha-big"
middle_model = "alpha-middle"
small_model = "alpha-small"
retry_base_delay = 0
max_retries = 0
price_input = 3.0
price_output = 15.0
price_cache_read = 0.3
price_cache_write = 3.75

[providers.beta]
openai_base_url = "{url}"
openai_api_key = "{upstream_key}"
provider = "openai"
retry_base_delay = 0
max_retries = 0

[providers.beta.models."beta-middle"]
price_input = 0.5
price_output = 1.5

[router]
default = "alpha,alpha-middle"
"""

KEYS = """
[keys.alice]
key = "env:ALICE_PROXY_KEY"
budget_usd = 100
budget_period = "month"

[keys.bob]
key_sha256 = "{bob_sha}"
providers = ["beta"]

[keys.carol]
key_sha256 = "{carol_sha}"
budget_usd = 1
budget_period = "day"

[keys.dave]
key_sha256 = "{dave_sha}"
rpm = 2
tpm = 5000
"""


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config_text(upstream: ScriptedUpstream, keys: str = KEYS) -> str:
    return (PROVIDERS.format(url=upstream.base_url, upstream_key=UPSTREAM_KEY)
            + keys.format(bob_sha=sha(TEAM_KEYS["bob"]), carol_sha=sha(TEAM_KEYS["carol"]),
                          dave_sha=sha(TEAM_KEYS["dave"])))


class FakeClock:
    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


class CountingApp:
    """Counts the Messages requests a proxy receives (retries included)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.messages = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/messages":
            self.messages += 1
        await self.app(scope, receive, send)


@dataclass
class KeyedProxy:
    server: ProxyServer
    clock: FakeClock
    counter: CountingApp
    data_dir: Path

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.server.should_exit = True
        stop_server(self.server.server, self.server.thread)


@pytest.fixture
def keyed(tmp_path: Path, upstream: ScriptedUpstream) -> Iterator[Callable[..., KeyedProxy]]:
    started: list[KeyedProxy] = []

    def start(clock: FakeClock | None = None, keys: str = KEYS) -> KeyedProxy:
        path = tmp_path / "proxy.toml"
        path.write_text(config_text(upstream, keys))
        settings = Settings(log_file=str(tmp_path / "proxy.log"), anthropic_api_key=CLIENT_KEY)
        config = load_config_file(path, settings, environ={"ALICE_PROXY_KEY": TEAM_KEYS["alice"]})
        clock = clock or FakeClock()
        counter = CountingApp(RecordingApp(create_app(settings, config=config, clock=clock)))
        sock = bind_loopback()
        server, thread = serve_in_thread(counter, sock)
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server,
                            counter.app.app, thread)
        assert eventually(lambda: serving(proxy.url))
        keyed_proxy = KeyedProxy(proxy, clock, counter, tmp_path / "data")
        started.append(keyed_proxy)
        return keyed_proxy

    yield start
    for proxy in started:
        if not proxy.server.server.should_exit:
            proxy.stop()


def ask(proxy: KeyedProxy, key: str, model: str = "claude-sonnet-4-6", stream: bool = False,
        text: str = "hi", session: str | None = None) -> httpx.Response:
    headers = {"x-api-key": key}
    if session:
        headers["x-claude-code-session-id"] = session
    body = {"model": model, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers, timeout=30)


def usage_of(proxy: KeyedProxy, key: str, **params: str) -> dict[str, Any]:
    response = httpx.get(f"{proxy.url}/v1/usage", params=params, headers={"x-api-key": key},
                         timeout=10)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def me(proxy: KeyedProxy, key: str) -> dict[str, Any]:
    response = httpx.get(f"{proxy.url}/v1/usage/me", headers={"x-api-key": key}, timeout=10)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def openai_usage(prompt: int, completion_tokens: int, read: int = 0,
                 written: int = 0) -> dict[str, Any]:
    """OpenRouter's shape: cache reads and writes inside prompt_tokens, listed apart."""
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written}}


def priced(prices: dict[str, float], prompt: int, output: int, read: int = 0,
           written: int = 0) -> float:
    """The test's own arithmetic: uncached input, output, cache reads, cache writes."""
    return (prices["input"] * (prompt - read - written) + prices["output"] * output
            + prices["cache_read"] * read + prices["cache_write"] * written) / 1e6


# ---------------------------------------------------------------- spend per key


def test_two_keys_two_prices_streamed_and_not_and_an_aborted_stream(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    alice, bob = TEAM_KEYS["alice"], TEAM_KEYS["bob"]
    upstream.queue(
        completion({"content": "a1"}, usage=openai_usage(200_000, 50_000, read=120_000,
                                                          written=30_000)),
        text_stream(["a", "2"], usage=openai_usage(90_000, 7_000, read=10_000)),
        completion({"content": "b1"}, usage=openai_usage(400_000, 300_000)),
        text_stream(["b", "2"], usage=openai_usage(1_000_000, 20_000, read=600_000)))
    assert ask(proxy, alice).json()["content"][0]["text"] == "a1"
    streamed_alice = ask(proxy, alice, stream=True)
    assert '"text":"a"' in streamed_alice.text and '"text":"2"' in streamed_alice.text
    assert ask(proxy, bob, model="beta,beta-middle").json()["content"][0]["text"] == "b1"
    streamed = ask(proxy, bob, model="beta,beta-middle", stream=True)
    assert streamed.status_code == 200 and '"output_tokens":20000' in streamed.text
    assert [r["model"] for r in upstream.requests] == ["alpha-middle"] * 2 + ["beta-middle"] * 2

    alice_cost = (priced(ALPHA, 200_000, 50_000, 120_000, 30_000)
                  + priced(ALPHA, 90_000, 7_000, 10_000))
    bob_cost = priced(BETA, 400_000, 300_000) + priced(BETA, 1_000_000, 20_000, 600_000)
    assert round(alice_cost, 2) == 1.40 and round(bob_cost, 2) == 1.18
    by_key = {row["key"]: row for row in usage_of(proxy, CLIENT_KEY)["data"]}
    assert round(by_key["alice"]["cost_usd"], 2) == round(alice_cost, 2)
    assert abs(by_key["alice"]["cost_usd"] - alice_cost) < 1e-6
    assert abs(by_key["bob"]["cost_usd"] - bob_cost) < 1e-6
    assert by_key["alice"]["cache_read_input_tokens"] == 130_000
    assert by_key["alice"]["cache_creation_input_tokens"] == 30_000
    assert by_key["bob"]["requests"] == 2 and by_key["bob"]["output_tokens"] == 320_000

    # An aborted stream: 40,000 characters arrive, the client leaves; the upstream never sent
    # its usage, so the estimate of the output so far (4 characters a token) is charged.
    text = "x" * 40_000
    upstream.queue(Reply(events=[chunk({"role": "assistant", "content": ""}),
                                 chunk({"content": text})], stall_at=3))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}
    with httpx.stream("POST", f"{proxy.url}/v1/messages", json=body,
                      headers={"x-api-key": alice}, timeout=30) as response:
        seen = ""
        for piece in response.iter_text():
            seen += piece
            if text in seen:
                break
    aborted = priced(ALPHA, estimate_request_tokens(body), 10_000)
    assert eventually(lambda: abs(me(proxy, alice)["period_usd"]
                                  - (alice_cost + aborted)) < 1e-6)
    assert upstream.wait_until_idle()
    row = next(r for r in usage_of(proxy, alice)["data"])
    assert row["requests"] == 3 and row["output_tokens"] == 57_000 + 10_000

    metrics = httpx.get(f"{proxy.url}/metrics", headers={"x-api-key": CLIENT_KEY}).text
    line = next(line for line in metrics.splitlines() if line.startswith(
        'claude_proxy_cost_usd_total{key="bob"'))
    assert line.startswith('claude_proxy_cost_usd_total{key="bob",model="beta-middle",'
                           'provider="beta"} ')
    assert abs(float(line.split()[-1]) - bob_cost) < 1e-6


def test_a_key_sees_only_itself_and_the_administrator_sees_all(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    alice, bob = TEAM_KEYS["alice"], TEAM_KEYS["bob"]
    upstream.queue(completion({"content": "x"}, usage=openai_usage(1000, 100)),
                   completion({"content": "y"}, usage=openai_usage(2000, 200)),
                   completion({"content": "z"}, usage=openai_usage(10, 1)))
    assert ask(proxy, alice, session="session-a").status_code == 200
    assert ask(proxy, bob, model="beta,beta-middle", session="session-b").status_code == 200
    assert ask(proxy, CLIENT_KEY).status_code == 200

    mine = usage_of(proxy, bob, group_by="session")
    assert mine["key"] == "bob"
    assert [(r["session"], r["requests"], r["input_tokens"]) for r in mine["data"]] == [
        ("session-b", 1, 2000)]
    every = usage_of(proxy, CLIENT_KEY, group_by="key")
    assert [(r["key"], r["requests"]) for r in every["data"]] == [
        ("admin", 1), ("alice", 1), ("bob", 1)]
    assert every["total"]["input_tokens"] == 3010
    by_model = usage_of(proxy, CLIENT_KEY, group_by="model")["data"]
    assert [r["model"] for r in by_model] == ["alpha-middle", "beta-middle"]
    by_day = usage_of(proxy, alice, group_by="day", **{"from": "2026-11-25", "to": "2026-11-25"})
    assert [(r["day"], r["requests"]) for r in by_day["data"]] == [("2026-11-25", 1)]
    assert usage_of(proxy, alice, **{"from": "2026-11-26"})["data"] == []

    assert me(proxy, bob) == {"key": "bob", "today_usd": round(priced(BETA, 2000, 200), 6),
                              "period": "month", "period_usd": round(priced(BETA, 2000, 200), 6),
                              "budget_usd": None, "remaining_usd": None,
                              "resets_at": "2026-12-01T00:00:00Z", "rpm": None, "tpm": None}
    # Bob may use beta only: the default route (alpha) is refused before anything is sent.
    refused = ask(proxy, bob)
    assert refused.status_code == 403
    assert refused.json() == {"type": "error", "error": {
        "type": "permission_error",
        "message": "key bob may not use alpha,alpha-middle (default)"}}
    assert len(upstream.requests) == 3

    wrong = ask(proxy, "sk-cp-revoked-or-wrong")
    assert wrong.status_code == 401
    assert wrong.json() == {"type": "error", "error": {"type": "authentication_error",
                                                       "message": "invalid x-api-key"}}
    unauthorized = httpx.get(f"{proxy.url}/v1/usage", headers={"x-api-key": "nope"})
    assert unauthorized.status_code == 401
    # The dashboard and /metrics stay the administrator's.
    assert httpx.get(f"{proxy.url}/metrics", headers={"x-api-key": alice}).status_code == 401

    log = (SuiteRecord.log_file.read_text(encoding="utf-8")
           if SuiteRecord.log_file is not None else "")
    assert " key=alice session=session-a agent=- provider=alpha route=default " in log
    assert " key=bob session=session-b agent=- provider=beta route=explicit " in log


def test_usage_groups_by_claude_codes_request_class_and_prompt(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    """The gateway hints reach /v1/usage; a value that is not a known class (or not
    id-shaped) is `?`, never shown as sent."""
    proxy = keyed()
    upstream.queue(*(completion({"content": "x"}, usage=openai_usage(100, 10))
                     for _ in range(4)))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}]}
    for request_class, prompt in (("main", "p-1"), ("main", "p-1"), ("auxiliary", "p-2"),
                                  ("<b>main</b>", "a b")):
        response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30, headers={
            "x-api-key": TEAM_KEYS["alice"], "x-claude-code-request-class": request_class,
            "x-claude-code-prompt-id": prompt})
        assert response.status_code == 200
    by_class = usage_of(proxy, TEAM_KEYS["alice"], group_by="request_class")["data"]
    assert [(r["request_class"], r["requests"], r["input_tokens"]) for r in by_class] == [
        ("?", 1, 100), ("auxiliary", 1, 100), ("main", 2, 200)]
    by_prompt = usage_of(proxy, CLIENT_KEY, group_by="prompt_id")["data"]
    assert [(r["prompt_id"], r["requests"]) for r in by_prompt] == [
        ("?", 1), ("p-1", 2), ("p-2", 1)]


# ---------------------------------------------------------------- budgets and limits


BUDGET_MESSAGE = ("Usage budget reached: the budget of $1.00 per day for key carol is spent "
                  "($1.05); it resets at 2026-11-26 00:00 UTC")


def spend_carols_budget(proxy: KeyedProxy, upstream: ScriptedUpstream) -> None:
    """One request of $1.0485 against carol's $1.00 a day: admitted (the budget was not yet
    reached), so the spend overshoots by that request."""
    upstream.queue(completion({"content": "c1"}, usage=openai_usage(200_000, 50_000,
                                                                      read=120_000,
                                                                      written=30_000)))
    assert ask(proxy, TEAM_KEYS["carol"]).status_code == 200


def test_a_spent_budget_gets_the_billing_error_and_the_upstream_nothing(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    spend_carols_budget(proxy, upstream)
    sent = len(upstream.requests)
    for stream in (False, True):
        refused = ask(proxy, TEAM_KEYS["carol"], stream=stream)
        assert refused.status_code == 429
        assert refused.headers["x-should-retry"] == "false"
        assert refused.json() == {"type": "error", "error": {"type": "billing_error",
                                                             "message": BUDGET_MESSAGE}}
    assert len(upstream.requests) == sent
    assert me(proxy, TEAM_KEYS["carol"])["remaining_usd"] == 0.0
    assert proxy.counter.messages == 3

    # At the end of the day (UTC) the key works again.
    proxy.clock.now = datetime(2026, 11, 26, 0, 0, 0, tzinfo=UTC).timestamp()
    upstream.queue(completion({"content": "new day"}, usage=openai_usage(10, 1)))
    again = ask(proxy, TEAM_KEYS["carol"])
    assert again.status_code == 200 and again.json()["content"][0]["text"] == "new day"
    assert me(proxy, TEAM_KEYS["carol"])["resets_at"] == "2026-11-27T00:00:00Z"


def test_a_key_with_a_budget_may_not_name_an_unpriced_model(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    refused = ask(proxy, TEAM_KEYS["carol"], model="beta,beta-big")
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "type": "permission_error",
        "message": "key carol may not use beta,beta-big (explicit) (a key with a budget uses "
                   "priced models only)"}
    assert upstream.requests == []
    upstream.queue(completion({"content": "free to try"}, usage=openai_usage(10, 1)))
    allowed = ask(proxy, TEAM_KEYS["dave"], model="beta,beta-big")  # no budget: no price needed
    assert allowed.json()["content"][0]["text"] == "free to try"


def test_rpm_limit_answers_429_with_retry_after(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    dave = TEAM_KEYS["dave"]
    assert [ask(proxy, dave).status_code for _ in range(2)] == [200, 200]
    refused = ask(proxy, dave)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "30"
    assert refused.json() == {"type": "error", "error": {
        "type": "rate_limit_error",
        "message": "key dave is over its limit of 2 requests per minute; retry in 30 s"}}
    assert len(upstream.requests) == 2
    proxy.clock.now += 30
    assert ask(proxy, dave).status_code == 200


def test_tpm_limit_counts_the_tokens_of_the_minute(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    dave = TEAM_KEYS["dave"]
    upstream.queue(completion({"content": "big"}, usage=openai_usage(4000, 1000)))
    assert ask(proxy, dave).status_code == 200
    refused = ask(proxy, dave)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
    assert refused.json()["error"] == {
        "type": "rate_limit_error",
        "message": "key dave is over its limit of 5000 tokens per minute; retry in 30 s"}
    assert len(upstream.requests) == 1
    proxy.clock.now += 30
    assert ask(proxy, dave).status_code == 200


def test_spend_survives_a_restart_without_redis(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    first = keyed()
    spend_carols_budget(first, upstream)
    first.stop()
    assert stat.S_IMODE(first.data_dir.stat().st_mode) == 0o700
    assert (first.data_dir / "usage.sqlite3").is_file()

    second = keyed()
    refused = ask(second, TEAM_KEYS["carol"])
    assert refused.status_code == 429
    assert refused.json()["error"]["message"] == BUDGET_MESSAGE
    rows = usage_of(second, CLIENT_KEY)["data"]
    assert [(r["key"], r["requests"], r["cost_usd"]) for r in rows] == [("carol", 1, 1.0485)]


def test_a_usage_file_of_the_first_schema_gains_the_class_and_prompt_id_columns(
        tmp_path: Path) -> None:
    """DATA_DIR written before the gateway hints: its rows stay, new ones carry the hints."""
    old = sqlite3.connect(tmp_path / FILE_NAME)
    old.execute("CREATE TABLE usage (ts REAL, key TEXT, provider TEXT, model TEXT, route TEXT, "
                "session TEXT, agent TEXT, input INTEGER, output INTEGER, cache_read INTEGER, "
                "cache_write INTEGER, cost_usd REAL)")
    old.execute("INSERT INTO usage VALUES (1, 'alice', 'p', 'm', 'default', '-', '-', 10, 1, "
                "0, 0, 0.5)")
    old.commit()
    old.close()
    log = SqliteUsageLog(tmp_path)
    try:
        log.record({"ts": 2, "key": "bob", "provider": "p", "model": "m", "route": "background",
                    "session": "s", "agent": "-", "input": 5, "output": 1, "cache_read": 0,
                    "cache_write": 0, "cost_usd": 0.25, "request_class": "auxiliary",
                    "prompt_id": "p-1"})
        rows = asyncio.run(log.entries(0, 10))
    finally:
        log.close()
    assert [(r["key"], r["request_class"], r["prompt_id"], r["cost_usd"]) for r in rows] == [
        ("alice", None, None, 0.5), ("bob", "auxiliary", "p-1", 0.25)]


# ---------------------------------------------------------------- configuration


def test_a_budget_on_a_key_reaching_an_unpriced_model_stops_the_start(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    keys = ('[keys.erin]\nkey_sha256 = "' + sha(TEAM_KEYS["erin"])
            + '"\nbudget_usd = 5\n')
    text = config_text(upstream, keys).replace('default = "alpha,alpha-middle"',
                                               'default = "alpha,alpha-middle"\n'
                                               'fallback = ["beta,beta-big"]')
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        check_budgets(load_config_file(path, Settings()))
    assert str(caught.value) == (
        f"{path}: [keys.erin] has a budget, but model 'beta-big' of provider 'beta' has no "
        f"price: set price_input and price_output in [providers.beta.models.\"beta-big\"]")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env["LOG_FILE"] = str(tmp_path / "cli.log")
    run = subprocess.run([sys.executable, "-m", "claude_proxy", "--config", str(path)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "model 'beta-big' of provider 'beta' has no price" in run.stderr


@pytest.mark.parametrize(("table", "message"), [
    ('key = "sk-cp-written-in-the-file"',
     '[keys.erin] key: expected "env:VARIABLE" (a key is never written in the file; use '
     'key_sha256 for its hash)'),
    ('key = "env:UNSET_PROXY_KEY_VARIABLE"',
     "[keys.erin] key: environment variable UNSET_PROXY_KEY_VARIABLE is not set"),
    ('key_sha256 = "abc"',
     "[keys.erin] key_sha256: expected 64 hex digits (claude-proxy keys new NAME prints one)"),
    (f'key_sha256 = "{"0" * 64}"\nbudget_period = "year"',
     "[keys.erin] budget_period: expected one of day, week, month"),
    (f'key_sha256 = "{"0" * 64}"\nproviders = ["gamma"]',
     "[keys.erin] providers: unknown provider 'gamma' (configured: alpha, beta)"),
    (f'key_sha256 = "{"0" * 64}"\nrpm = 0', "[keys.erin] rpm: expected a whole number >= 1"),
    (f'key_sha256 = "{"0" * 64}"\nbudget = 5',
     "[keys.erin] budget: not a key setting (one of key, key_sha256, providers, routes, "
     "budget_usd, budget_period, rpm, tpm)"),
])
def test_a_wrong_key_table_names_the_setting(tmp_path: Path, upstream: ScriptedUpstream,
                                             table: str, message: str) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(config_text(upstream, f"[keys.erin]\n{table}\n"))
    with pytest.raises(ConfigurationError) as caught:
        load_config_file(path, Settings(), environ={})
    assert str(caught.value) == f"{path}: {message}"


def test_calendar_periods_in_utc() -> None:
    from claude_proxy.keys.budget import period_bounds

    def bounds(period: Any, when: datetime) -> tuple[str, str]:
        start, end = period_bounds(period, when.timestamp())
        return start.isoformat(), end.isoformat()

    late = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert bounds("day", late) == ("2026-12-31T00:00:00+00:00", "2027-01-01T00:00:00+00:00")
    assert bounds("week", late) == ("2026-12-28T00:00:00+00:00", "2027-01-04T00:00:00+00:00")
    assert bounds("month", late) == ("2026-12-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00")
    assert bounds("month", datetime(2028, 2, 29, 12, tzinfo=UTC)) == (
        "2028-02-01T00:00:00+00:00", "2028-03-01T00:00:00+00:00")


def test_keys_new_prints_a_key_and_the_table_of_its_hash() -> None:
    run = subprocess.run([sys.executable, "-m", "claude_proxy", "keys", "new", "frank"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    key = lines[1].strip("# ").strip()
    assert key.startswith("sk-cp-") and len(key) > 40
    assert lines[3] == "[keys.frank]"
    assert lines[4] == f'key_sha256 = "{sha(key)}"'


def test_usage_table_and_statusline_commands(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    spend_carols_budget(proxy, upstream)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_BASE_URL=proxy.url, ANTHROPIC_API_KEY=TEAM_KEYS["carol"])
    session = json.dumps({"session_id": "s1", "model": {"id": "claude-sonnet-4-6",
                                                        "display_name": "Sonnet 4.6"}})
    line = subprocess.run([sys.executable, "-m", "claude_proxy", "statusline"], env=env,
                          input=session, capture_output=True, text=True, timeout=60)
    assert line.returncode == 0, line.stderr
    assert line.stdout == "Sonnet 4.6 · carol: today $1.05 · $0.00 of $1.00 left this day\n"

    env["ANTHROPIC_API_KEY"] = CLIENT_KEY
    table = subprocess.run([sys.executable, "-m", "claude_proxy", "usage"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1:] == [
        "key    requests  input  output  cache read  cache write  cost USD",
        "carol         1  50000   50000      120000        30000    1.0485",
        "total         1  50000   50000      120000        30000    1.0485"]


def test_without_keys_the_client_key_works_as_before(proxy: ProxyServer,
                                                    upstream: ScriptedUpstream) -> None:
    """No `[keys]` table: no usage endpoint, no DATA_DIR, the one key of old."""
    answer = httpx.post(f"{proxy.url}/v1/messages", json={
        "model": "claude-sonnet-4-6", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert answer.status_code == 200
    assert httpx.get(f"{proxy.url}/v1/usage").status_code == 404


# ---------------------------------------------------------------- with real Claude Code


CLAUDE_BINARIES = claude_binaries()
"""The pinned Claude Code (CLAUDE_BIN, else the Makefile's pin) and the newest when another
release is installed (tests/claude_code_pin.py)."""


@pytest.mark.claude_code
@pytest.mark.parametrize("which", sorted(CLAUDE_BINARIES))
def test_claude_code_stops_at_the_budget_without_retrying(
        which: str, tmp_path: Path, keyed: Callable[..., KeyedProxy],
        upstream: ScriptedUpstream) -> None:
    binary = CLAUDE_BINARIES[which]
    if not os.access(binary, os.X_OK):
        pytest.skip(f"Claude Code ({which}) not installed at {binary}")
    proxy = keyed()
    spend_carols_budget(proxy, upstream)
    sent, received = len(upstream.requests), proxy.counter.messages
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "TMPDIR": str(tmp_path), "ANTHROPIC_BASE_URL": proxy.url,
           "ANTHROPIC_API_KEY": TEAM_KEYS["carol"], "ANTHROPIC_MODEL": "claude-sonnet-4-6",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}  # retries left at their default
    run = subprocess.run([str(binary), "-p", "say hi", "--output-format", "stream-json",
                          "--verbose", "--no-session-persistence"], env=env, cwd=work,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    result = lines[-1]
    assert result["type"] == "result" and result["is_error"] is True, run.stdout
    assert BUDGET_MESSAGE in result["result"]
    assert len(upstream.requests) == sent
    assert proxy.counter.messages == received + 1, "Claude Code retried"


# ---------------------------------------------------------------- the dashboard


CHROMIUM = os.environ.get("CHROMIUM") or "/usr/bin/chromium"


def dashboard_cookie(proxy: KeyedProxy) -> str:
    signed_in = httpx.post(f"{proxy.url}/ui/login", data={"key": CLIENT_KEY, "next": "/ui"},
                           follow_redirects=False)
    assert signed_in.status_code == 303
    return str(signed_in.cookies[COOKIE])


def test_dashboard_feed_carries_keys_and_costs_never_a_key(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    proxy = keyed()
    spend_carols_budget(proxy, upstream)
    with httpx.stream("GET", f"{proxy.url}/ui/feed", timeout=10,
                      cookies={COOKIE: dashboard_cookie(proxy)}) as feed:
        lines = feed.iter_lines()
        assert next(lines) == "event: hello"
        hello = json.loads(next(lines)[6:])
    carol = next(k for k in hello["keys"] if k["name"] == "carol")
    assert carol == {"name": "carol", "period": "day", "spent": 1.0485, "budget": 1.0,
                     "resets": datetime(2026, 11, 26, tzinfo=UTC).timestamp(),
                     "today": 1.0485, "rpm": None, "tpm": None}
    assert [k["name"] for k in hello["keys"]] == ["alice", "bob", "carol", "dave"]
    row = hello["requests"][-1]
    assert (row["key"], row["cost"]) == ("carol", 1.0485)


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="chromium not installed")
def test_dashboard_shows_the_keys_panel_and_the_cost_column(
        keyed: Callable[..., KeyedProxy], upstream: ScriptedUpstream) -> None:
    from playwright.sync_api import sync_playwright

    proxy = keyed()
    spend_carols_budget(proxy, upstream)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.add_cookies([{"name": COOKIE, "value": dashboard_cookie(proxy),
                              "url": proxy.url}])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{proxy.url}/ui")
        page.wait_for_selector('body[data-ready="true"]')
        carol = '#keys .key[data-key="carol"]'
        assert page.is_visible("#keys-panel")
        assert page.inner_text(f"{carol} .name") == "carol"
        assert page.inner_text(f"{carol} .stats") == "$1.05 of $1.00 this day"
        assert page.get_attribute(f"{carol} progress", "value") == "1.000"
        assert "spent" in (page.get_attribute(carol, "class") or "")
        assert page.inner_text("#requests tbody tr .c-cost") == "$1.05"
        assert page.inner_text("#requests tbody tr .c-key") == "carol"
        assert page.is_visible("#requests th.c-cost") and page.is_visible("#keys-panel")
        assert errors == []
        shots = Path(__file__).resolve().parents[1] / ".cache" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "keys-panel.png"))  # for a look (not committed)
        browser.close()


def test_the_start_line_counts_the_keys_and_names_none(tmp_path: Path,
                                                      upstream: ScriptedUpstream) -> None:
    from claude_proxy.cli.command_line import startup_line

    path = tmp_path / "proxy.toml"
    path.write_text(config_text(upstream))
    config = load_config_file(path, Settings(),
                              environ={"ALICE_PROXY_KEY": TEAM_KEYS["alice"]})
    line = startup_line(config, "127.0.0.1", 8082, 1)
    assert "; client key required (4 team keys); " in line
    assert TEAM_KEYS["alice"] not in line and sha(TEAM_KEYS["bob"]) not in line
    assert TEAM_KEYS["alice"] in config.secrets(), "redacted from the logs"


def test_an_unwritable_data_dir_is_said_once_and_requests_still_served(
        tmp_path: Path, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    path = tmp_path / "proxy.toml"
    path.write_text(config_text(upstream))
    settings = Settings(log_file=str(tmp_path / "proxy.log"), anthropic_api_key=CLIENT_KEY,
                        data_dir=str(blocked / "data"))
    config = load_config_file(path, settings, environ={"ALICE_PROXY_KEY": TEAM_KEYS["alice"]})
    sock = bind_loopback()
    server, thread = serve_in_thread(create_app(settings, config=config, clock=FakeClock()),
                                     sock)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert eventually(lambda: serving(url))
        upstream.queue(completion({"content": "still here"}, usage=openai_usage(10, 1)))
        answer = httpx.post(f"{url}/v1/messages", headers={"x-api-key": TEAM_KEYS["alice"]},
                            json={"model": "claude-sonnet-4-6", "max_tokens": 10,
                                  "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        assert answer.json()["content"][0]["text"] == "still here"
    finally:
        server.should_exit = True
        stop_server(server, thread)
    said = [r.getMessage() for r in caplog.records if "cannot keep spend" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"cannot keep spend in DATA_DIR {blocked}/data")


def test_built_in_prices_name_the_profiles_default_models() -> None:
    """A profile's default model changes: its built-in price must follow (or go)."""
    from claude_proxy.config.prices import BUILT_IN_PRICES
    from claude_proxy.config.settings import PROFILES

    defaults = {(name, model) for name, profile in PROFILES.items()
                for model in (profile.big_model, profile.middle_model, profile.small_model)}
    assert sorted(set(BUILT_IN_PRICES) - defaults) == []
    for prices in BUILT_IN_PRICES.values():
        assert prices["price_input"] >= prices.get("price_cache_read", 0)
        assert prices["price_output"] >= prices["price_input"]


def test_doctor_lists_the_keys_and_the_price_of_every_model_they_reach(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """Budgets, limits and what each key may use, then each reachable model's price and its
    source; never a key or its hash."""
    from tests.test_operations import doctor_responder

    upstream.responder = doctor_responder
    path = tmp_path / "proxy.toml"
    path.write_text(config_text(upstream).replace(
        'default = "alpha,alpha-middle"',
        'default = "alpha,alpha-middle"\nbackground = "beta,beta-middle"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(ALICE_PROXY_KEY=TEAM_KEYS["alice"], LOG_FILE=str(tmp_path / "cli.log"))
    run = subprocess.run([sys.executable, "-m", "claude_proxy", "doctor", "--config", str(path)],
                         env=env, capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    start = lines.index("keys (4)")
    assert lines[start:start + 10] == [
        "keys (4)",
        "  alice  budget $100.00 per month; all providers, all routes",
        "  bob    no budget; providers beta, all routes",
        "  carol  budget $1.00 per day; all providers, all routes",
        "  dave   no budget, rpm 2, tpm 5000; all providers, all routes",
        "prices (USD per million tokens: input / output / cache read / cache write)",
        "  alpha,alpha-middle  3 / 15 / 0.3 / 3.75 ([providers.alpha])",
        "  beta,beta-middle    0.5 / 1.5 / 0.5 / 0.5 ([providers.beta.models.\"beta-middle\"])",
        f"    spend          ok    kept in {tmp_path / 'data' / 'usage.sqlite3'} (one process; "
        "several share a budget only through REDIS_URL)",
        "Claude Code will work with this configuration.",
    ], run.stdout
    for key in TEAM_KEYS.values():
        assert key not in run.stdout and sha(key) not in run.stdout
