"""Many processes, one proxy: workers and replicas share what they learn through a real Redis.

The store itself (state/redis.py) is tested in-process against the session's redis-server;
the fleet as users run it: two `claude-proxy` replica processes on one Redis, and one with
`--workers 4`. Redis is paused (SIGSTOP), killed and restarted under them: no client request
may fail, and sharing must resume.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from claude_proxy.routing.health import CircuitBreaker
from claude_proxy.state.local import LocalStore
from claude_proxy.state.redis import RedisStore
from claude_proxy.upstream.capabilities import Refusals
from tests.conftest import RedisServer, clean_env, eventually, free_port
from tests.scripted_upstream import Reply, ScriptedUpstream, error_reply
from tests.test_dashboard_browser import CHROMIUM, Page, browser  # noqa: F401 (a fixture)
from tests.test_operations import doctor_responder, run_doctor

Started = Callable[..., tuple[str, Any]]
ANSWER = "scripted default"


def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}:"


async def until(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    """Bounded polling inside an event loop (another task or process brings it about)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not predicate():
        if loop.time() > give_up:
            return False
        await asyncio.sleep(0.01)
    return True


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """In a thread of its own: the module's `browser` fixture (Playwright's sync API) keeps an
    event loop running in this one while the tests after it run."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, scenario()).result()


# ---------------------------------------------------------------- the store itself


def test_a_refused_field_is_forgotten_after_its_ttl_in_process_too() -> None:
    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    refusals = Refusals(LocalStore(clock=clock), "kimi", ttl=3600)
    other = Refusals(refusals.store, "groq", ttl=3600)
    refusals.remember("kimi-k2", "stream_options")
    assert refusals.refuses("kimi-k2", "stream_options")
    assert not refusals.refuses("kimi-k2", "user") and not refusals.refuses("k2", "user")
    assert not other.refuses("kimi-k2", "stream_options")  # per provider
    clock.now += 3599
    assert refusals.refuses("kimi-k2", "stream_options")
    clock.now += 2
    assert not refusals.refuses("kimi-k2", "stream_options")  # tried again


def test_a_request_reads_a_models_refusals_once_and_sees_every_field() -> None:
    """`Refusals.of`: one store read for a model that refused nothing (not one per field a
    request asks about), and the same answers as `refuses` once it refused something."""
    class Counting(LocalStore):
        reads = 0

        def get(self, key: str) -> dict[str, Any] | None:
            Counting.reads += 1
            return super().get(key)

    refusals = Refusals(Counting(), "kimi", ttl=3600)
    fields = ("stream_options", "user", "reasoning", "cache_control", "top_k")
    refuses = refusals.of("kimi-k2")
    assert [refuses(field) for field in fields] == [False] * 5
    assert Counting.reads == 1
    refusals.remember("kimi-k2", "user")
    refusals.remember("kimi-k2", "reasoning")
    refuses = refusals.of("kimi-k2")
    assert [refuses(field) for field in fields] == [False, True, True, False, False]
    assert not any(map(refusals.of("k2"), fields))  # per model
    assert not any(map(Refusals(refusals.store, "groq").of("kimi-k2"), fields))


def test_two_stores_share_counters_records_logs_claims_and_minutes(
        redis_server: RedisServer) -> None:
    keys = prefix()

    async def scenario() -> None:
        a = RedisStore(redis_server.url, keys, timeout=1.0, process="host-a:1")
        b = RedisStore(redis_server.url, keys, timeout=1.0, process="host-b:2")
        await a.start()
        await b.start()
        try:
            assert b.get("health:p") is None
            a.put("health:p", {"open_until": 123.5}, ttl=60)
            await a.sync()
            assert await until(lambda: b.get("health:p") == {"open_until": 123.5})
            a.add("spend:k", 2, ttl=60)
            b.add("spend:k", 3, ttl=60)
            await b.sync()
            assert await a.add_total("spend:k", 1, ttl=60) == 6
            await b.sync()
            assert await until(lambda: b.total("spend:k") == 6)
            assert await a.claim("probe:1", 10) is True
            assert await b.claim("probe:1", 10) is False
            for n in range(300):
                a.append("log", {"n": n}, maxlen=50)
            await a.sync()
            await b.sync()
            entries = await b.read_log("log", 1000)
            assert 50 <= len(entries) <= 200  # trimmed near maxlen (MAXLEN ~)
            assert entries[-1] == {"n": 299}
            a.add_fields("minute:1", {"status|200": 1, "tokens|input": 10}, ttl=60)
            b.add_fields("minute:1", {"status|200": 2}, ttl=60)
            await a.sync()
            await b.sync()
            assert await a.read_fields(["minute:1", "minute:2"]) == [
                {"status|200": 3.0, "tokens|input": 10.0}, {}]
            b.delete("health:p")
            await b.sync()
            assert await until(lambda: a.get("health:p") is None)
            assert a.describe()["state"] == "redis ok" and a.shared
        finally:
            await a.close()
            await b.close()

    run(scenario)
    client = redis.Redis(port=redis_server.port)
    found = list(client.scan_iter(match=f"{keys}*"))
    assert found
    for key in found:
        bounded = client.type(key) == b"stream" or client.ttl(key) > 0
        assert bounded, f"{key!r} has no TTL and is not a bounded stream"


def test_one_probe_for_the_fleet_and_the_doubled_cooldown_is_shared(
        redis_server: RedisServer) -> None:
    keys = prefix()

    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    async def scenario() -> None:
        a = RedisStore(redis_server.url, keys, timeout=1.0, process="host-a:1")
        b = RedisStore(redis_server.url, keys, timeout=1.0, process="host-b:2")
        await a.start()
        await b.start()
        clock = Clock()
        first = CircuitBreaker(2, 10, clock=clock, store=a, name="bad")
        second = CircuitBreaker(2, 10, clock=clock, store=b, name="bad")
        try:
            await first.failed("500")
            assert await second.take()  # one failure in the fleet: still healthy
            await second.failed("500")  # the second opens it, for both
            assert await until(lambda: first.is_cooling())
            assert not await first.take() and not await second.take()
            assert await until(lambda: first.snapshot().consecutive_failures == 2)  # <= 1 s
            clock.now += 11
            taken = await asyncio.gather(first.take(), second.take())
            assert sorted(taken) == [False, True]  # one probe, whoever claims it first
            prober = first if taken[0] else second
            other = second if taken[0] else first
            await prober.failed("500 again")
            assert await until(lambda: other.reopens_at() == clock.now + 20)  # doubled
            clock.now += 21
            taken = await asyncio.gather(first.take(), second.take())
            assert sorted(taken) == [False, True]
            (first if taken[0] else second).record_success()
            await a.sync()
            await b.sync()
            # the success's notice reaches the other (a due record unprobed is not "cooling")
            assert await until(lambda: first.reopens_at() == second.reopens_at() == -math.inf)
            assert await first.take() and await second.take()
        finally:
            await a.close()
            await b.close()

    run(scenario)


def test_redis_paused_fails_open_once_and_adds_what_was_counted_when_back(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    keys = prefix()
    caplog.set_level(logging.INFO, logger="claude_proxy.state")

    async def scenario() -> None:
        store = RedisStore(redis_server.url, keys, timeout=0.1, process="host-a:1")
        await store.start()
        try:
            store.add("spend:team", 1.5, ttl=600)
            await store.sync()
            redis_server.pause()
            try:
                assert await store.add_total("spend:team", 2, ttl=600) == 3.5  # local
                assert store.describe()["state"] == "degraded: in-process"
                store.add("spend:team", 0.5, ttl=600)
                assert await store.claim("probe", 5)  # in-process while away
                assert await store.read_log("log", 5) == []
            finally:
                redis_server.resume()
            assert await until(lambda: store.describe()["state"] == "redis ok", timeout=15)
            await store.sync()
        finally:
            await store.close()

    run(scenario)
    assert float(redis.Redis(port=redis_server.port).get(f"{keys}spend:team") or 0) == 4.0
    went = [r for r in caplog.records if "going on with in-process state" in r.message]
    back = [r for r in caplog.records if "is back" in r.message]
    assert [r.levelname for r in went] == ["WARNING"] and [r.levelname for r in back] == ["INFO"]


def test_a_flush_redis_applies_after_its_reply_timed_out_is_not_applied_twice(
        redis_server: RedisServer) -> None:
    """A paused Redis reads the flush that timed out once it resumes, and the store sends
    that flush again when Redis is back: the log entry and the minute's count land once."""
    keys = prefix()

    async def scenario() -> None:
        store = RedisStore(redis_server.url, keys, timeout=0.1, process="host-a:1")
        await store.start()
        try:
            redis_server.pause()
            try:
                store.append("usage", {"request": "req_1"}, maxlen=50)
                store.add_fields("minute:1", {"status|200": 1}, ttl=600)
                store.put("row:req_1", {"status": 200}, ttl=600)
                await store.sync()  # written to Redis's socket; no reply: it times out
                assert store.describe()["state"] == "degraded: in-process"
            finally:
                redis_server.resume()
            assert await until(lambda: store.describe()["state"] == "redis ok", timeout=15)
            await store.sync()
            assert await store.read_log("usage", 10) == [{"request": "req_1"}]
            assert await store.read_fields(["minute:1"]) == [{"status|200": 1.0}]
            assert await store.fetch("row:req_1") == {"status": 200}
        finally:
            await store.close()

    run(scenario)
    assert redis.Redis(port=redis_server.port).xlen(f"{keys}usage") == 1


def commands(client: redis.Redis) -> dict[str, int]:
    """Redis's count of each command since CONFIG RESETSTAT (a script's own calls too)."""
    return {name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in client.info("commandstats").items()
            if name != "cmdstat_config|resetstat"}


def test_a_budget_check_is_one_get_and_a_charge_one_script_not_waited_for(
        tmp_path: Path) -> None:
    """A keyed request's Redis work on its path: the spend read by one GET (the writes queued
    so far are what this process owes, added to it, and go later, off the path), and the
    charge written as one script (APPLY: every queued write of every kind, each batch applied
    once) whose reply the next call reads. A read while a sent batch is unconfirmed sends it
    again with the read, in one command."""
    server = RedisServer(free_port(), tmp_path).start()
    client = redis.Redis(port=server.port)

    async def scenario() -> None:
        store = RedisStore(server.url, "t:", timeout=1.0, process="host-a:1")
        await store.start()
        try:
            client.config_resetstat()
            store.add("spend:team:month", 0.25, ttl=600)
            store.add("rpm:team:1", 1, ttl=120)
            store.put("row:req_1", {"status": 200}, ttl=600)
            store.append("usage", {"request": "req_1"}, maxlen=50)
            store.add_fields("minute:1", {"status|200": 1}, ttl=600)
            assert await store.fresh_total("spend:team:month", 600) == 0.25
            assert commands(client) == {"get": 1}
            await store.post()  # everything queued, in one script
            assert await store.fresh_total("spend:team:month", 600) == 0.25  # its reply read
            assert commands(client)["evalsha"] == 1 and commands(client)["get"] == 2
            store.add("spend:team:month", 0.5, ttl=600)
            store.append("usage", {"request": "req_2"}, maxlen=50)
            # as after a reply that timed out: the batch sent, Redis's answer unknown
            store.queue._batches["unconfirmed"] = store.queue._owed
            store.queue._owed = {}
            assert await store.fresh_total("spend:team:month", 600) == 0.75
            assert commands(client)["evalsha"] == 2 and commands(client)["get"] == 3
        finally:
            await store.close()

    try:
        run(scenario)
        assert client.get("t:spend:team:month") == b"0.75"
        assert client.get("t:rpm:team:1") == b"1"
        assert 0 < client.ttl("t:spend:team:month") <= 600
        assert client.get("t:row:req_1") == b'{"status":200}'
        assert [json.loads(fields[b"e"]) for _, fields in client.xrange("t:usage")] == [
            {"request": "req_1"}, {"request": "req_2"}]
        assert client.hgetall("t:minute:1") == {b"status|200": b"1"}
    finally:
        server.kill()


def test_a_charge_posted_to_a_paused_redis_waits_for_nothing_and_lands_once(
        redis_server: RedisServer) -> None:
    """`post` writes to Redis's connection and returns: a paused Redis opens no breaker (a
    `sync` would wait REDIS_TIMEOUT for its reply, and fall back to in-process state); once
    Redis reads it, it applies it, and the next call reads the reply: counted once, and
    logged once."""
    keys = prefix()

    async def scenario() -> None:
        store = RedisStore(redis_server.url, keys, timeout=0.1, process="host-a:1")
        await store.start()
        try:
            redis_server.pause()
            try:
                store.add("spend:team", 1.5, ttl=600)
                store.append("usage", {"request": "req_1"}, maxlen=50)
                await store.post()
                assert store.describe()["state"] == "redis ok"
            finally:
                redis_server.resume()
            assert await store.fresh_total("spend:team", 600) == 1.5
            # (on a loaded host the reply may come after REDIS_TIMEOUT: sent again, once)
            assert await until(lambda: store.describe()["state"] == "redis ok", timeout=15)
            await store.sync()
            assert await store.read_log("usage", 10) == [{"request": "req_1"}]
        finally:
            await store.close()

    run(scenario)
    assert redis.Redis(port=redis_server.port).get(f"{keys}spend:team") == b"1.5"


KILLED_AFTER_POST = """
import asyncio, os, signal, sys
from claude_proxy.state.redis import RedisStore

async def charge_and_die():
    store = RedisStore(sys.argv[1], sys.argv[2], timeout=1.0, process="doomed:1")
    await store.start()
    store.add("spend:team", 0.5, ttl=600)
    store.append("usage", {"request": "req_1"}, maxlen=50)
    await store.post()
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(charge_and_die())
"""


def test_a_posted_charge_reaches_redis_though_its_process_is_killed_right_after(
        redis_server: RedisServer) -> None:
    """What `post` returned from is in Redis's hands: a replica killed (SIGKILL) right after
    answering has lost neither the spend nor the usage entry."""
    keys = prefix()
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_POST, redis_server.url, keys],
                          timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    client = redis.Redis(port=redis_server.port)
    assert eventually(lambda: client.get(f"{keys}spend:team") == b"0.5")
    assert [json.loads(fields[b"e"]) for _, fields in client.xrange(f"{keys}usage")] == [
        {"request": "req_1"}]


# ---------------------------------------------------------------- replicas and workers

CONFIG = """
[providers.bad]
openai_base_url = "{bad}"
openai_api_key = "k-bad"
provider = "openai"
big_model = "bad-main"
middle_model = "bad-main"
small_model = "bad-main"
max_retries = 0
retry_base_delay = 0

[providers.good]
openai_base_url = "{good}"
openai_api_key = "k-good"
provider = "openai"
big_model = "good-main"
middle_model = "good-main"
small_model = "good-main"
max_retries = 0
retry_base_delay = 0

[router]
default = "bad,bad-main"
background = "good,good-picky"
fallback = ["good,good-fallback"]
cooldown_failures = 2
cooldown_seconds = 60
"""


def picky(body: dict[str, Any]) -> Reply | None:
    """good-picky refuses stream_options, as older vLLM and Azure builds do."""
    if body.get("model") == "good-picky" and "stream_options" in body:
        return error_reply(400, "Unrecognized request argument supplied: stream_options")
    return None


@pytest.fixture(scope="module")
def fleet_upstreams() -> Iterator[dict[str, ScriptedUpstream]]:
    servers = {"bad": ScriptedUpstream().start(), "good": ScriptedUpstream().start()}
    yield servers
    for server in servers.values():
        server.stop()


class Fleet:
    """Replicas of one proxy (each a `claude-proxy` process) on one Redis."""

    def __init__(self, started: Started, config: Path, tmp_path: Path, redis_url: str) -> None:
        self.started = started
        self.config = config
        self.tmp_path = tmp_path
        self.redis_url = redis_url
        self.keys = prefix()
        self.processes: list[Any] = []

    def start(self, replicas: int = 2, *args: str, url: str | None = None,
              timeout: str = "1") -> list[str]:
        """`replicas` processes; REDIS_TIMEOUT generous unless a test stops Redis under them
        (a loaded machine must not make these tests see a Redis outage)."""
        env = clean_env(self.tmp_path, REDIS_URL=self.redis_url if url is None else url,
                        REDIS_PREFIX=self.keys, REDIS_TIMEOUT=timeout)
        urls = []
        for _ in range(replicas):
            url_of, process = self.started("--config", str(self.config), *args, env=env)
            urls.append(url_of)
            self.processes.append(process)
        return urls

    def output(self) -> str:
        """Everything the replicas printed so far."""
        return "".join(process.startup_output + "".join(process.later_output)
                       for process in self.processes)


@pytest.fixture
def fleet(fleet_upstreams: dict[str, ScriptedUpstream], redis_server: RedisServer,
          started: Started, tmp_path: Path) -> Fleet:
    bad, good = fleet_upstreams["bad"], fleet_upstreams["good"]
    bad.reset()
    good.reset()
    bad.responder = lambda body: error_reply(500, "bad is down")
    good.responder = picky
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG.format(bad=bad.base_url, good=good.base_url))
    return Fleet(started, config, tmp_path, redis_server.url)


def ask(url: str, model: str = "claude-sonnet-4-6", stream: bool = False,
        content: str = "hi") -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", timeout=30, json={
        "model": model, "max_tokens": 50, "stream": stream,
        "messages": [{"role": "user", "content": content}]})


def answered(response: httpx.Response) -> bool:
    if response.status_code != 200:
        return False
    if response.headers["content-type"].startswith("text/event-stream"):
        return "scripted " in response.text and "default" in response.text
    return bool(response.json()["content"][0]["text"] == ANSWER)


def feed(url: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of a dashboard's live feed (/ui/feed), as they come."""
    with httpx.stream("GET", f"{url}/ui/feed", timeout=30) as response:
        event = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                yield event, json.loads(line[6:])


def hello(url: str) -> dict[str, Any]:
    """What a dashboard page load receives first: the `hello` event of /ui/feed."""
    events = feed(url)
    try:
        event, data = next(events)
    finally:
        events.close()
    assert event == "hello"
    return data


def detail(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/health?detail=1", timeout=30).json()
    return body


def test_two_replicas_share_the_cooldown(fleet: Fleet,
                                         fleet_upstreams: dict[str, ScriptedUpstream]) -> None:
    a, b = fleet.start()
    responses = [ask((a, b)[n % 2]) for n in range(40)]
    assert all(answered(response) for response in responses)
    assert [r.json()["content"][0]["text"] for r in responses] == [ANSWER] * 40
    bad = fleet_upstreams["bad"].requests
    assert 2 <= len(bad) <= 3, "at most 2 failures and one probe per cooldown period"
    assert len(fleet_upstreams["good"].requests) == 40
    for url in (a, b):
        shown = detail(url)
        assert shown["providers"]["bad"]["state"] == "cooling"
        assert shown["scope"].startswith("fleet-wide")
        assert shown["state_backend"]["state"] == "redis ok"
        assert shown["state_backend"]["rtt_ms"] is not None


def test_a_field_refused_once_is_never_sent_again_by_either_replica(
        fleet: Fleet, fleet_upstreams: dict[str, ScriptedUpstream]) -> None:
    a, b = fleet.start()
    for n in range(10):
        assert answered(ask((a, b)[n % 2], model="claude-haiku-4-5", stream=True))
    sent = [body for body in fleet_upstreams["good"].requests
            if body["model"] == "good-picky"]
    assert len(sent) == 11  # ten requests, one of them sent again without the field
    assert [("stream_options" in body) for body in sent] == [True] + [False] * 10


def test_dashboard_on_one_replica_lists_and_inspects_a_request_served_by_the_other(
        fleet: Fleet) -> None:
    a, b = fleet.start()
    live = feed(b)  # a page open on B while A serves the request
    assert next(live)[0] == "hello"
    response = ask(a, content="only on replica A")
    request_id = response.headers["request-id"]
    for _, (event, data) in zip(range(60), live, strict=False):  # a live tick each second
        if event == "request" and data["id"] == request_id:
            break
    else:
        raise AssertionError("the open page was not sent the other replica's request")
    live.close()
    response = ask(a, content="only on replica A")
    assert answered(response)
    request_id = response.headers["request-id"]

    def listed_on_b() -> bool:
        return request_id in [row["id"] for row in hello(b)["requests"]]

    assert eventually(listed_on_b)
    page = hello(b)
    row = next(row for row in page["requests"] if row["id"] == request_id)
    a_process = detail(a)["state_backend"]["process"]
    assert row["process"] == a_process and row["status"] == 200
    assert page["scope"]["shared"] is True and a_process in page["scope"]["processes"]
    assert detail(b)["state_backend"]["process"] in page["scope"]["processes"]
    assert request_id in page["kept"]
    view = httpx.get(f"{b}/ui/api/requests/{request_id}", timeout=30).json()
    assert view["kept"] is True and view["row"]["id"] == request_id
    assert "only on replica A" in json.dumps(view["client"])
    assert ANSWER in json.dumps(view["answer"])


def requests_total(url: str) -> float:
    """claude_proxy_requests_total of the requests the tests send, as one scrape says."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("claude_proxy_requests_total{")
               and 'model="claude-sonnet-4-6"' in line)


def test_four_workers_show_every_request_and_sum_their_metrics(
        fleet: Fleet, fleet_upstreams: dict[str, ScriptedUpstream]) -> None:
    url, = fleet.start(1, "--workers", "4")
    ids = set()
    for _ in range(40):
        response = ask(url)  # a new connection each: the workers share them out
        assert answered(response)
        ids.add(response.headers["request-id"])
    assert 2 <= len(fleet_upstreams["bad"].requests) <= 3  # one cooldown for the four
    states = {detail(url)["providers"]["bad"]["state"] for _ in range(8)}
    assert states == {"cooling"}, "whichever worker answers"

    def listed() -> set[str]:
        return {row["id"] for row in hello(url)["requests"]}

    assert eventually(lambda: listed() >= ids)
    assert all(listed() >= ids for _ in range(5)), "every page load lists all 40"
    assert eventually(lambda: requests_total(url) == 40)
    assert [requests_total(url) for _ in range(10)] == [40.0] * 10
    assert "workers' metrics summed through" in fleet.output()


def test_workers_without_redis_sum_their_metrics_too(fleet: Fleet) -> None:
    url, = fleet.start(1, "--workers", "2", url="")
    for _ in range(10):
        assert answered(ask(url))
    assert detail(url)["state_backend"]["backend"] == "in-process"
    assert eventually(lambda: requests_total(url) == 10)
    assert [requests_total(url) for _ in range(10)] == [10.0] * 10


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) and not os.environ.get("CI"),
                    reason="chromium not installed (make test installs it)")
def test_the_page_on_one_replica_shows_the_fleet_and_opens_the_others_request(
        fleet: Fleet, browser: Any) -> None:  # noqa: F811 (the fixture)
    a, b = fleet.start()
    response = ask(a, content="served by A, shown by B")
    request_id = response.headers["request-id"]
    assert eventually(lambda: request_id in [row["id"] for row in hello(b)["requests"]])
    processes = [detail(url)["state_backend"]["process"] for url in (a, b)]
    tab = Page(browser, f"{b}/ui")
    tab.page.wait_for_selector(f'#requests tr[data-id="{request_id}"]')
    assert tab.page.inner_text("#scope") == (
        f"all 2 processes on 1 host through Redis ({', '.join(sorted(processes))})"
        f" · in flight: this process ({processes[1]}) only")
    assert tab.errors == []
    tab.close()
    direct = Page(browser, f"{b}/ui/requests/{request_id}")
    direct.page.wait_for_selector("#inspector pre.answer")
    assert direct.page.inner_text("#inspector pre.answer") == ANSWER
    assert "\"max_tokens\": 50" in direct.page.inner_text("#inspector")  # the client body
    assert direct.errors == []
    direct.close()


def requests_through(urls: list[str], count: int, during: Callable[[], None]) -> list[bool]:
    """`count` requests, four at a time over the replicas, with `during` done once a
    quarter of them have been answered."""
    done = threading.Semaphore(0)
    quarter = threading.Event()
    answered_count = [0]
    lock = threading.Lock()

    def one(n: int) -> bool:
        ok = answered(ask(urls[n % len(urls)], content=f"request {n}"))
        with lock:
            answered_count[0] += 1
            if answered_count[0] == count // 4:
                quarter.set()
        done.release()
        return ok

    with ThreadPoolExecutor(4) as pool:
        results = pool.map(one, range(count))
        assert quarter.wait(60)
        during()
        return list(results)


def shares_again(a: str, b: str) -> bool:
    """A request served by A shows on B's dashboard (after Redis came back)."""
    if not all(detail(url)["state_backend"]["state"] == "redis ok" for url in (a, b)):
        return False
    request_id = ask(a).headers["request-id"]
    return eventually(lambda: httpx.get(f"{b}/ui/api/requests/{request_id}",
                                        timeout=30).status_code == 200, timeout=5)


def test_redis_paused_then_resumed_fails_nothing_and_sharing_resumes(
        fleet: Fleet, redis_server: RedisServer) -> None:
    a, b = fleet.start(timeout="0.1")
    try:
        results = requests_through([a, b], 60, redis_server.pause)
        assert results == [True] * 60, "no request failed while Redis was paused"
        shown = detail(a)["state_backend"]
        assert shown["state"] == "degraded: in-process" and shown["shared"] is False
        assert "this process only" in detail(a)["scope"]
    finally:
        redis_server.resume()
    assert eventually(lambda: shares_again(a, b), timeout=30)


def test_redis_killed_then_restarted_fails_nothing_and_sharing_resumes(
        fleet: Fleet, redis_server: RedisServer) -> None:
    a, b = fleet.start(timeout="0.1")
    try:
        results = requests_through([a, b], 60, redis_server.kill)
        assert results == [True] * 60, "no request failed while Redis was gone"
        assert detail(b)["state_backend"]["state"] == "degraded: in-process"
    finally:
        if redis_server.process is None:
            redis_server.start()
    assert eventually(lambda: shares_again(a, b), timeout=30)


def test_redis_down_at_start_starts_degraded_and_serves(fleet: Fleet) -> None:
    url, = fleet.start(1, url=f"redis://127.0.0.1:{free_port()}/0")
    assert "is unreachable" in fleet.output()
    assert answered(ask(url))
    shown = detail(url)["state_backend"]
    assert shown["state"] == "degraded: in-process" and shown["backend"] == "redis"


PASSWORD = "redis-pass-7f3a9c-never-shown"


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A second redis-server, TLS only (a self-signed certificate made by openssl), with an
    ACL user `proxyuser` whose password is PASSWORD: (its port, the certificate)."""
    if shutil.which("openssl") is None or shutil.which("redis-server") is None:
        pytest.skip("openssl or redis-server is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True, timeout=60)
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
         str(cert), "--tls-auth-clients", "no", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path), "--user", "proxyuser", "on", f">{PASSWORD}", "~*", "&*",
         "+@all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = ssl.create_default_context(cafile=str(cert))

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    assert eventually(answers, timeout=30), "the TLS redis-server did not start"
    yield port, cert
    server.kill()
    server.wait(timeout=15)


def test_a_rediss_url_with_user_and_password_works_and_the_password_is_never_shown(
        fleet: Fleet, tls_redis: tuple[int, Path], tmp_path: Path, upstream: ScriptedUpstream,
        ) -> None:
    port, cert = tls_redis
    url_with_password = (f"rediss://proxyuser:{PASSWORD}@127.0.0.1:{port}/0"
                         f"?ssl_ca_certs={cert}")
    a, b = fleet.start(2, url=url_with_password)
    response = ask(a)
    assert answered(response)
    request_id = response.headers["request-id"]
    assert eventually(lambda: httpx.get(f"{b}/ui/api/requests/{request_id}",
                                        timeout=30).status_code == 200)  # shared over TLS
    backend = detail(b)["state_backend"]
    assert backend["state"] == "redis ok" and backend["url"] == f"rediss://127.0.0.1:{port}/0"
    shown = [httpx.get(f"{b}/health?detail=1", timeout=30).text, json.dumps(hello(b)),
             httpx.get(f"{b}/metrics", timeout=30).text]
    upstream.responder = doctor_responder
    doctor = run_doctor(tmp_path, upstream, REDIS_URL=url_with_password)
    assert re.search(rf"redis\s+ok\s+rediss://127.0.0.1:{port}/0 answers", doctor.stdout)
    log = (tmp_path / "logs" / "claude-proxy.log").read_text()
    assert f"shared through Redis at rediss://127.0.0.1:{port}/0" in fleet.output()
    for text in [*shown, log, fleet.output(), doctor.stdout + doctor.stderr]:
        assert PASSWORD not in text and "proxyuser" not in text


def test_a_rediss_url_that_fails_its_handshake_still_starts(
        fleet: Fleet, redis_server: RedisServer, tmp_path: Path) -> None:
    url, = fleet.start(1, url=f"rediss://proxyuser:{PASSWORD}@127.0.0.1:{redis_server.port}/0")
    assert answered(ask(url))  # a plain Redis behind: TLS fails, the proxy runs degraded
    assert detail(url)["state_backend"]["state"] == "degraded: in-process"
    log = (tmp_path / "logs" / "claude-proxy.log").read_text()
    for text in [log, fleet.output(), json.dumps(detail(url))]:
        assert PASSWORD not in text and "proxyuser" not in text


def test_doctor_checks_the_redis_connection_without_showing_the_password(
        tmp_path: Path, upstream: ScriptedUpstream, redis_server: RedisServer) -> None:
    upstream.responder = doctor_responder
    result = run_doctor(tmp_path, upstream, REDIS_URL=redis_server.url, REDIS_PREFIX="doc:")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"redis\s+ok\s+redis://127.0.0.1:{redis_server.port}/0 answers in "
                     r"[0-9.]+ ms, prefix 'doc:'", result.stdout)
    closed = f"redis://proxyuser:{PASSWORD}@127.0.0.1:{free_port()}/0"
    result = run_doctor(tmp_path, upstream, REDIS_URL=closed)
    assert result.returncode == 0, "Redis away: the proxy runs degraded, Claude Code works"
    assert re.search(r"redis\s+warn\s+redis://127.0.0.1:[0-9]+/0: ConnectionError \(the "
                     r"proxy would run degraded", result.stdout), result.stdout
    assert PASSWORD not in result.stdout + result.stderr
    assert "proxyuser" not in result.stdout + result.stderr


def test_the_fleets_live_view_carries_the_keys_panel_as_one_process_does(
        redis_server: RedisServer) -> None:
    """With REDIS_URL the dashboard's live events come from the fleet's view: they carry the
    same members as a lone process's, the Keys panel's spend included (it went missing, and
    the panel with it, after the first live event)."""
    from claude_proxy.ui.recorder import Recorder

    panel = [{"name": "ana", "spent": 1.5, "budget": 50.0}]

    async def scenario() -> None:
        store = RedisStore(redis_server.url, prefix(), timeout=1.0, process="host-a:1")
        await store.start()
        try:
            recorder = Recorder(inspect=5, secrets=[], health=list, store=store,
                                keys=lambda: panel)
            assert recorder.fleet is not None
            fleet = await recorder.fleet_live()
            assert fleet["keys"] == panel
            assert set(fleet) == set(recorder.live()) | {"now_process"}
        finally:
            await store.close()

    run(scenario)
