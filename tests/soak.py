"""`make soak`: the whole fleet under load, through its faults, and what it lost or doubled.

Two replicas of `claude-proxy --workers 2` on one real Redis (Debian's redis-server, run with
the arguments docker-compose.yml and deploy/kubernetes.yaml ship: its append-only file fsynced
on every write, no eviction), two scripted upstreams (alpha, the default route; beta, its
fallback) and client threads for two team keys (one with a daily budget that the run reaches),
streaming and not. Each client request carries its own `x-claude-code-session-id`, so the usage
log says which requests it holds. During the run, at fixed shares of it: Redis is killed and
restarted, alpha fails (500) and recovers, one replica is killed with SIGKILL (its whole
process group) and restarted, and then both replicas are restarted one after the other with
SIGTERM (a rolling update: each drains, DRAIN_DELAY=2). The clients go through a load
balancer's view of the replicas: a replica is in rotation while its /health answers 200
(polled every 0.2 s); a client whose replica refuses the connection, or cuts it, goes to the
other one (the cut attempt counts as a request of its own).

At the end it prints the figures and checks:
- every client request was answered: a success, or an Anthropic-shaped error (status and
  `{"type":"error",...}` body, or a stream ending in an `error` event); none hung past its
  timeout; connections cut only by the SIGKILL;
- the rolling restart lost nothing: every request sent while it ran was answered, none
  refused, none cut, the answers open at each SIGTERM finished;
- the usage log holds exactly one entry per served request (none lost, none doubled), and
  entries for no other request but those cut mid-stream;
- each key's spend equals the sum of the prices of what it was served (alpha's or beta's);
- the dashboard (any replica's, the fleet's view) lists every request that reached a proxy;
- no budget was exceeded by more than the requests in flight when it was reached.

`python -m tests.soak --seconds 600` (`make soak`); tests/test_soak.py runs forty seconds of it.
SOAK_LOG_LEVEL=INFO keeps the replicas' state lines (Redis lost and back) in their logs.
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
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import RedisServer, clean_env, eventually, free_port
from tests.scripted_upstream import ScriptedUpstream, completion, error_reply, text_stream
from tests.test_docker import shipped_redis_arguments

ADMIN_KEY = "sk-soak-admin-0123456789"
KEYS = {"ana": "sk-soak-ana-0123456789", "ben": "sk-soak-ben-0123456789"}
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
PRICES = {"alpha": (3.0, 15.0), "beta": (0.5, 1.5)}
"""USD per million input and output tokens."""
COST = {name: (i * USAGE["prompt_tokens"] + o * USAGE["completion_tokens"]) / 1e6
        for name, (i, o) in PRICES.items()}
BUDGET_PER_MINUTE = 0.25
"""ana's daily budget per minute of run: reached about halfway."""
CLIENTS_PER_KEY = 3
TIMEOUT = 30.0
FAULTS = ((0.10, "redis killed"), (0.22, "redis restarted"), (0.30, "alpha fails"),
          (0.40, "alpha recovers"), (0.45, "replica 2 killed (SIGKILL)"),
          (0.55, "replica 2 restarted"), (0.65, "rolling restart (SIGTERM)"))
DRAIN = {"DRAIN_DELAY": "2", "DRAIN_TIMEOUT": "30"}
"""The replicas' drain: the balancer sees a SIGTERM within a poll, well inside the delay."""
POLL_SECONDS = 0.2

CONFIG = """
[providers.alpha]
openai_base_url = "{alpha}"
openai_api_key = "sk-soak-upstream"
provider = "openai"
big_model = "alpha-model"
middle_model = "alpha-model"
small_model = "alpha-model"
retry_base_delay = 0
max_retries = 0
price_input = {alpha_in}
price_output = {alpha_out}

[providers.beta]
openai_base_url = "{beta}"
openai_api_key = "sk-soak-upstream"
provider = "openai"
big_model = "beta-model"
middle_model = "beta-model"
small_model = "beta-model"
retry_base_delay = 0
max_retries = 0
price_input = {beta_in}
price_output = {beta_out}

[router]
default = "alpha,alpha-model"
fallback = ["beta,beta-model"]
cooldown_failures = 2
cooldown_seconds = 3

[keys.ana]
key = "env:SOAK_KEY_ANA"
budget_usd = {budget}
budget_period = "day"

[keys.ben]
key = "env:SOAK_KEY_BEN"
"""


# ---------------------------------------------------------------- the pieces


class Upstream(ScriptedUpstream):
    """A scripted upstream answering `<name> answer` with USAGE, or 500 while `failing`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.failing = False
        self.responder = self.answer

    def answer(self, body: dict[str, Any]) -> Any:
        if self.failing:
            return error_reply(500, f"{self.name} is down")
        if body.get("stream"):
            return text_stream([f"{self.name} ", "answer"], usage=USAGE)
        return completion({"content": f"{self.name} answer"}, usage=USAGE)


def shipped_redis(folder: Path) -> RedisServer:
    """redis-server as docker-compose.yml and deploy/kubernetes.yaml run it (they agree:
    tests/test_docker.py), in `folder`: the append-only file fsynced on every write, so a
    SIGKILL loses nothing it acknowledged. (Without persistence, what Redis held dies with it:
    the proxy adds back only what it counted while Redis was away.)"""
    arguments = tuple(shipped_redis_arguments()["compose"])
    return RedisServer(free_port(), folder, arguments=arguments)


class Replica:
    """One `claude-proxy --workers 2` in its own process group (SIGKILL takes all of it)."""

    def __init__(self, config: Path, env: dict[str, str], folder: Path) -> None:
        self.config, self.env, self.folder = config, env, folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.folder / f"replica-{self.port}.out").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "claude_proxy", "--config", str(self.config), "--host",
             "127.0.0.1", "--port", str(self.port), "--workers", "2"],
            env=self.env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        assert eventually(self.serving, timeout=60), f"replica {self.url} did not start"

    def serving(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None

    def drain(self) -> None:
        """SIGTERM to the command's process only, as Kubernetes sends it to a pod's first
        process (its parent passes it on to the workers); returns once it has exited."""
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
            self.process = None


class Balancer:
    """A load balancer's view of the replicas: in rotation while /health answers 200."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.ready = {replica.url: True for replica in replicas}
        self.stopped = threading.Event()

    def watch(self) -> None:
        while not self.stopped.wait(POLL_SECONDS):
            for replica in self.replicas:
                self.ready[replica.url] = replica.serving()

    def pick(self, turn: int) -> tuple[str, str]:
        """A replica in rotation (any when none is), and another one for a failover."""
        urls = [replica.url for replica in self.replicas]
        ready = [url for url in urls if self.ready[url]] or urls
        first = ready[turn % len(ready)]
        return first, next((url for url in urls if url != first), first)


# ---------------------------------------------------------------- the clients


@dataclass
class Attempt:
    """One HTTP request a client made, and how it ended."""

    key: str
    stream: bool
    session: str
    url: str
    outcome: str = ""
    """served | error | cut (the connection broke after it was sent) | refused | hung |
    malformed"""
    request_id: str | None = None
    provider: str | None = None
    error_type: str | None = None
    sent: float = field(default_factory=time.monotonic)
    ended: float = 0.0
    phase: str = ""
    """The fault under way when it was sent (`rolling restart` while the replicas drain)."""


@dataclass
class Ledger:
    """What the clients saw, shared by their threads."""

    attempts: list[Attempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, attempt: Attempt) -> None:
        attempt.ended = time.monotonic()
        with self.lock:
            self.attempts.append(attempt)


def anthropic_error(data: Any) -> str | None:
    """The error type of an Anthropic-shaped error body, else None."""
    if isinstance(data, dict) and data.get("type") == "error":
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error.get("type"))
    return None


def judge(attempt: Attempt, response: httpx.Response, body: bytes) -> None:
    """served, or an Anthropic-shaped error, or malformed; which upstream answered."""
    attempt.request_id = response.headers.get("request-id")
    if response.status_code != 200:
        try:
            attempt.error_type = anthropic_error(json.loads(body))
        except ValueError:
            attempt.error_type = None
        attempt.outcome = "error" if attempt.error_type else "malformed"
        return
    if attempt.stream:
        events = [json.loads(line[6:]) for line in body.decode().splitlines()
                  if line.startswith("data: ")]
        last = events[-1] if events else {}
        text = "".join(e["delta"].get("text", "") for e in events
                       if e.get("type") == "content_block_delta")
        if last.get("type") == "error":
            attempt.error_type = anthropic_error(last)
            attempt.outcome = "error" if attempt.error_type else "malformed"
            return
        complete = last.get("type") == "message_stop"
    else:
        message = json.loads(body)
        text = "".join(block.get("text", "") for block in message.get("content") or [])
        complete = message.get("type") == "message"
    provider = text.removesuffix(" answer")
    attempt.provider = provider if provider in PRICES else None
    attempt.outcome = "served" if complete and attempt.provider else "malformed"


def one_request(url: str, key: str, stream: bool, ledger: Ledger, phase: str = "") -> Attempt:
    attempt = Attempt(key, stream, str(uuid.uuid4()), url, phase=phase)
    headers = {"x-api-key": KEYS[key], "x-claude-code-session-id": attempt.session}
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "soak"}]}
    try:
        with httpx.stream("POST", f"{url}/v1/messages", json=body, headers=headers,
                          timeout=httpx.Timeout(TIMEOUT, connect=2)) as response:
            judge(attempt, response, response.read())
    except httpx.ConnectError:
        attempt.outcome = "refused"
    except httpx.TimeoutException:
        attempt.outcome = "hung"
    except (httpx.TransportError, ValueError):
        attempt.outcome = "cut"
    ledger.add(attempt)
    return attempt


def client(number: int, key: str, soak: Soak, until: float, ledger: Ledger) -> None:
    """Requests one after the other, streamed and not in turn, spread over the replicas in
    rotation; a refused or cut attempt goes once to another replica (a failover)."""
    sent = 0
    while time.monotonic() < until:
        url, other = soak.balancer.pick(number + sent)
        stream = (number + sent) % 2 == 0
        attempt = one_request(url, key, stream, ledger, soak.phase)
        if attempt.outcome in ("refused", "cut"):
            one_request(other, key, stream, ledger, soak.phase)
        sent += 1


# ---------------------------------------------------------------- the run


@dataclass
class Soak:
    seconds: float
    folder: Path
    redis: RedisServer
    alpha: Upstream
    beta: Upstream
    replicas: list[Replica]
    budget: float
    balancer: Balancer
    started: float = 0.0
    events: list[str] = field(default_factory=list)
    killed_at: float = 0.0
    phase: str = ""
    sigterms: list[tuple[str, float]] = field(default_factory=list)
    """Each replica's SIGTERM of the rolling restart: its URL, when."""

    def fault(self, what: str) -> None:
        """One of FAULTS, done now."""
        if what == "redis killed":
            self.redis.kill()
        elif what == "redis restarted":
            self.redis.start()
        elif what == "alpha fails":
            self.alpha.failing = True
        elif what == "alpha recovers":
            self.alpha.failing = False
        elif what.startswith("replica 2 killed"):
            self.killed_at = time.monotonic()
            self.replicas[1].kill()
        elif what == "replica 2 restarted":
            self.replicas[1].start()
        elif what.startswith("rolling restart"):
            self.rolling_restart()
        self.events.append(f"{time.monotonic() - self.started:6.1f} s  {what}")

    def rolling_restart(self) -> None:
        """Each replica in turn: SIGTERM, drained and gone, started again, back in rotation
        before the next one goes (a Deployment's rolling update with maxUnavailable 0)."""
        self.phase = "rolling restart"
        for number, replica in enumerate(self.replicas, 1):
            self.sigterms.append((replica.url, time.monotonic()))
            replica.drain()
            self.events.append(f"{time.monotonic() - self.started:6.1f} s    replica {number} "
                               "drained and stopped")
            replica.start()
            assert eventually(lambda r=replica: self.balancer.ready[r.url], timeout=30)
        self.phase = ""


@contextmanager
def fleet(seconds: float, folder: Path) -> Iterator[Soak]:
    redis = shipped_redis(folder).start()
    alpha, beta = Upstream("alpha").start(), Upstream("beta").start()
    budget = round(BUDGET_PER_MINUTE * seconds / 60, 4)
    config = folder / "proxy.toml"
    config.write_text(CONFIG.format(alpha=alpha.base_url, beta=beta.base_url, budget=budget,
                                    alpha_in=PRICES["alpha"][0], alpha_out=PRICES["alpha"][1],
                                    beta_in=PRICES["beta"][0], beta_out=PRICES["beta"][1]))
    env = clean_env(folder, ANTHROPIC_API_KEY=ADMIN_KEY, REDIS_URL=redis.url,
                    REDIS_PREFIX=f"soak-{uuid.uuid4().hex[:8]}:", REDIS_TIMEOUT="0.2",
                    SOAK_KEY_ANA=KEYS["ana"], SOAK_KEY_BEN=KEYS["ben"],
                    DATA_DIR=str(folder / "data"),
                    LOG_LEVEL=os.environ.get("SOAK_LOG_LEVEL", "WARNING"), **DRAIN)
    replicas = [Replica(config, env, folder) for _ in range(2)]
    balancer = Balancer(replicas)
    soak = Soak(seconds, folder, redis, alpha, beta, replicas, budget, balancer)
    watching = threading.Thread(target=balancer.watch, daemon=True)
    try:
        for replica in replicas:
            replica.start()
        watching.start()
        yield soak
    finally:
        balancer.stopped.set()
        for replica in replicas:
            replica.stop()
        if redis.process is None:
            redis.start()
        redis.kill()
        alpha.stop()
        beta.stop()


def run(soak: Soak) -> Ledger:
    """The clients for `soak.seconds`, with FAULTS at their shares of it."""
    ledger = Ledger()
    soak.started = time.monotonic()
    until = soak.started + soak.seconds
    threads = [threading.Thread(target=client, args=(n, key, soak, until, ledger), daemon=True)
               for key in KEYS for n in range(CLIENTS_PER_KEY)]
    for thread in threads:
        thread.start()
    for share, what in FAULTS:
        time.sleep(max(0.0, soak.started + share * soak.seconds - time.monotonic()))
        soak.fault(what)
    for thread in threads:
        thread.join(timeout=TIMEOUT * 3)
    assert not any(thread.is_alive() for thread in threads), "a client never finished"
    return ledger


# ---------------------------------------------------------------- the figures


def admin_get(url: str, path: str) -> Any:
    response = httpx.get(f"{url}{path}", headers={"x-api-key": ADMIN_KEY}, timeout=30)
    response.raise_for_status()
    return response.json()


def dashboard_ids(url: str) -> tuple[set[str], int]:
    """The request ids the dashboard's page gets first (its `hello`), and its row limit."""
    with httpx.stream("GET", f"{url}/ui/feed", headers={"x-api-key": ADMIN_KEY},
                      timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                hello = json.loads(line[6:])
                return {str(row["id"]) for row in hello["requests"]}, int(hello["rows_limit"])
    return set(), 0


def where_served(soak: Soak, attempt: Attempt) -> str:
    """Which replica answered, and when, next to the SIGKILL: where a loss came from."""
    replica = 1 + [r.url for r in soak.replicas].index(attempt.url)
    return (f"replica {replica} at {attempt.ended - soak.killed_at:+.2f} s from the SIGKILL"
            if soak.killed_at else f"replica {replica}")


@dataclass
class Figures:
    lines: list[str]
    failures: list[str]
    attempts: list[Attempt] = field(default_factory=list)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)


def figures(soak: Soak, ledger: Ledger) -> Figures:
    """The numbers of the run, and every check that did not hold."""
    url = soak.replicas[0].url
    attempts = ledger.attempts
    by = {outcome: [a for a in attempts if a.outcome == outcome]
          for outcome in ("served", "error", "cut", "refused", "hung", "malformed")}
    served, cut = by["served"], by["cut"]
    errors: dict[str, int] = {}
    for attempt in by["error"]:
        errors[str(attempt.error_type)] = errors.get(str(attempt.error_type), 0) + 1
    failures = []
    if by["hung"] or by["malformed"]:
        failures.append(f"{len(by['hung'])} hung, {len(by['malformed'])} malformed answers")
    if len(cut) > len(KEYS) * CLIENTS_PER_KEY:
        failures.append(f"{len(cut)} cut connections: more than the clients at the SIGKILL")
    # The usage log: one entry per served request, entries for no other but cut ones.
    assert eventually(lambda: all(r.serving() for r in soak.replicas), timeout=30)
    rows = admin_get(url, "/v1/usage?group_by=session")["data"]
    entries = {row["session"]: row for row in rows}
    lost = [a.session for a in served if a.session not in entries]
    doubled = [s for s, row in entries.items() if row["requests"] > 1]
    cut_sessions = {a.session for a in cut}
    served_sessions = {a.session for a in served}
    strays = [s for s in entries if s not in served_sessions and s not in cut_sessions]
    if lost or doubled or strays:
        failures.append(f"usage log: {len(lost)} served requests missing, {len(doubled)} "
                        f"doubled, {len(strays)} entries of requests not served")
    where = [where_served(soak, a) for a in served if a.session not in entries]
    rolling_line = rolling_restart(soak, attempts, failures)
    # Spend: each key's counter against the prices of what it was served.
    spend_lines = []
    for key in KEYS:
        expected = sum(COST[a.provider] for a in served if a.key == key and a.provider)
        charged_cut = sum(float(entries[a.session]["cost_usd"]) for a in cut
                          if a.key == key and a.session in entries)
        seen = [float(httpx.get(f"{replica.url}/v1/usage/me", timeout=30,
                                headers={"x-api-key": KEYS[key]}).json()["period_usd"])
                for replica in soak.replicas]
        spent = seen[0]
        logged = sum(float(entries[a.session]["cost_usd"]) for a in attempts
                     if a.key == key and a.session in entries)
        spend_lines.append(f"  {key}: spend ${spent:.4f} (replica 2 sees ${seen[1]:.4f}); "
                           f"served ${expected:.4f} + cut ${charged_cut:.4f}; usage log "
                           f"${logged:.4f}")
        if abs(seen[1] - seen[0]) > 1e-4:
            failures.append(f"spend of {key}: the replicas disagree (${seen[0]:.6f}, "
                            f"${seen[1]:.6f})")
        if abs(spent - expected - charged_cut) > 1e-4 or abs(logged - spent) > 1e-4:
            failures.append(f"spend of {key}: ${spent:.6f}, prices of what was served "
                            f"${expected + charged_cut:.6f}, usage log ${logged:.6f}")
    # Budget: ana's spend past her budget, at most the requests in flight when reached.
    ana_spent = float(httpx.get(f"{url}/v1/usage/me", headers={"x-api-key": KEYS["ana"]},
                                timeout=30).json()["period_usd"])
    overshoot = max(0.0, ana_spent - soak.budget)
    allowed = CLIENTS_PER_KEY * max(COST.values())
    if overshoot > allowed + 1e-9:
        failures.append(f"ana's budget ${soak.budget:.4f} exceeded by ${overshoot:.4f} (in "
                        f"flight: at most ${allowed:.4f})")
    # The dashboard: every request that reached a proxy (the last rows_limit of them).
    reached = sorted((a for a in attempts if a.request_id), key=lambda a: a.ended)
    listed, limit = dashboard_ids(url)
    wanted = {a.request_id for a in reached[-limit:]} if limit else set()
    missing = sorted(str(r) for r in wanted - listed)
    if missing:
        failures.append(f"dashboard: {len(missing)} of the last {len(wanted)} requests not "
                        "listed")
    unlisted = [where_served(soak, a) for a in reached[-limit:] if a.request_id in missing]
    not_listed = f"; missing: {', '.join(unlisted)}" if unlisted else ""
    lines = [f"soak: {soak.seconds:g} s, 2 replicas x 2 workers, one Redis; "
             f"{len(KEYS) * CLIENTS_PER_KEY} clients, keys {', '.join(KEYS)} (ana's budget "
             f"${soak.budget:.4f} a day)", *soak.events,
             f"requests: {len(attempts)} attempts: {len(served)} served "
             f"({sum(a.provider == 'alpha' for a in served)} by alpha, "
             f"{sum(a.provider == 'beta' for a in served)} by beta; "
             f"{sum(a.stream for a in served)} streamed), {len(by['error'])} Anthropic errors "
             f"{errors}, {len(cut)} cut by the SIGKILL, {len(by['refused'])} refused "
             f"connections, {len(by['hung'])} hung, {len(by['malformed'])} malformed",
             rolling_line,
             f"usage log: {sum(row['requests'] for row in rows)} entries for "
             f"{len(served)} served and {len(cut)} cut; {len(lost)} lost, {len(doubled)} "
             f"doubled, {len(strays)} stray{'; lost: ' + ', '.join(where) if where else ''}",
             *spend_lines,
             f"budget: ana spent ${ana_spent:.4f} of ${soak.budget:.4f} (over by "
             f"${overshoot:.4f}; in flight at most ${allowed:.4f})",
             f"dashboard: {len(wanted) - len(missing)} of the last {len(wanted)} requests "
             f"listed (rows limit {limit}){not_listed}"]
    return Figures(lines, failures, attempts, entries)


def rolling_restart(soak: Soak, attempts: list[Attempt], failures: list[str]) -> str:
    """What the rolling restart did to the requests: those sent while it ran all answered
    (none refused, none cut), and those open on a replica at its SIGTERM all finished."""
    during = [a for a in attempts if a.phase == "rolling restart"]
    unanswered = [a for a in during if a.outcome not in ("served", "error")]
    open_then = [a for a in attempts for url, at in soak.sigterms
                 if a.url == url and a.sent < at < a.ended]
    cut = [a for a in open_then if a.outcome not in ("served", "error")]
    if unanswered or cut:
        failures.append(f"rolling restart: {len(unanswered)} of {len(during)} requests not "
                        f"answered, {len(cut)} of the {len(open_then)} open at a SIGTERM cut")
    streams = sum(a.stream for a in open_then)
    return (f"rolling restart: {len(during)} requests sent while it ran, {len(unanswered)} "
            f"not answered; {len(open_then)} open at the SIGTERMs ({streams} streams), "
            f"{len(cut)} cut")


def soak(seconds: float, say: Callable[[str], None] = print) -> Figures:
    with tempfile.TemporaryDirectory(prefix="soak-") as directory, \
            fleet(seconds, Path(directory)) as running:
        ledger = run(running)
        result = figures(running, ledger)
    for line in result.lines:
        say(line)
    for failure in result.failures:
        say(f"FAIL  {failure}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak")
    parser.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args()
    return 1 if soak(args.seconds).failures else 0


if __name__ == "__main__":
    sys.exit(main())
