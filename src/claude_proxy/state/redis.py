"""The Redis store: what one process learns, every worker and replica sees (REDIS_URL).

Cheap on the hot path and never in its way:
- reads (`get`, `total`) come from a local copy that is kept fresh (mirror.py: at most about
  a second old, the mirrored families pushed at once by change notices);
- writes (`add`, `put`, `delete`, `append`, `add_fields`) change the local copy and are queued
  (write_queue.py); the background task sends them in one command every FLUSH_DELAY at most,
  off the response's critical path (`sync` sends them now, for the few the fleet must see at
  once), each batch applied once however often it is sent;
- every call waits at most REDIS_TIMEOUT. A failed or slow call opens a breaker around Redis:
  the process goes on with its local copy (fail open), logs a WARNING once, and pings each
  second; when Redis answers again it logs INFO once, adds the counters that grew meanwhile
  (spend, failures) to Redis, sends the records written meanwhile, and reads the shared state
  again.
Every key is the REDIS_PREFIX plus the feature's name; each has a TTL or is a bounded stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from claude_proxy.state.mirror import (
    MIRRORED,
    PUSH_LIMIT,
    REFRESH_SECONDS,
    START_TIMEOUT,
    Failure,
    Mirror,
    record_of,
)
from claude_proxy.state.store import Record, StateStore, display_url, process_name
from claude_proxy.state.write_queue import WriteQueue

logger = logging.getLogger("claude_proxy.state")

T = TypeVar("T")

LOG_PAGE = 2000
"""Log entries read in one call."""
FLUSH_DELAY = 0.05
"""Writes wait this long to share a round trip with the next requests' (`sync` does not)."""
DURABILITY_SECONDS = 10.0
"""How long what Redis said of its persistence is shown before it is asked again."""


class RedisStore(StateStore):
    distributed = True

    def __init__(self, url: str, prefix: str = "claude-proxy:", timeout: float = 0.1,
                 mirrored: tuple[str, ...] = MIRRORED, process: str | None = None) -> None:
        self.url = display_url(url)
        self.prefix = prefix
        self.timeout = timeout
        self.process = process or process_name()
        self._client = aioredis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self.mirror: Mirror
        self.queue = WriteQueue(self._client, prefix, self._call,
                                lambda key, raw, ttl: self.mirror.notice(key, raw, ttl),
                                f"{prefix}changed")
        self.mirror = Mirror(self._client, prefix, self._call, self.queue, self.process,
                             mirrored)
        self.local = self.mirror.local
        """The local copy: read on the hot path, and all there is while Redis is away."""
        self._up = False
        self._closing = False
        self._rtt_ms: float | None = None
        self._error: str | None = None
        self._durability: tuple[float, Record] | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ the contract

    def add(self, key: str, amount: float = 1.0, ttl: float | None = None) -> None:
        self.local.add(key, amount, ttl)
        self.queue.add(key, amount, ttl)
        self.mirror.watch(key, counter=True)
        self._wake.set()

    def total(self, key: str) -> float:
        self.mirror.watch(key, counter=True)
        return self.local.total(key)

    def put(self, key: str, value: Record, ttl: float | None = None) -> None:
        raw = orjson.dumps(value)
        if len(raw) <= PUSH_LIMIT:
            self.local.keep(key, orjson.loads(raw), ttl)
        else:
            self.local.delete(key)  # large (a request's bodies): read from Redis when asked
        self.queue.put(key, raw, ttl)
        self._wake.set()

    def get(self, key: str) -> Record | None:
        self.mirror.watch(key, counter=False)
        return self.local.get(key)

    def delete(self, key: str) -> None:
        self.local.delete(key)
        self.queue.delete(key)
        self._wake.set()

    def append(self, log: str, entry: Record, maxlen: int) -> None:
        self.local.append(log, entry, maxlen)
        self.queue.append(log, orjson.dumps(entry), maxlen)
        self._wake.set()

    async def read_log(self, log: str, count: int) -> list[Record]:
        """Read LOG_PAGE entries a call, newest first, so that each call is answered within
        REDIS_TIMEOUT however long the log (the usage log holds up to 100,000 entries, which
        one call took longer than that to send)."""
        entries: list[Any] = []
        newest = "+"
        while len(entries) < count:
            wanted = min(LOG_PAGE, count - len(entries))
            page = await self._call(lambda: self._client.xrevrange(
                self.prefix + log, max=newest, count=wanted))  # noqa: B023 (awaited here)
            if page is None:
                return await self.local.read_log(log, count)
            entries += page
            if len(page) < wanted:
                break
            last = page[-1][0]
            # exclusive: the entries before the last one read
            newest = "(" + (last.decode() if isinstance(last, bytes) else str(last))
        return [_entry(fields) for _, fields in reversed(entries)]

    async def claim(self, key: str, ttl: float) -> bool:
        won = await self._call(lambda: self._client.set(
            self.prefix + key, b"1", nx=True, px=max(1, int(ttl * 1000))))
        if won is None and not self._up:
            return await self.local.claim(key, ttl)
        return bool(won)

    def add_fields(self, key: str, amounts: dict[str, float], ttl: float) -> None:
        self.local.add_fields(key, amounts, ttl)
        self.queue.add_fields(key, amounts, ttl)
        self._wake.set()

    async def read_fields(self, keys: list[str]) -> list[dict[str, float]]:
        async def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(self.prefix + key)
            return await pipe.execute()

        found = await self._call(read) if keys else []
        if found is None:
            return await self.local.read_fields(keys)
        return [{name.decode(): float(value) for name, value in fields.items()}
                for fields in found]

    async def add_total(self, key: str, amount: float = 1.0, ttl: float | None = None) -> float:
        self.add(key, amount, ttl)
        return await self._read_total(key, ttl)

    async def fresh_total(self, key: str, ttl: float | None = None) -> float:
        self.mirror.watch(key, counter=True)
        return await self._read_total(key, ttl)

    async def _read_total(self, key: str, ttl: float | None) -> float:
        """Redis's value plus what this process still owes it (the local copy while Redis is
        away, failing open)."""
        async with self.queue.lock:
            sent, value = (await self.queue.read(self.prefix + key) if self._up
                           else (False, None))
        if not (sent and self._up):
            return self.local.total(key)
        return self.mirror.counter_copy(key, value, ttl)

    async def fetch(self, key: str) -> Record | None:
        if not self._up or self.mirror.fresh(key) or self.queue.pending(key):
            return self.get(key)
        raw = await self._call(lambda: self._client.get(self.prefix + key))
        if not self._up:
            return self.local.get(key)
        if raw is not None and len(raw) > PUSH_LIMIT:
            return record_of(raw)  # large: not kept locally, nor watched
        self.mirror.watch(key, counter=False)
        self.mirror.apply_record(key, raw)
        return self.local.get(key)

    async def sync(self) -> None:
        if self._up:
            await self._flush()

    async def post(self) -> None:
        if self._up:
            async with self.queue.lock:
                await self.queue.post()
            self._wake.set()  # the reply is read within FLUSH_DELAY if no request reads it

    @property
    def shared(self) -> bool:
        return self._up

    def describe(self) -> Record:
        described: Record = {"backend": "redis", "url": self.url, "prefix": self.prefix,
                             "shared": self._up, "process": self.process}
        if self._up:
            described.update(state="redis ok", rtt_ms=self._rtt_ms)
        else:
            described.update(state="degraded: in-process", error=self._error)
        return described

    async def durability(self) -> Record | None:
        """What Redis says of its persistence and eviction (durability_of), asked at most
        every DURABILITY_SECONDS; None while it does not answer. Not through the breaker: a
        slow answer to this question must not send the process to in-process state."""
        now = time.monotonic()
        if self._durability is not None and now - self._durability[0] < DURABILITY_SECONDS:
            return self._durability[1]
        try:
            async with asyncio.timeout(max(self.timeout, START_TIMEOUT)):
                found = await durability_of(self._client, self.url)
        except Failure:
            return None
        self._durability = (now, found)
        return found

    async def start(self) -> None:
        """Connects and loads the shared state; unreachable, it starts degraded (and keeps
        trying every second)."""
        try:
            async with asyncio.timeout(max(self.timeout, START_TIMEOUT)):
                await self._client.ping()
        except Failure as exc:
            self._error = _reason(exc)
            logger.warning("Redis at %s is unreachable (%s): starting with in-process state "
                           "(each process on its own); retrying every %.0f s", self.url,
                           self._error, REFRESH_SECONDS)
        else:
            self._up = True
            logger.info("state shared through Redis at %s (prefix %r)", self.url, self.prefix)
        pubsub = await self.mirror.subscribe(self.timeout) if self._up else None
        if self._up:
            await self.queue.load_scripts()
            await self.mirror.reload()
        listening = self.mirror.listen(pubsub, self.timeout, lambda: self._up,
                                       lambda: self._closing)
        self._tasks = [asyncio.create_task(self._keep(), name="redis-store"),
                       asyncio.create_task(listening, name="redis-store-notices")]

    async def close(self) -> None:
        self._closing = True
        if self._up:
            await self._flush()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, *Failure):
                await task
        with contextlib.suppress(*Failure):
            await self._client.aclose()

    # ------------------------------------------------------------ the breaker

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T | None:
        """One Redis operation within REDIS_TIMEOUT; None (and the breaker open) when Redis
        fails or is already known to be away."""
        if not self._up:
            return None
        try:
            async with asyncio.timeout(self.timeout):
                return await operation()
        except Failure as exc:
            self._went_away(exc)
            return None

    def _went_away(self, exc: BaseException) -> None:
        if not self._up:
            return
        self._up = False
        self._error = _reason(exc)
        logger.warning("Redis at %s failed (%s): going on with in-process state; shared "
                       "state resumes when it answers again", self.url, self._error)

    async def _came_back(self) -> None:
        self._up = True
        self._error = None
        logger.info("Redis at %s is back: state is shared again", self.url)
        await self.queue.load_scripts()
        await self._flush()
        await self.mirror.reload()

    # ------------------------------------------------------------ the background task

    async def _keep(self) -> None:
        """Sends queued writes as they come; each second pings (the round trip shown in
        /health), refreshes the watched keys, or, while Redis is away, tries it again."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_tick - loop.time())):
                    await self._wake.wait()
            if self._wake.is_set() and not self._closing:
                await asyncio.sleep(FLUSH_DELAY)  # gather the writes of the next requests
            self._wake.clear()
            try:
                if self._up:
                    await self._flush()
                if loop.time() < next_tick:
                    continue
                next_tick = loop.time() + REFRESH_SECONDS
                await self._tick()
            except Exception:  # a bug here must not stop sharing for good
                logger.exception("the Redis store's background task failed; going on")
                next_tick = loop.time() + REFRESH_SECONDS

    async def _tick(self) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout if self._up else START_TIMEOUT):
                await self._client.ping()
        except Failure as exc:
            if self._up:
                self._went_away(exc)
            else:
                self._error = _reason(exc)
            return
        self._rtt_ms = round((time.perf_counter() - started) * 1e3, 3)
        if not self._up:
            await self._came_back()
        else:
            await self.mirror.refresh_watched()

    async def _flush(self) -> None:
        """Every queued write in one command; on failure they stay queued (bounded)."""
        async with self.queue.lock:
            await self.queue.flush()


SPEND_LOST = "spend will be lost when Redis restarts"


async def durability_of(client: aioredis.Redis, url: str) -> Record:
    """Whether Redis keeps what it holds across a restart and under memory pressure, from
    INFO persistence and INFO memory (and CONFIG GET, where an ACL or a managed Redis allows
    it): `persistence`, `eviction`, and a `warning` when keys' spend would not survive (no
    append-only file, or a policy that evicts keys once maxmemory is reached)."""
    pipe = client.pipeline(transaction=False)
    for section in ("persistence", "memory"):
        pipe.info(section)
    for name in ("save", "appendfsync"):
        pipe.config_get(name)
    persistence, memory, *configured = await pipe.execute(raise_on_error=False)
    for answer in (persistence, memory):
        if isinstance(answer, ResponseError):
            raise answer
    config: dict[str, Any] = {}
    for answer in configured:  # CONFIG refused (an ACL, a managed Redis): INFO is all there is
        if isinstance(answer, dict):
            config.update(answer)
    save = config.get("save")
    if persistence.get("aof_enabled") in (1, "1"):
        kept = f"append-only file, appendfsync {config.get('appendfsync', 'unknown')}"
    elif save:
        kept = f"snapshots only (save {save})"
    else:
        kept = "none" if save == "" else "no append-only file (snapshots unknown)"
    policy = str(memory.get("maxmemory_policy", "unknown"))
    limit = int(memory.get("maxmemory") or 0)
    found: Record = {"persistence": kept, "eviction": policy, "maxmemory": limit,
                     "used_memory": int(memory.get("used_memory") or 0), "warning": None}
    problems = []
    if not kept.startswith("append-only"):
        problems.append(f"{SPEND_LOST}: it keeps {kept} (run it with --appendonly yes)")
    if limit and policy != "noeviction":
        problems.append(f"spend counters can be evicted: maxmemory-policy {policy} evicts keys "
                        f"once its maxmemory ({limit} bytes) is full (run it with "
                        "--maxmemory-policy noeviction)")
    if problems:
        found["warning"] = f"Redis at {url}: " + "; ".join(problems)
    return found


async def read_durability(url: str, timeout: float) -> Record | None:
    """durability_of for `claude-proxy doctor` (None when Redis does not answer)."""
    client = aioredis.from_url(url, socket_timeout=max(timeout, START_TIMEOUT),
                               socket_connect_timeout=max(timeout, START_TIMEOUT),
                               retry=Retry(NoBackoff(), 0))
    try:
        async with asyncio.timeout(max(timeout, START_TIMEOUT)):
            return await durability_of(client, display_url(url))
    except Failure:
        return None
    finally:
        with contextlib.suppress(*Failure):
            await client.aclose()


async def check_connection(url: str, prefix: str, timeout: float) -> tuple[bool, str]:
    """For `claude-proxy doctor`: Redis answers, and takes a write and a read under the
    prefix (an ACL user may lack either) within REDIS_TIMEOUT each; never the password."""
    client = aioredis.from_url(url, socket_timeout=max(timeout, START_TIMEOUT),
                               socket_connect_timeout=max(timeout, START_TIMEOUT),
                               retry=Retry(NoBackoff(), 0))
    key = f"{prefix}doctor:{process_name()}"
    try:
        started = time.perf_counter()
        async with asyncio.timeout(max(timeout, START_TIMEOUT)):
            await client.ping()
        rtt = (time.perf_counter() - started) * 1e3
        async with asyncio.timeout(max(timeout, START_TIMEOUT)):
            await client.set(key, b"ok", px=5000)
            read = await client.get(key)
            await client.delete(key)
    except Failure as exc:
        return False, f"{display_url(url)}: {_reason(exc)} (the proxy would run degraded: " \
                      "each process on its own)"
    finally:
        with contextlib.suppress(*Failure):
            await client.aclose()
    if read != b"ok":
        return False, f"{display_url(url)}: a write under {prefix!r} did not read back"
    slow = f"; slower than REDIS_TIMEOUT ({timeout * 1e3:.0f} ms)" if rtt > timeout * 1e3 else ""
    return True, f"{display_url(url)} answers in {rtt:.1f} ms, prefix {prefix!r}{slow}"


def _entry(fields: Any) -> Record:
    entry: Record = orjson.loads(fields[b"e"])
    return entry


def _reason(exc: BaseException) -> str:
    """Why a call failed, in words that never hold the URL (nor so its password)."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    return type(exc).__name__
