"""The few storage operations the features need, and nothing more.

Features keep their own logic (health decides when a provider cools down; keys decide when a
budget is spent) and ask the store only to keep numbers and records:
- counters (`add` / `total`): floats that accumulate, each key with an optional expiry;
- small records (`put` / `get` / `delete`): a JSON-able dict per key with an optional expiry;
- bounded logs (`append` / `read_log`): newest entries kept, oldest dropped past `maxlen`;
- `claim`: a compare-and-set, true for exactly one caller in the fleet until it expires;
- grouped counters (`add_fields` / `read_fields`): several named counters under one key that
  expires as a whole (e.g. a minute of the dashboard's series);
- `add_total` and `fetch`: the counter's or the record's fleet-wide value now, for the few
  places that must not act on a copy up to a second old (a failure that may open a cooldown;
  a session first seen by this process).

Reads on the hot path (`total`, `get`) are synchronous and served from a local copy (for a
shared backend, at most about a second old); writes (`add`, `put`, `append`, `delete`) return
at once and reach a shared backend off the response's critical path. A shared backend that is
slow or gone never fails a call: it falls back to in-process state (fail open) and says so in
`describe()`.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from typing import Any
from urllib.parse import urlsplit

Record = dict[str, Any]


def process_name() -> str:
    """This process as the fleet names it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def display_url(url: str) -> str:
    """The URL without its user and password (for logs, /health, the dashboard, doctor)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class StateStore(ABC):
    """Storage for what the fleet learns; see the module docstring for the contract."""

    distributed = False
    """Whether this backend is meant to be seen by other processes (even while it is away):
    features then write what only other processes would read (the dashboard's rows)."""

    @abstractmethod
    def add(self, key: str, amount: float = 1.0, ttl: float | None = None) -> None:
        """Adds `amount` to the counter `key` (created at 0); `ttl` seconds sets its expiry."""

    @abstractmethod
    def total(self, key: str) -> float:
        """The counter's value (0.0 when unknown or expired)."""

    @abstractmethod
    def put(self, key: str, value: Record, ttl: float | None = None) -> None:
        """Stores a record, replacing any earlier one."""

    @abstractmethod
    def get(self, key: str) -> Record | None:
        """The record, or None when unknown or expired."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Forgets a record or a counter."""

    @abstractmethod
    def append(self, log: str, entry: Record, maxlen: int) -> None:
        """Adds an entry to a bounded log (the oldest dropped past about `maxlen`)."""

    @abstractmethod
    async def read_log(self, log: str, count: int) -> list[Record]:
        """The newest `count` entries of a log, oldest first."""

    @abstractmethod
    async def claim(self, key: str, ttl: float) -> bool:
        """True for exactly one caller (fleet-wide for a shared backend) until `ttl` seconds
        pass or the key is deleted: e.g. "I send the half-open probe"."""

    def add_fields(self, key: str, amounts: dict[str, float], ttl: float) -> None:
        """Adds to several named counters kept together under `key`, which expires `ttl`
        seconds after its last change. (Not abstract, so that a store written for other
        needs still builds; a `distributed` one must have it: the dashboard uses it.)"""
        raise NotImplementedError

    async def read_fields(self, keys: list[str]) -> list[dict[str, float]]:
        """The named counters of each key (an empty dict for an unknown or expired one)."""
        raise NotImplementedError

    async def add_total(self, key: str, amount: float = 1.0, ttl: float | None = None) -> float:
        """`add`, then the fleet-wide total including it (not a local copy)."""
        self.add(key, amount, ttl)
        return self.total(key)

    async def fresh_total(self, key: str, ttl: float | None = None) -> float:
        """The counter's fleet-wide value now (not a local copy, which a shared backend keeps
        up to a second old, or longer after an outage), for the few reads that are money:
        a budget's admission, a key's own spend. `ttl`: the counter's, kept on the copy."""
        return self.total(key)

    async def fetch(self, key: str) -> Record | None:
        """`get`, but waiting for the shared backend when this process holds no fresh copy."""
        return self.get(key)

    async def sync(self) -> None:
        """Waits (at most the backend's timeout) until the writes made so far reach the
        shared backend: for the rare write the fleet must see before this process answers
        (a cooldown just opened, a field just refused)."""
        return None

    async def post(self) -> None:
        """`sync`, but not waiting for the shared backend's reply: the writes made so far are
        in its hands (written to its connection, so they reach it even if this process is
        killed next) when this returns, and its reply is read later, by the next call (a
        keyed request's charge, made before the answer's last byte)."""
        await self.sync()

    async def durability(self) -> Record | None:
        """What a shared backend says of keeping its data across a restart and under memory
        pressure (`persistence`, `eviction`, a `warning` when spend would be lost); None for
        the in-process store, or a backend that does not answer."""
        return None

    @property
    def shared(self) -> bool:
        """Whether other processes see what this one writes (a shared backend, reachable)."""
        return False

    async def start(self) -> None:
        """Connects (a shared backend); never raises: an unreachable one starts degraded."""
        return None

    async def close(self) -> None:
        """Flushes pending writes and disconnects."""
        return None

    @abstractmethod
    def describe(self) -> Record:
        """What `/health?detail=1`, the dashboard and doctor show, e.g. {"backend":
        "in-process"} or {"backend": "redis", "state": "ok", "rtt_ms": 0.4}; never a
        password."""
