"""The dashboard's memory: bounded ring buffers fed by the access log's request records.

The access middleware tells the recorder when a request starts and when it has finished;
the record is the one the access line is written from, so nothing is measured twice. When a
request ends the recorder keeps
- a summary row, in a ring of the last `rows` requests,
- the whole record (bodies and streamed events, by reference) for the last
  INSPECT_REQUESTS requests, for the inspector, as long as their bodies take no more than
  INSPECT_BYTES together (the oldest go first),
- its numbers in the per-minute buckets of the last hour (charts, provider success rates).
Nothing grows with traffic. No per-chunk work happens here: what a request in flight is
streaming is read from its record only when an open dashboard asks (once a second).

These buffers are this process's own. With a shared state store (REDIS_URL) each finished
request is also written to it (`FleetLog`): its row to a bounded log, its numbers to the
minute's counters, its bodies (redacted) to one of this process's INSPECT_REQUESTS slots that
expire; the page then shows the whole fleet, and says which processes it sees. Without one,
or while it is away, the page shows this process and says so (`scope()`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from claude_proxy.logs import REDACTED, redact
from claude_proxy.record import RequestRecord, stop_reason_of
from claude_proxy.routing.providers import Provider
from claude_proxy.sse import decode_frames
from claude_proxy.state.store import StateStore
from claude_proxy.ui.fleet import FleetLog, Seen
from claude_proxy.ui.inspect import error_of, inspector_view
from claude_proxy.ui.series import TOKEN_KINDS, MinuteSeries

logger = logging.getLogger("claude_proxy.ui")

RECORDED_PATHS = frozenset({"/v1/messages"})
WORKERS_VARIABLE = "CLAUDE_PROXY_WORKERS"
"""Set by `claude-proxy --workers N` so that each worker can say it is one of N."""
FEED_BACKLOG = 512
"""Updates a slow viewer may fall behind by before it is sent a fresh snapshot instead."""


@dataclass(frozen=True)
class ProviderHealth:
    """A provider's state as routing sees it; the recorder adds what it measured."""

    name: str
    state: str = "healthy"
    """healthy, or cooling down"""
    until: float | None = None
    """Wall-clock time the cool-down ends."""
    last_error: str | None = None
    attempts: int | None = None
    """Attempts the provider answered or failed since the process started."""
    succeeded: int | None = None


HealthSource = Callable[[], list[ProviderHealth]]
KeysSource = Callable[[], list[dict[str, Any]]]
"""Each team key's spend against its budget (spend.Ledger.panel), for the Keys panel."""

STATE_NAMES = {"healthy": "healthy", "cooling": "cooling down", "probing": "probing"}


def provider_health(providers: Mapping[str, Provider]) -> list[ProviderHealth]:
    """What each provider's circuit breaker says (routing/health.py), for the panel."""
    listed = []
    for name, provider in providers.items():
        health = provider.health.snapshot()
        state = STATE_NAMES.get(health.state, health.state)
        if health.misconfigured and health.state == "healthy":
            state = "key refused"
        listed.append(ProviderHealth(name, state, health.cooling_until, health.last_error,
                                     health.successes + health.failures, health.successes))
    return listed


@dataclass
class Flight:
    """A request in flight and how far an open dashboard has read its streamed events."""

    record: RequestRecord
    read: int = 0
    chars: int = 0
    phase: str = "waiting for the upstream"

    def catch_up(self) -> None:
        """Read the events streamed since the last look (only while someone watches)."""
        frames = self.record.events
        for event in decode_frames(frames[self.read:]):
            self._see(event)
        self.read = len(frames)

    def _see(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "content_block_start":
            block = event["content_block"]
            self.phase = (f"tool {block.get('name')}" if block["type"] == "tool_use"
                          else str(block["type"]))
        elif kind == "content_block_delta":
            delta = event["delta"]
            text = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
            self.chars += len(text)
        elif kind == "message_delta":
            self.phase = "finishing"


def scope() -> dict[str, Any]:
    """Which process this dashboard describes, and out of how many."""
    try:
        workers = max(1, int(os.environ.get(WORKERS_VARIABLE, "1")))
    except ValueError:
        workers = 1
    return {"pid": os.getpid(), "workers": workers}


def ms(start: float, end: float | None) -> float | None:
    return None if end is None else round((end - start) * 1e3, 1)


def timeline_of(record: RequestRecord, finished: float) -> list[list[Any]]:
    """[milliseconds since received, event, detail], in order."""
    moments: list[tuple[float, str, str]] = [(record.started, "received", record.path)]
    moments += record.timeline
    if record.first_byte is not None:
        moments.append((record.first_byte, "first client byte", str(record.status)))
    moments.append((finished, "end", str(record.status)))
    moments.sort(key=lambda moment: moment[0])
    return [[ms(record.started, at), event, detail] for at, event, detail in moments]


def last_attempt(record: RequestRecord) -> tuple[str, str]:
    """(provider, model) of the request: the one that answered, else the last one tried."""
    if record.provider != "-":
        return record.provider, record.upstream_model
    for _, event, detail in reversed(record.timeline):
        if event == "upstream request":
            provider, _, model = detail.partition(",")
            return provider, model
    return record.provider, record.upstream_model


def summarise(record: RequestRecord, finished: float, now: float) -> dict[str, Any]:
    """The row of the Requests table (what the access line says, and a little more)."""
    error = error_of(record) if record.status >= 400 or record.events else None
    provider, model = last_attempt(record)
    return {
        "id": record.request_id,
        "at": round(now - (finished - record.started), 3),
        "client_model": record.client_model,
        "provider": provider,
        "model": model,
        "route": record.route,
        "session": record.session,
        "agent": record.agent,
        "request_class": record.request_class,
        "prompt_id": record.prompt_id,
        "key": record.key,
        "cost": record.cost,
        "failover": list(record.failover),
        "status": record.status,
        "stream": record.stream,
        "ttfb": ms(record.started, record.first_byte),
        "total": ms(record.started, finished),
        "tokens": {kind: record.tokens.get(kind, 0) for kind in TOKEN_KINDS},
        "stop": stop_reason_of(record),
        "trace": record.trace.trace_id if record.trace is not None else None,
        "error": error.get("type") if error else None,
        "retries": sum(1 for _, event, _ in record.timeline if event == "retry"),
        "timeline": timeline_of(record, finished),
        "tool_calls": record.tool_outcomes(),
    }


class Subscription:
    """One open dashboard's queue of updates."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(FEED_BACKLOG)
        self.behind = False

    def push(self, event: str, data: Any) -> None:
        try:
            self.queue.put_nowait((event, data))
        except asyncio.QueueFull:
            self.behind = True


class Recorder:
    """Observes the access middleware (see `access.RecordObserver`)."""

    def __init__(self, *, inspect: int, secrets: list[str], health: HealthSource,
                 rows: int = 1000, minutes: int = 60, store: StateStore | None = None,
                 keys: KeysSource | None = None, inspect_bytes: int = 16 * 1024 * 1024,
                 configuration: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.inspect_limit = inspect
        self.inspect_bytes = inspect_bytes
        self.kept_bytes = 0
        self.rows: deque[dict[str, Any]] = deque(maxlen=rows)
        self.kept: OrderedDict[str, RequestRecord] = OrderedDict()
        self.kept_sizes: dict[str, int] = {}
        """Each kept record's `kept_size`, taken once."""
        self.in_flight: dict[str, Flight] = {}
        self.series = MinuteSeries(minutes)
        self.health = health
        self.keys = keys
        self.configuration = configuration
        """The configuration served and its last reload (server/reload.py)."""
        self.subscriptions: set[Subscription] = set()
        self._secrets = sorted(secrets, key=len, reverse=True)
        self.fleet = (FleetLog(store, rows=rows, inspect=inspect, minutes=minutes,
                               workers=scope()["workers"])
                      if store is not None and store.distributed else None)
        """The fleet's view through a shared store (None: this process is all there is)."""

    def add_secrets(self, secrets: list[str]) -> None:
        """Secrets a reload brought: replaced in what is kept from now on too."""
        self._secrets = sorted(set(self._secrets) | set(secrets), key=len, reverse=True)

    # ------------------------------------------------------------ fed by the middleware

    def started(self, record: RequestRecord) -> None:
        if record.path in RECORDED_PATHS:
            self.in_flight[record.request_id] = Flight(record)

    def finished(self, record: RequestRecord, finished: float) -> None:
        if self.in_flight.pop(record.request_id, None) is None:
            return
        now = time.time()
        row = summarise(record, finished, now)
        self.rows.append(row)
        self.series.add(row, now)
        if self.inspect_limit:
            self._keep(record.for_keeping())
        if self.fleet is not None:
            self.fleet.add(row, now, self._stored_view(record) if self.inspect_limit else None)
        for subscription in self.subscriptions:
            subscription.push("request", row)

    def _keep(self, record: RequestRecord) -> None:
        """Into the inspector's ring; the oldest out while there are more than
        INSPECT_REQUESTS, or their bodies take more than INSPECT_BYTES (the newest stays)."""
        size = record.kept_size()
        self.kept_bytes -= self.kept_sizes.pop(record.request_id, 0)  # the same id again
        self.kept[record.request_id] = record
        self.kept_sizes[record.request_id] = size
        self.kept_bytes += size
        while len(self.kept) > self.inspect_limit or (
                self.kept_bytes > self.inspect_bytes and len(self.kept) > 1):
            oldest, _ = self.kept.popitem(last=False)
            self.kept_bytes -= self.kept_sizes.pop(oldest)

    # ------------------------------------------------------------ read by the dashboard

    def _stored_view(self, record: RequestRecord) -> str:
        """The inspector's view as the fleet stores it: configured secrets replaced at once
        (a substring test); the patterns of logs.redact are applied when a page is sent it
        (`dumps`), as for this process's own requests: on a Claude Code body they cost
        milliseconds, too much for every request."""
        text = orjson.dumps(inspector_view(record)).decode()
        if any(secret in text for secret in self._secrets):
            text = self.dumps(orjson.loads(text)).decode()
        return text

    def sizes(self) -> dict[str, int]:
        """How much is held (for tests: these never exceed their limits)."""
        return {"rows": len(self.rows), "kept": len(self.kept), "kept_bytes": self.kept_bytes,
                "in_flight": len(self.in_flight), "minutes": len(self.series.buckets)}

    def now(self) -> list[dict[str, Any]]:
        """The requests in flight, with what each is streaming and about how much."""
        clock = time.perf_counter()
        flights = []
        for flight in list(self.in_flight.values()):
            flight.catch_up()
            record = flight.record
            retried = any(event == "retry" for _, event, _ in record.timeline)
            phase = ("retrying" if retried and not record.events and flight.phase.startswith(
                "waiting") else flight.phase)
            flights.append({
                "id": record.request_id, "client_model": record.client_model,
                "provider": record.provider, "model": record.upstream_model,
                "route": record.route, "elapsed": ms(record.started, clock),
                "stream": record.stream, "phase": phase,
                "tokens": flight.chars // 4})
        return flights

    def providers(self, stats: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Each provider's health and its numbers over the last minutes (`stats`: the
        fleet's; default this process's)."""
        stats = dict(self.series.provider_stats(time.time()) if stats is None else stats)
        listed = []
        for health in self.health():
            measured = stats.pop(health.name, {})
            listed.append({"name": health.name, "state": health.state, "until": health.until,
                           "last_error": health.last_error, "attempts": health.attempts,
                           "succeeded": health.succeeded, **measured})
        listed += [{"name": name, "state": "unknown", "until": None, "last_error": None,
                    "attempts": None, "succeeded": None, **measured}
                   for name, measured in stats.items() if name != "-"]
        return listed

    def live(self) -> dict[str, Any]:
        """What changes by itself every second: in flight, providers, keys, charts."""
        now = time.time()
        return self._live(now, self.series, self.providers())

    def _live(self, now: float, series: MinuteSeries,
              providers: list[dict[str, Any]]) -> dict[str, Any]:
        """`live()` from the charts and provider numbers given (this process's, or the
        fleet's): one place for what a live event holds, whichever view sends it."""
        return {"now": self.now(), "providers": providers,
                "keys": self.keys() if self.keys is not None else [],
                "series": series.snapshot(now), "tools": series.tool_stats(now),
                "server_time": now,
                "configuration": self.configuration() if self.configuration is not None
                else None}

    def snapshot(self) -> dict[str, Any]:
        """Everything a dashboard shows, for a page that has just connected."""
        return {"scope": scope(), "inspect_requests": self.inspect_limit,
                "rows_limit": self.rows.maxlen, "requests": list(self.rows),
                "kept": list(self.kept), **self.live()}

    def row(self, request_id: str) -> dict[str, Any] | None:
        return next((row for row in reversed(self.rows) if row["id"] == request_id), None)

    def inspect(self, request_id: str) -> dict[str, Any] | None:
        """The inspector's view of one request: its row, and its bodies while kept."""
        row = self.row(request_id)
        record = self.kept.get(request_id)
        if row is None and record is None:
            return None
        view: dict[str, Any] = {"row": row, "kept": record is not None,
                                "inspect_requests": self.inspect_limit,
                                "inspect_bytes": self.inspect_bytes}
        if record is not None:
            view.update(inspector_view(record))
        return view

    # ------------------------------------------------------------ the fleet's view

    def sharing(self) -> bool:
        return self.fleet is not None and self.fleet.store.shared

    async def fleet_snapshot(self) -> dict[str, Any]:
        """`snapshot()`, of every process when the store is shared."""
        if self.fleet is None or not self.sharing():
            return {**self.snapshot(), "scope": {**scope(), **self._backend()}}
        rows = await self.fleet.rows()
        return {"scope": {**scope(), **self._backend(),
                          "processes": await self.fleet.processes(rows)},
                "inspect_requests": self.inspect_limit, "rows_limit": self.rows.maxlen,
                "requests": rows, "kept": self.fleet.kept(rows), **await self.fleet_live()}

    async def fleet_live(self) -> dict[str, Any]:
        """`live()`, with the charts and provider numbers of every process when shared;
        requests in flight are this process's own (`now_process` says whose)."""
        if self.fleet is None or not self.sharing():
            return self.live()
        now = time.time()
        series = await self.fleet.series(now)
        live = {**self._live(now, series, self.providers(series.provider_stats(now))),
                "now_process": self.fleet.process}
        self.fleet.heartbeat(now)
        return live

    async def fleet_inspect(self, request_id: str) -> dict[str, Any] | None:
        """`inspect()`, falling back to the shared store for a request another process
        served."""
        view = self.inspect(request_id)
        if view is not None or self.fleet is None or not self.sharing():
            return view
        return await self.fleet.inspect(request_id, self.inspect_limit)

    async def fleet_news(self, seen: Seen) -> list[dict[str, Any]]:
        """Rows other processes finished that this feed (`seen`) has not sent yet."""
        if self.fleet is None or not self.sharing():
            return []
        return await self.fleet.news(seen)

    def _backend(self) -> dict[str, Any]:
        if self.fleet is None:
            return {"shared": False}
        described = self.fleet.store.describe()
        return {"shared": self.sharing(), "process": self.fleet.process,
                "backend": described.get("state")}

    def subscribe(self) -> Subscription:
        subscription = Subscription()
        self.subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)

    def dumps(self, data: Any) -> bytes:
        """JSON for the page, every secret redacted exactly as the logs do (logs.redact)."""
        raw = orjson.dumps(data)
        text = raw.decode()
        if not _may_hold_a_secret(text, self._secrets):
            return raw
        text = redact(text, self._secrets)
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            # A redaction cut through a JSON escape: redact value by value instead.
            text = orjson.dumps(_redact_values(data, self._secrets)).decode()
        return text.encode()


SECRET_FIELDS = frozenset({"authorization", "x-api-key", "api-key"})
REDACTION_CUES = ("authorization", "api-key", "bearer", "sk-")
"""Every pattern of logs.redact needs one of these (case-insensitive) to match at all."""


def _may_hold_a_secret(text: str, secrets: list[str]) -> bool:
    """Whether logs.redact could change the text: a cheap test that spares the regexes on
    the usual payload (a snapshot of 1000 rows: ~45 ms of regex otherwise)."""
    lowered = text.lower()
    return (any(cue in lowered for cue in REDACTION_CUES)
            or any(secret in text for secret in secrets))


def _redact_values(data: Any, secrets: list[str]) -> Any:
    if isinstance(data, str):
        return redact(data, secrets)
    if isinstance(data, dict):
        return {key: REDACTED if str(key).lower() in SECRET_FIELDS
                else _redact_values(value, secrets) for key, value in data.items()}
    if isinstance(data, list):
        return [_redact_values(value, secrets) for value in data]
    return data
