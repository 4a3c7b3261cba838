"""What each request cost, from the upstream's real usage, and whose spend it is.

The access middleware hands every finished Messages request's record to the ledger (after the
response is sent, so nothing here is on its critical path). The record's tokens are the
upstream's usage of the attempt that answered: streamed or not, and for a client that left
mid-stream, the usage the upstream sent or else the converter's estimate of the output so far.
Attempts that failed before their first byte answered an error, which upstreams do not bill.

Cost = input × price_input + output × price_output + cache reads × price_cache_read + cache
writes × price_cache_write, per million tokens (cache prices default to the input price). The
ledger adds it to the key's period counter and today's counter in the state store, adds the
tokens to the minute's tpm counter, and writes one usage entry to the usage log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from claude_proxy.config.key_specs import KeySpec, Period
from claude_proxy.config.model_table import ModelFacts, ModelTable
from claude_proxy.keys.budget import Clock, minute_counter, period_bounds, spend_counter
from claude_proxy.keys.ring import KeyRing
from claude_proxy.metrics import Metrics
from claude_proxy.record import RequestRecord
from claude_proxy.state.store import Record, StateStore

logger = logging.getLogger("claude_proxy.spend")

CHARGED_PATHS = frozenset({"/v1/messages"})
ADMIN_PERIOD: Period = "month"
USAGE_FIELDS = ("input", "output", "cache_read", "cache_write")
"""The token kinds of a usage entry (the access record's names)."""


def cost_usd(facts: ModelFacts, tokens: dict[str, int]) -> float | None:
    """The request's price in dollars, or None when the model has no price."""
    prices = facts.prices()
    if prices is None:
        return None
    return sum(tokens.get(kind, 0) * price for kind, price in zip(USAGE_FIELDS, prices,
                                                                  strict=True)) / 1e6


class UsageLog(Protocol):
    """Where usage entries are kept for `/v1/usage`: the state store's log (shared), or the
    SQLite file of DATA_DIR (one process, kept across restarts)."""

    where: str | None
    """The file it is kept in (None: the state store)."""

    def record(self, entry: Record) -> None: ...

    async def entries(self, since: float, until: float) -> list[Record]: ...

    def spent(self, key: str, since: float) -> float: ...

    def close(self) -> None: ...


class StoreUsageLog:
    """Usage entries in the state store's bounded log (fleet-wide with Redis)."""

    LOG = "usage"
    MAXLEN = 100_000
    where: str | None = None

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def record(self, entry: Record) -> None:
        self.store.append(self.LOG, entry, self.MAXLEN)

    async def entries(self, since: float, until: float) -> list[Record]:
        return [entry for entry in await self.store.read_log(self.LOG, self.MAXLEN)
                if since <= float(entry.get("ts", 0)) < until]

    def spent(self, key: str, since: float) -> float:
        return 0.0  # a shared store keeps its counters itself

    def close(self) -> None:
        return None


def open_usage_log(store: StateStore, directory: Path) -> UsageLog:
    """The state store's log with a shared store; without one, the SQLite file of DATA_DIR
    (the store's in-process log, after one ERROR, when the file cannot be kept)."""
    if store.describe().get("backend") != "in-process":
        return StoreUsageLog(store)
    # Only here: SQLite's library takes ~1 MiB of resident memory once loaded, and a
    # proxy without [keys] never keeps usage.
    import sqlite3

    from claude_proxy.keys.usage_log import SqliteUsageLog

    try:
        return SqliteUsageLog(directory)
    except (OSError, sqlite3.Error) as exc:
        logger.error("cannot keep spend in DATA_DIR %s (%s): spend is counted in this "
                     "process only and a restart forgets it", directory, exc)
        return StoreUsageLog(store)


class Ledger:
    """Charges finished requests to their key (see the module docstring). One per
    configuration (a reload makes another, sharing the usage log): a request is charged by
    the ledger of the configuration it started on."""

    def __init__(self, keys: KeyRing, models: ModelTable, store: StateStore,
                 metrics: Metrics, clock: Clock, log: UsageLog) -> None:
        self.keys = keys
        self.models = models
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.log = log

    def period_of(self, name: str) -> Period:
        spec = self.keys.spec(name)
        return spec.budget_period if spec is not None else ADMIN_PERIOD

    async def settle(self, record: RequestRecord) -> None:
        """Charges the request before its response ends, and hands the charge to the shared
        store (written to its connection; its reply is read by the next call): a client that
        has its whole answer is never admitted again on a spend that misses it, and a process
        killed after answering has lost no usage entry (tests/soak.py). One command written
        at the end of a keyed request, not waited for; none without a shared store."""
        if self.charge(record):
            await self.store.post()

    def charge(self, record: RequestRecord) -> bool:
        """One finished request: its cost on the record (for the access line and dashboard),
        the key's counters, the metric, and the usage entry. Once per request: False when
        there was nothing (more) to charge."""
        if record.charged:
            return False
        record.charged = True
        if record.path not in CHARGED_PATHS or record.key == "-" or not record.tokens:
            return False
        facts = self.models.facts(record.provider, record.upstream_model)
        cost = cost_usd(facts, record.tokens)
        record.cost = cost
        now = self.clock()
        amount = cost or 0.0
        self._count(record.key, amount, now)
        spec = self.keys.spec(record.key)
        if spec is not None and spec.tpm is not None:
            counter, ttl = minute_counter("tpm", spec.name, now)
            self.store.add(counter, float(sum(record.tokens.get(k, 0) for k in USAGE_FIELDS)),
                           ttl)
        if amount:
            self.metrics.cost.labels(record.key, record.provider,
                                     record.upstream_model).inc(amount)
        self.log.record(usage_entry(record, now, amount))
        return True

    def _count(self, name: str, amount: float, now: float) -> None:
        period = self.period_of(name)
        for counted in {period, "day"}:
            counter, ttl = spend_counter(name, counted, now)
            self.store.add(counter, amount, ttl)

    def restore(self, names: list[str]) -> None:
        """These keys' spend of their current period and of today, from the usage log's file
        (without a shared store; once per key and process, at start or when a reload adds
        it): the counters survive a restart."""
        if self.log.where is None:
            return
        now = self.clock()
        for name in names:
            for period in {self.period_of(name), "day"}:
                start, _ = period_bounds(period, now)
                spent = self.log.spent(name, start.timestamp())
                if spent:
                    counter, ttl = spend_counter(name, period, now)
                    self.store.add(counter, spent, ttl)

    async def durability(self) -> Record | None:
        """Where spend is kept and whether it survives a restart, when a key has a budget
        (None otherwise): the usage file of one process, or what the shared store says of
        itself (`StateStore.durability`), with a `warning` when spend would be lost."""
        if not any(spec.budget_usd is not None for spec in self.keys.keys.values()):
            return None
        if self.log.where is not None:
            return {"kept": f"SQLite file {self.log.where} (this process only; with several "
                    "processes use REDIS_URL)", "warning": None}
        if self.store.describe().get("backend") == "in-process":
            return {"kept": "in this process only", "warning": "spend is counted in this "
                    "process only: a restart forgets it (DATA_DIR could not be written)"}
        found = await self.store.durability()
        if found is None:
            return {"kept": "Redis", "warning": None,
                    "persistence": "unknown: Redis does not answer"}
        return {"kept": "Redis", **found}

    def panel(self) -> list[dict[str, Any]]:
        """The dashboard's Keys panel: each key's spend in its period against its budget,
        and when the period resets (names only)."""
        now = self.clock()
        listed = []
        for spec in self.keys.keys.values():
            _, end = period_bounds(spec.budget_period, now)
            listed.append({"name": spec.name, "period": spec.budget_period,
                           "spent": round(self.in_period(spec, spec.name), 6),
                           "budget": spec.budget_usd, "resets": end.timestamp(),
                           "today": round(self.today(spec.name), 6),
                           "rpm": spec.rpm, "tpm": spec.tpm})
        return listed

    def today(self, name: str) -> float:
        return self.store.total(spend_counter(name, "day", self.clock())[0])

    def in_period(self, spec: KeySpec | None, name: str) -> float:
        period = spec.budget_period if spec is not None else ADMIN_PERIOD
        return self.store.total(spend_counter(name, period, self.clock())[0])

    async def spent_now(self, spec: KeySpec | None, name: str) -> tuple[float, float]:
        """Today's spend and the period's, as the fleet has them now (the shared store's
        figures, not this process's copies of them, which can lag after an outage: `make
        soak` saw a replica's copy 20 requests short ten seconds later); what `/v1/usage/me`
        answers. The local copies without a shared store."""
        now = self.clock()
        period = spec.budget_period if spec is not None else ADMIN_PERIOD
        figures = []
        for kind in ("day", period):
            counter, ttl = spend_counter(name, kind, now)
            figures.append(await self.store.fresh_total(counter, ttl))
        return figures[0], figures[1]


def usage_entry(record: RequestRecord, now: float, cost: float) -> Record:
    """What `/v1/usage` adds up: names and numbers, never a key or its hash."""
    entry: dict[str, Any] = {"ts": now, "key": record.key, "provider": record.provider,
                             "model": record.upstream_model, "route": record.route,
                             "session": record.session, "agent": record.agent,
                             "request_class": record.request_class, "prompt_id": record.prompt_id,
                             "cost_usd": cost}
    for kind in USAGE_FIELDS:
        entry[kind] = record.tokens.get(kind, 0)
    return entry
