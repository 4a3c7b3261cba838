"""The Redis store's local copy of the shared state, and how it is kept fresh.

What it guarantees:
- reads on a request's path never wait for Redis: `get` and `total` answer from the copy (a
  LocalStore), which is all there is while Redis is away;
- a key read recently (the last WATCHED_LIMIT keys read) is read again every REFRESH_SECONDS in
  one MGET, so its copy is at most about a second old while Redis answers; a key read no more
  is no longer kept;
- the mirrored families (a provider's health, a refused field) are held whole: loaded at
  start and after an outage, and changed within milliseconds of another process's write by its
  change notice (a publish on `<prefix>changed`, sent in the same flush as the write);
- this process's own unconfirmed writes (write_queue.py) are never overwritten by an older
  value read from Redis or by a notice: a counter's copy is Redis's value plus what this
  process still owes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import Record
from claude_proxy.state.write_queue import Call, WriteQueue

REFRESH_SECONDS = 1.0
"""How old the local copy of a shared value may get; also the breaker's retry interval."""
WATCHED_LIMIT = 4096
"""Keys read recently, whose local copies are kept fresh."""
PUSH_LIMIT = 4096
"""Records up to this size (JSON bytes) travel in the change notice itself, and are kept in
the copy; larger ones (a request's bodies) are read from Redis when asked."""
START_TIMEOUT = 1.0
MIRRORED = ("health:", "refusal:")
"""Key families every process keeps whole."""

Failure = (RedisError, OSError, TimeoutError, asyncio.TimeoutError)


class Mirror:
    """The local copy of one process (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, prefix: str, call: Call, queue: WriteQueue,
                 process: str, mirrored: tuple[str, ...] = MIRRORED) -> None:
        self.client = client
        self.prefix = prefix
        self.call = call
        self.queue = queue
        self.process = process
        self.mirrored = mirrored
        self.channel = f"{prefix}changed"
        self.local = LocalStore()
        self._watched: OrderedDict[str, bool] = OrderedDict()
        """Keys read recently (value: is a counter), refreshed every second."""
        self._fresh: dict[str, float] = {}
        """When each record's copy was last read from Redis (or pushed by a notice)."""

    def watch(self, key: str, counter: bool) -> None:
        watched = self._watched
        if key in watched:
            watched.move_to_end(key)
            return
        watched[key] = counter
        if len(watched) > WATCHED_LIMIT:
            old, _ = watched.popitem(last=False)
            self._fresh.pop(old, None)
            if not old.startswith(self.mirrored) and not self.queue.pending(old):
                self.local.delete(old)  # no longer kept fresh: not kept at all

    def fresh(self, key: str) -> bool:
        """Whether the record's copy was read from Redis within REFRESH_SECONDS."""
        return self._fresh.get(key, float("-inf")) > time.monotonic() - REFRESH_SECONDS

    def counter_copy(self, key: str, redis_value: Any, ttl: float | None) -> float:
        """Redis's value of a counter plus what this process still owes it, kept as the copy."""
        total = float(redis_value or 0) + self.queue.owed_for(key)
        self.local.set_total(key, total, ttl)
        return total

    async def refresh_watched(self) -> None:
        await self.refresh(list(self._watched.items()))

    async def refresh(self, keys: list[tuple[str, bool]]) -> None:
        """Reads the given keys again (one MGET) into the copy. Under the queue's lock: a batch
        in flight may already be in Redis's value while still unconfirmed here, and adding it
        again as owed would count it twice; a counter with an unconfirmed batch keeps its copy
        until a flush confirms it."""
        if not keys:
            return
        async with self.queue.lock:
            values = await self.call(lambda: self.client.mget(
                [self.prefix + key for key, _ in keys]))
            if values is not None:
                self._take_values(keys, values)

    def _take_values(self, keys: list[tuple[str, bool]], values: list[Any]) -> None:
        in_flight = self.queue.counters_in_flight()
        for (key, counter), raw in zip(keys, values, strict=True):
            if counter and key in in_flight:
                continue
            if counter:
                owed = self.queue.owed_for(key)
                if raw is None and not owed:
                    self.local.delete(key)
                else:
                    self.local.set_total(key, float(raw or 0) + owed)
            elif not self.queue.pending(key):
                self.apply_record(key, raw)

    async def reload(self) -> None:
        """The shared state again: every mirrored family, and every watched key."""
        async def mirrored() -> list[tuple[str, bool]]:
            found: list[tuple[str, bool]] = []
            for family in self.mirrored:
                async for raw in self.client.scan_iter(match=f"{self.prefix}{family}*",
                                                       count=500, _type="string"):
                    key = raw.decode()[len(self.prefix):]
                    found.append((key, key in self._watched and self._watched[key]))
                    if len(found) >= WATCHED_LIMIT:
                        return found
            return found

        keys = await self.call(mirrored) or []
        seen = {key for key, _ in keys}
        await self.refresh(keys + [item for item in self._watched.items()
                                   if item[0] not in seen])

    def apply_record(self, key: str, raw: bytes | str | None) -> None:
        self._fresh[key] = time.monotonic()
        found = record_of(raw) if raw is not None and len(raw) <= PUSH_LIMIT else None
        if found is None:
            self.local.delete(key)
        else:
            self.local.keep(key, found)

    # ------------------------------------------------------------ change notices

    def notice(self, key: str, raw: bytes | None, ttl: float | None) -> bytes | None:
        """What a write of a mirrored record tells the other processes (None: not mirrored)."""
        if not key.startswith(self.mirrored):
            return None
        notice: Record = {"k": key, "p": self.process, "t": ttl, "d": raw is None}
        if raw is not None and len(raw) <= PUSH_LIMIT:
            notice["v"] = orjson.Fragment(raw)
        return orjson.dumps(notice)

    def take_notice(self, data: bytes) -> None:
        try:
            notice = orjson.loads(data)
            key = str(notice["k"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if notice.get("p") == self.process or self.queue.pending(key):
            return
        if not (key in self._watched or key.startswith(self.mirrored)):
            return
        if notice.get("d"):
            self.local.delete(key)
        elif "v" in notice:
            self.local.keep(key, notice["v"], notice.get("t"))
            self._fresh[key] = time.monotonic()
        else:
            self._fresh.pop(key, None)  # too large to push: read again when next asked

    async def subscribe(self, timeout: float) -> PubSub | None:
        """A subscription to the change notices (None when Redis does not answer)."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            async with asyncio.timeout(max(timeout, START_TIMEOUT)):
                await pubsub.subscribe(self.channel)
        except Failure:
            with contextlib.suppress(*Failure):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            return None
        return pubsub

    async def listen(self, pubsub: PubSub | None, timeout: float,
                     up: Callable[[], bool], closing: Callable[[], bool]) -> None:
        """Applies other processes' change notices (`pubsub`: subscribed before the process
        serves, so none is missed at start); subscribes again after an outage."""
        while not closing():
            if pubsub is None:
                if up():
                    pubsub = await self.subscribe(timeout)
                if pubsub is None:
                    await asyncio.sleep(REFRESH_SECONDS / 4)
                    continue
            try:
                while up() and not closing():
                    message = await pubsub.get_message(timeout=REFRESH_SECONDS)
                    if message is not None and message.get("type") == "message":
                        self.take_notice(message["data"])
            except Failure:
                await asyncio.sleep(REFRESH_SECONDS / 4)
            with contextlib.suppress(*Failure):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            pubsub = None


def record_of(raw: bytes | str) -> Record | None:
    """A record as Redis holds it (JSON), or None for anything else."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
