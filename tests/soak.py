"""A soak test of the whole fleet: two replicas × two workers on one real Redis, clients
streaming and not with team keys (one with a budget), while Redis is killed and restarted, the
upstream fails and recovers, and one replica is killed with SIGKILL and restarted.

At the end it checks, from the clients' side and from what the fleet kept:
- every request was answered — a success, or an Anthropic-shaped error — and none hung past
  its timeout; only requests in flight on the replica when it was killed may have been cut;
- the usage log holds exactly one entry per served request (each request carries its own
  session id, which its entry names) and none for a request that was not served;
- the spend of each key equals the sum of the prices of what it was served;
- the dashboard lists every served request among its last rows;
- the budgeted key's spend passed its budget by no more than the requests then in flight.

`make soak` runs it for ten minutes; `tests/test_soak.py` for about a minute in `make test`;
`python -m tests.soak --seconds N` prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.conftest import CLIENT_KEY, TEAM_KEYS, clean_env, eventually, free_port, serving
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    completion,
    error_reply,
    text_stream,
)

PROMPT, OUTPUT = 40_000, 8_000
"""Every answer's usage; at alpha's prices (3 and 15 $/Mtok) that is $0.24 a request."""
COST = (3.0 * PROMPT + 15.0 * OUTPUT) / 1e6
BUDGET = 2.4
"""carol's daily budget: ten requests' worth."""
TIMEOUT = 30.0
"""A client's timeout; a request that takes longer has hung."""
ANSWER = "soak answer"
CONFIG = """
[providers.alpha]
openai_base_url = "{url}"
openai_api_key = "sk-upstream-soak-0123456789abcdef"
provider = "openai"
big_model = "alpha-big"
middle_model = "alpha-middle"
small_model = "alpha-small"
retry_base_delay = 0
max_retries = 0
price_input = 3.0
price_output = 15.0

[keys.alice]
key = "env:ALICE_PROXY_KEY"

[keys.carol]
key = "env:CAROL_PROXY_KEY"
budget_usd = {budget}
budget_period = "day"
"""


@dataclass
class Outcome:
    """One client request, as the client saw it."""

    session: str
    key: str
    stream: bool
    replica: int
    started: float
    finished: float = 0.0
    kind: str = "pending"
    """`served`, `error` (Anthropic-shaped), `cut` (connection lost mid-request), `hung`
    (timed out) or `garbled` (neither an answer nor an Anthropic error)."""
    detail: str = ""
    request_id: str = ""


@dataclass
class Timeline:
    """When each fault was made (monotonic seconds)."""

    moments: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.moments[name] = time.monotonic()


class SoakRedis:
    """redis-server with an append-only file, so that a restart keeps what was written (as a
    deployment that keeps usage in Redis runs it)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        assert eventually(lambda: _pings(client), timeout=30), "redis-server did not start"

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=15)
            self.process = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class Replica:
    """One `claude-proxy --workers 2` process group on a fixed port."""

    def __init__(self, config: Path, env: dict[str, str], directory: Path) -> None:
        self.port = free_port()
        self.config, self.env, self.directory = config, env, directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "claude_proxy", "--config", str(self.config), "--workers",
             "2", "--host", "127.0.0.1", "--port", str(self.port)], env=self.env,
            cwd=self.directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        assert eventually(lambda: serving(self.url), timeout=60), "a replica did not start"

    def kill(self) -> None:
        """SIGKILL to the whole group: the supervisor and its workers die at once."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
            self.process = None


class FlakyUpstream:
    """Answers with a fixed usage; fails every request (HTTP 500) while `failing` is set."""

    def __init__(self) -> None:
        self.server = ScriptedUpstream().start()
        self.failing = threading.Event()
        self.server.responder = self.respond

    def respond(self, body: dict[str, Any]) -> Reply:
        if self.failing.is_set():
            return error_reply(500, "the upstream is down (soak)")
        usage = {"prompt_tokens": PROMPT, "completion_tokens": OUTPUT,
                 "total_tokens": PROMPT + OUTPUT}
        if body.get("stream"):
            return text_stream(["soak ", "answer"], usage=usage)
        return completion({"content": ANSWER}, usage=usage)


# ---------------------------------------------------------------- the clients


def ask(client: httpx.Client, url: str, outcome: Outcome) -> None:
    """One request; fills in `outcome`. Raises httpx.ConnectError when nobody listens (the
    caller tries the other replica, as a load balancer would)."""
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": outcome.stream,
            "messages": [{"role": "user", "content": f"soak {outcome.session}"}]}
    headers = {"x-api-key": TEAM_KEYS[outcome.key],
               "x-claude-code-session-id": outcome.session}
    try:
        with client.stream("POST", f"{url}/v1/messages", json=body, headers=headers) as answer:
            outcome.request_id = answer.headers.get("request-id", "")
            text = answer.read().decode()
            outcome.kind, outcome.detail = judged(answer.status_code, text, outcome.stream)
    except httpx.ConnectError:
        raise
    except httpx.TimeoutException:
        outcome.kind = "hung"
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError) as exc:
        outcome.kind, outcome.detail = "cut", type(exc).__name__
    outcome.finished = time.monotonic()


def judged(status: int, text: str, stream: bool) -> tuple[str, str]:
    """served / error / garbled, from the whole answer."""
    if status == 200 and stream:
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: ")]
        kinds = [event.get("type") for event in events]
        said = "".join(event["delta"].get("text", "") for event in events
                       if event.get("type") == "content_block_delta")
        if said == ANSWER and kinds[-1:] == ["message_stop"]:
            return "served", ""
        if "error" in kinds:
            return "error", json.dumps(events[-1])[:200]
        return "garbled", text[-200:]
    if status == 200:
        content = json.loads(text).get("content") or [{}]
        return ("served", "") if content[0].get("text") == ANSWER else ("garbled", text[:200])
    try:
        error = json.loads(text)
    except ValueError:
        return "garbled", f"{status} {text[:200]}"
    if error.get("type") == "error" and isinstance(error.get("error"), dict):
        return "error", f"{status} {error['error'].get('type')}"
    return "garbled", f"{status} {text[:200]}"


def client_loop(number: int, urls: list[str], until: float, outcomes: list[Outcome],
                lock: threading.Lock) -> None:
    """Requests one after another until `until`: alternate replicas, keys and streaming."""
    count = 0
    with httpx.Client(timeout=TIMEOUT) as client:
        while time.monotonic() < until:
            count += 1
            outcome = Outcome(session=f"soak-{number}-{count}",
                              key="carol" if count % 5 == 0 else "alice",
                              stream=count % 2 == 0, replica=(number + count) % len(urls),
                              started=time.monotonic())
            for attempt in range(len(urls) * 10):
                replica = (outcome.replica + attempt) % len(urls)
                try:
                    outcome.replica = replica
                    ask(client, urls[replica], outcome)
                    break
                except httpx.ConnectError:
                    time.sleep(0.1)
            else:
                outcome.kind, outcome.finished = "hung", time.monotonic()
            with lock:
                outcomes.append(outcome)


# ---------------------------------------------------------------- the run


@dataclass
class Report:
    seconds: float
    outcomes: list[Outcome]
    timeline: Timeline
    entries: list[dict[str, Any]]
    spend: dict[str, float]
    listed: set[str]
    rows_limit: int
    problems: list[str] = field(default_factory=list)
    lost_to_kill: list[str] = field(default_factory=list)
    """Dashboard rows of requests the killed replica served in its last second (a row is
    written after the answer, off its critical path; usage is not: it is never lost)."""

    def figures(self) -> str:
        kinds = Counter(outcome.kind for outcome in self.outcomes)
        served = [o for o in self.outcomes if o.kind == "served"]
        lines = [f"soak: {self.seconds:.0f} s, {len(self.outcomes)} requests "
                 f"({sum(o.stream for o in self.outcomes)} streamed): "
                 + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())),
                 f"usage entries {len(self.entries)} for {len(served)} served requests",
                 "spend: " + ", ".join(f"{key} ${amount:.2f}" for key, amount
                                       in sorted(self.spend.items()))
                 + f" (carol's budget ${BUDGET:.2f})",
                 f"dashboard: {len(self.listed)} rows listed (limit {self.rows_limit}); rows "
                 f"of the killed replica's last second lost: {len(self.lost_to_kill)}",
                 "faults at: " + ", ".join(f"{name} {moment - self.timeline.moments['start']:.1f}s"
                                           for name, moment in self.timeline.moments.items()
                                           if name != "start")]
        return "\n".join(lines + [f"PROBLEM: {problem}" for problem in self.problems])


def run_soak(seconds: float, clients: int = 6, directory: Path | None = None) -> Report:
    with tempfile.TemporaryDirectory(prefix="soak-") as scratch:
        return _run(seconds, clients, directory or Path(scratch))


def _run(seconds: float, clients: int, directory: Path) -> Report:
    upstream = FlakyUpstream()
    store = SoakRedis(directory)
    store.start()
    prefix = f"soak-{os.getpid()}:"
    config = directory / "proxy.toml"
    config.write_text(CONFIG.format(url=upstream.server.base_url, budget=BUDGET))
    env = clean_env(directory, REDIS_URL=store.url, REDIS_PREFIX=prefix, REDIS_TIMEOUT="0.2",
                    ANTHROPIC_API_KEY=CLIENT_KEY, ALICE_PROXY_KEY=TEAM_KEYS["alice"],
                    CAROL_PROXY_KEY=TEAM_KEYS["carol"], LOG_LEVEL="WARNING")
    replicas = [Replica(config, env, directory) for _ in range(2)]
    timeline, outcomes, lock = Timeline(), [], threading.Lock()
    try:
        for replica in replicas:
            replica.start()
        urls = [replica.url for replica in replicas]
        timeline.mark("start")
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=client_loop, args=(n, urls, until, outcomes, lock))
                   for n in range(clients)]
        for thread in threads:
            thread.start()
        for name, share, fault in faults(store, upstream, replicas[1]):
            time.sleep(max(0.0, timeline.moments["start"] + share * seconds - time.monotonic()))
            timeline.mark(name)  # as it begins: a kill's effects come before it returns
            fault()
        for thread in threads:
            thread.join(timeout=seconds + TIMEOUT * 3)
        time.sleep(1.0)  # the writes of the last requests reach Redis (FLUSH_DELAY is 50 ms)
        entries, spend, listed, limit = collected(store, prefix, urls)
    finally:
        for replica in replicas:
            replica.stop()
        store.kill()
        upstream.server.stop()
    report = Report(seconds, outcomes, timeline, entries, spend, listed, limit)
    check(report)
    return report


def faults(store: SoakRedis, upstream: FlakyUpstream,
           victim: Replica) -> Iterator[tuple[str, float, Callable[[], None]]]:
    """The faults, in order, at their share of the run."""
    yield "redis killed", 0.15, store.kill
    yield "redis restarted", 0.30, store.start
    yield "upstream failing", 0.40, upstream.failing.set
    yield "upstream back", 0.50, upstream.failing.clear
    yield "replica killed", 0.65, victim.kill
    yield "replica restarted", 0.75, victim.start


def collected(store: SoakRedis, prefix: str,
              urls: list[str]) -> tuple[list[dict[str, Any]], dict[str, float], set[str], int]:
    """The usage log (read from Redis itself), each key's spend (/v1/usage), and the request
    ids the dashboard lists (its live feed's first event)."""
    client = redis.Redis(port=store.port)
    entries = [json.loads(fields[b"e"]) for _, fields in client.xrange(prefix + "usage")]
    admin = {"x-api-key": CLIENT_KEY}
    usage = httpx.get(f"{urls[0]}/v1/usage?group_by=key", headers=admin, timeout=30).json()
    spend = {row["key"]: float(row["cost_usd"]) for row in usage["data"]}
    with httpx.stream("GET", f"{urls[0]}/ui/feed", headers=admin, timeout=30) as feed:
        hello = next(json.loads(line[6:]) for line in feed.iter_lines()
                     if line.startswith("data: "))
    return entries, spend, {str(row["id"]) for row in hello["requests"]}, hello["rows_limit"]


def check(report: Report) -> None:
    problems, moments = report.problems, report.timeline.moments
    killed = moments.get("replica killed", float("inf"))
    restarted = moments.get("replica restarted", float("inf"))

    def near_the_kill(outcome: Outcome) -> bool:
        """Served by the killed replica in the second before it died."""
        return outcome.replica == 1 and killed - 1.0 <= outcome.finished <= killed

    for outcome in report.outcomes:
        if outcome.kind in ("hung", "garbled"):
            problems.append(f"{outcome.session} {outcome.kind}: {outcome.detail}")
        elif outcome.kind == "cut" and not (outcome.replica == 1 and outcome.started <= restarted
                                            and outcome.finished >= killed):
            # in flight when it died, or sent on a connection opened before (the client's
            # first try after the kill finds it dead)
            start = moments["start"]
            problems.append(f"{outcome.session} cut outside the SIGKILL: {outcome.detail} "
                            f"(replica {outcome.replica}, {outcome.started - start:.2f}-"
                            f"{outcome.finished - start:.2f}s)")
    served = {o.session: o for o in report.outcomes if o.kind == "served"}
    cut = {o.session for o in report.outcomes if o.kind == "cut"}
    if not served:
        problems.append("no request was served")
    counted = Counter(str(entry.get("session")) for entry in report.entries)
    for session, count in counted.items():
        if count > 1:
            problems.append(f"{session}: {count} usage entries")
        elif session not in served and session not in cut:  # cut: answered, then killed
            problems.append(f"{session}: a usage entry for a request that was not served")
    for session in served:
        if not counted[session]:
            problems.append(f"{session}: served, but no usage entry")
    for key in ("alice", "carol"):
        priced = sum(float(entry["cost_usd"]) for entry in report.entries
                     if entry.get("key") == key)
        if abs(report.spend.get(key, 0.0) - priced) > 1e-6:
            problems.append(f"{key}: spend ${report.spend.get(key, 0.0):.4f} is not the sum "
                            f"of its entries ${priced:.4f}")
        entries = sum(entry.get("key") == key for entry in report.entries)
        if abs(priced - entries * COST) > 1e-6:
            problems.append(f"{key}: ${priced:.4f} is not {entries} requests × ${COST}")
    clients = len({o.session.split("-")[1] for o in report.outcomes})
    if report.spend.get("carol", 0.0) > BUDGET + clients * COST + 1e-6:
        problems.append(f"carol spent ${report.spend['carol']:.2f} on a ${BUDGET} budget")
    recent = [o for o in sorted(served.values(), key=lambda o: o.finished)
              if o.request_id][-report.rows_limit // 2:]
    missing = [o.request_id for o in recent if o.request_id not in report.listed
               and not near_the_kill(o)]  # a row is written just after the answer
    report.lost_to_kill = [o.request_id for o in recent if o.request_id not in report.listed
                           and near_the_kill(o)]
    if missing:
        problems.append(f"{len(missing)} of the last {len(recent)} served requests are not "
                        f"on the dashboard (e.g. {missing[0]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    report = run_soak(args.seconds, args.clients)
    print(report.figures())
    raise SystemExit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
