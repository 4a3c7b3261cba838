"""The Redis store: what one process learns, every worker and replica sees (REDIS_URL).

Cheap on the hot path and never in its way:
- reads (`get`, `total`) come from a local copy (a LocalStore) that a background task keeps at
  most about a second old; changes to the mirrored families (a provider's health, a refused
  field) are also pushed at once (a publish on `<prefix>changed`), so a cooldown opened by one
  process reaches the others in milliseconds;
- writes (`add`, `put`, `delete`, `append`, `add_fields`) change the local copy and are queued;
  the background task sends them in one pipeline every FLUSH_DELAY at most, off the
  response's critical path (`sync` sends them now, for the few the fleet must see at once);
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
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import Record, StateStore, display_url, process_name

logger = logging.getLogger("claude_proxy.state")

T = TypeVar("T")

REFRESH_SECONDS = 1.0
"""How old the local copy of a shared value may get; also the breaker's retry interval."""
WATCHED_LIMIT = 4096
"""Keys read recently, whose local copies the background task keeps fresh."""
PENDING_LIMIT = 10_000
"""Writes waiting for Redis (while it is away, the oldest are dropped past this)."""
PUSH_LIMIT = 4096
"""Records up to this size (JSON bytes) travel in the change notice itself."""
START_TIMEOUT = 1.0
BATCH_MEMORY_MS = 3_600_000
"""How long Redis remembers that a batch of increments was applied."""
INCREMENT_ONCE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 0 end
for i = 2, #KEYS do
  redis.call('INCRBYFLOAT', KEYS[i], ARGV[2 * i - 2])
  local ttl = tonumber(ARGV[2 * i - 1])
  if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
end
return 1
"""
"""Adds a batch of counter increments once, whatever how often it is sent."""
WRITE_ALL = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 0 end
local ops = cjson.decode(ARGV[2])
for _, op in ipairs(ops) do
  local kind = op[1]
  if kind == 's' then
    if op[4] > 0 then redis.call('SET', op[2], ARGV[op[3]], 'PX', op[4])
    else redis.call('SET', op[2], ARGV[op[3]]) end
  elseif kind == 'd' then redis.call('DEL', op[2])
  elseif kind == 'p' then redis.call('PUBLISH', op[2], ARGV[op[3]])
  elseif kind == 'x' then redis.call('XADD', op[2], 'MAXLEN', '~', op[4], '*', 'e', ARGV[op[3]])
  elseif kind == 'h' then redis.call('HINCRBYFLOAT', op[2], op[3], op[4])
  elseif kind == 'e' then redis.call('EXPIRE', op[2], op[3])
  end
end
return #ops
"""
"""A flush's writes (records, notices, log entries, minute counters) as one command, applied
once per id (KEYS[1]) like INCREMENT_ONCE: the operations in ARGV[2] (JSON), the values they
name in the ARGV that follow."""
UNCONFIRMED_LIMIT = 256
"""Flushes kept for sending again while Redis does not confirm them (the oldest dropped)."""
FLUSH_OPS = 256
"""The most operations in one flush: what an outage left queued (thousands of usage entries
and dashboard rows) is sent as several flushes, each small enough to be confirmed within
REDIS_TIMEOUT. Sent whole, it took longer than that on a loaded host, so each try failed and
opened the breaker again, until a process killed meanwhile lost it all (tests/soak.py)."""
LOG_PAGE = 2000
"""Log entries read in one call."""
FLUSHES_PER_CALL = 8
"""Flushes sent in one pipeline (one round trip, one REDIS_TIMEOUT)."""
FLUSH_DELAY = 0.05
"""Writes wait this long to share a pipeline with the next requests' (`sync` does not)."""
MIRRORED = ("health:", "refusal:")
"""Key families every process keeps whole: loaded at start and after an outage, kept by
change notices (a provider's cooldown, a refused field)."""

Failure = (RedisError, OSError, TimeoutError, asyncio.TimeoutError)


class RedisStore(StateStore):
    distributed = True

    def __init__(self, url: str, prefix: str = "claude-proxy:", timeout: float = 0.1,
                 mirrored: tuple[str, ...] = MIRRORED, process: str | None = None) -> None:
        self.url = display_url(url)
        self.prefix = prefix
        self.timeout = timeout
        self.mirrored = mirrored
        self.process = process or process_name()
        self.channel = f"{prefix}changed"
        self.local = LocalStore()
        """The local copy: read on the hot path, and all there is while Redis is away."""
        self._client = aioredis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self._up = False
        self._closing = False
        self._rtt_ms: float | None = None
        self._error: str | None = None
        self._owed: dict[str, tuple[float, float | None]] = {}
        """Counter increments not yet sent: (amount, ttl) by key."""
        self._batches: OrderedDict[str, dict[str, tuple[float, float | None]]] = OrderedDict()
        """Increments sent under an id, until Redis confirms them: a batch whose reply timed
        out may still be applied (a paused Redis reads it when resumed), so it is sent again
        under the same id, and the script applies each id once."""
        self._increment = self._client.register_script(INCREMENT_ONCE)
        self._write_all = self._client.register_script(WRITE_ALL)
        self._records: OrderedDict[str, tuple[bytes | None, float | None]] = OrderedDict()
        """Records to write (None: delete), the last write of a key winning."""
        self._unconfirmed: OrderedDict[str, tuple[bytes, list[bytes], list[str]]] = \
            OrderedDict()
        """Flushes of records, log entries and minute counters sent under an id until Redis
        confirms them (operations, values, the records' keys): one whose reply timed out may
        still be applied, so it is sent again as it was, first, and WRITE_ALL applies each
        id once (a log entry or a minute's count is then never doubled)."""
        self._unconfirmed_keys: Counter[str] = Counter()
        """Keys written by unconfirmed flushes: their local copies are this process's own
        writes, newer than what Redis may answer meanwhile."""
        self._appends: deque[tuple[str, bytes, int]] = deque(maxlen=PENDING_LIMIT)
        self._fields: dict[str, tuple[dict[str, float], float]] = {}
        self._watched: OrderedDict[str, bool] = OrderedDict()
        """Keys read recently (value: is a counter), refreshed every second."""
        self._fresh: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        """One pipeline at a time, so that `sync` also waits for the one under way."""
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ the contract

    def add(self, key: str, amount: float = 1.0, ttl: float | None = None) -> None:
        self.local.add(key, amount, ttl)
        self._owe(key, amount, ttl)
        self._watch(key, counter=True)
        self._wake.set()

    def total(self, key: str) -> float:
        self._watch(key, counter=True)
        return self.local.total(key)

    def put(self, key: str, value: Record, ttl: float | None = None) -> None:
        raw = orjson.dumps(value)
        if len(raw) <= PUSH_LIMIT:
            self.local.keep(key, orjson.loads(raw), ttl)
        else:
            self.local.delete(key)  # large (a request's bodies): read from Redis when asked
        self._queue_record(key, raw, ttl)

    def get(self, key: str) -> Record | None:
        self._watch(key, counter=False)
        return self.local.get(key)

    def delete(self, key: str) -> None:
        self.local.delete(key)
        self._owed.pop(key, None)
        for batch in self._batches.values():  # atomic: applied whole or not at all
            batch.pop(key, None)
        self._queue_record(key, None, None)

    def append(self, log: str, entry: Record, maxlen: int) -> None:
        self.local.append(log, entry, maxlen)
        self._appends.append((log, orjson.dumps(entry), maxlen))
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
        queued, _ = self._fields.get(key, ({}, ttl))
        for name, amount in amounts.items():
            queued[name] = queued.get(name, 0.0) + amount
        self._fields[key] = (queued, ttl)
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
        self._watch(key, counter=True)
        return await self._read_total(key, ttl)

    async def _read_total(self, key: str, ttl: float | None) -> float:
        """Redis's value after this process's queued writes, plus what it still owes (the
        local copy while Redis is away, failing open)."""
        async with self._flushing:
            sent, value = (await self._flush_queued(self.prefix + key) if self._up
                           else (False, None))
        if not (sent and self._up):
            return self.local.total(key)
        total = float(value or 0) + self._owed_for(key)
        self.local.set_total(key, total, ttl)
        return total

    async def fetch(self, key: str) -> Record | None:
        fresh = self._fresh.get(key, float("-inf")) > time.monotonic() - REFRESH_SECONDS
        if not self._up or fresh or self._pending(key):
            return self.get(key)
        raw = await self._call(lambda: self._client.get(self.prefix + key))
        if not self._up:
            return self.local.get(key)
        if raw is not None and len(raw) > PUSH_LIMIT:
            return _record(raw)  # large: not kept locally, nor watched
        self._watch(key, counter=False)
        self._apply_record(key, raw)
        return self.local.get(key)

    async def sync(self) -> None:
        if self._up:
            await self._flush()

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
        pubsub = await self._subscribe() if self._up else None
        if self._up:
            await self._load_scripts()
            await self._reload()
        self._tasks = [asyncio.create_task(self._keep(), name="redis-store"),
                       asyncio.create_task(self._listen(pubsub), name="redis-store-notices")]

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
        await self._load_scripts()
        await self._flush()
        await self._reload()

    async def _load_scripts(self) -> None:
        """The flush's scripts, loaded once (a restarted Redis has lost them: its NOSCRIPT
        opens the breaker, and they are loaded again when it is back), so that a flush is
        one EVALSHA, not a SCRIPT EXISTS first."""
        async def load() -> None:
            for script in (INCREMENT_ONCE, WRITE_ALL):
                await self._client.script_load(script)

        await self._call(load)

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
            await self._refresh(list(self._watched.items()))

    async def _flush(self) -> None:
        """Every queued write in one pipeline; on failure they stay queued (bounded)."""
        async with self._flushing:
            await self._flush_queued()

    async def _flush_queued(self, read: str | None = None) -> tuple[bool, Any]:
        """Sends the queued writes; with `read`, that key's value too, read after them in the
        same round trip (a budget check: one round trip, not two). Whether Redis took them,
        and the value read."""
        if self._owed:
            self._batches[uuid.uuid4().hex] = self._owed
            self._owed = {}
        self._take_writes()
        batches = list(self._batches.items())
        writes = list(self._unconfirmed.items())
        if not (batches or writes):
            if read is None:
                return True, None
            value = await self._call(lambda: self._client.get(read))
            return self._up, value
        while len(writes) > FLUSHES_PER_CALL:  # a backlog: oldest first, a call at a time
            if not (await self._send(batches, writes[:FLUSHES_PER_CALL]))[0]:
                return False, None
            batches, writes = [], writes[FLUSHES_PER_CALL:]
        return await self._send(batches, writes, read)

    async def _send(self, batches: list[tuple[str, dict[str, tuple[float, float | None]]]],
                    writes: list[tuple[str, tuple[bytes, list[bytes], list[str]]]],
                    read: str | None = None) -> tuple[bool, Any]:
        """One pipeline: counter batches and flushes, each applied once (by its id), and the
        value of `read` after them."""
        pipe = self._client.pipeline(transaction=False)
        for batch, counters in batches:
            keys = [f"{self.prefix}batch:{batch}", *(self.prefix + key for key in counters)]
            args: list[float] = [BATCH_MEMORY_MS]
            for amount, ttl in counters.values():
                args += [amount, max(1, int(ttl)) if ttl is not None else 0]
            pipe.evalsha(self._increment.sha, len(keys), *keys, *args)
        for flush, (ops, values, _) in writes:
            pipe.evalsha(self._write_all.sha, 1, f"{self.prefix}batch:{flush}",
                         BATCH_MEMORY_MS, ops, *values)
        if read is not None:
            pipe.get(read)
        answers = await self._call(pipe.execute)
        if answers is None:
            return False, None
        for batch, _ in batches:
            self._batches.pop(batch, None)
        for flush, _ in writes:
            self._confirmed(flush)
        return True, answers[-1] if read is not None else None

    def _take_writes(self) -> None:
        """The queued records, log entries and minute counters as one flush under a new id
        (sent after any earlier flush still unconfirmed, so a key's last write wins)."""
        records, self._records = self._records, OrderedDict()
        appends = list(self._appends)
        self._appends.clear()
        fields, self._fields = self._fields, {}
        ops, values = self._operations(records, appends, fields)
        if not ops:
            return
        if len(ops) <= FLUSH_OPS:
            self._unconfirmed[uuid.uuid4().hex] = (orjson.dumps(ops), values, list(records))
        else:  # a backlog: records first (in one flush), then the log entries in chunks
            self._take_in_parts(records, appends, fields)
        self._unconfirmed_keys.update(list(records))
        while len(self._unconfirmed) > UNCONFIRMED_LIMIT:
            self._confirmed(next(iter(self._unconfirmed)))  # dropped: bounded while away

    def _take_in_parts(self, records: OrderedDict[str, tuple[bytes | None, float | None]],
                       appends: list[tuple[str, bytes, int]],
                       fields: dict[str, tuple[dict[str, float], float]]) -> None:
        """A large flush as several, in order: the records and minute counters, then the log
        entries FLUSH_OPS at a time (each part applied once by its own id)."""
        ops, values = self._operations(records, [], fields)
        if ops:
            self._unconfirmed[uuid.uuid4().hex] = (orjson.dumps(ops), values, list(records))
        for start in range(0, len(appends), FLUSH_OPS):
            ops, values = self._operations(OrderedDict(), appends[start:start + FLUSH_OPS], {})
            self._unconfirmed[uuid.uuid4().hex] = (orjson.dumps(ops), values, [])

    def _confirmed(self, flush: str) -> None:
        _, _, keys = self._unconfirmed.pop(flush)
        self._unconfirmed_keys.subtract(keys)
        for key in keys:
            if self._unconfirmed_keys[key] <= 0:
                del self._unconfirmed_keys[key]

    def _pending(self, key: str) -> bool:
        """Whether this process has a write of `key` that Redis has not confirmed."""
        return key in self._records or key in self._unconfirmed_keys

    def _operations(self, records: OrderedDict[str, tuple[bytes | None, float | None]],
                    appends: list[tuple[str, bytes, int]],
                    fields: dict[str, tuple[dict[str, float], float]],
                    ) -> tuple[list[list[Any]], list[bytes]]:
        """The writes as WRITE_ALL's operations, and the values they name (by ARGV index):
        one command for the whole flush, so that Redis answers once, not once a write."""
        ops: list[list[Any]] = []
        values: list[bytes] = []

        def value(raw: bytes) -> int:
            values.append(raw)
            return len(values) + 2  # ARGV[1] is the id's lifetime, ARGV[2] the operations

        for key, (raw, ttl) in records.items():
            if raw is None:
                ops.append(["d", self.prefix + key])
            else:
                ops.append(["s", self.prefix + key, value(raw),
                            0 if ttl is None else max(1, int(ttl * 1000))])
            if key.startswith(self.mirrored):
                ops.append(["p", self.channel, value(self._notice(key, raw, ttl))])
        for log, raw, maxlen in appends:
            ops.append(["x", self.prefix + log, value(raw), maxlen])
        for key, (amounts, ttl) in fields.items():
            ops += [["h", self.prefix + key, name, amount] for name, amount in amounts.items()]
            ops.append(["e", self.prefix + key, max(1, int(ttl))])
        return ops, values

    async def _refresh(self, keys: list[tuple[str, bool]]) -> None:
        """Reads the given keys again (one MGET) into the local copy. Under the flush's lock:
        a batch in flight (`add_total` flushes from a request) may already be in Redis's
        value while still unconfirmed here, and adding it again as owed would count it
        twice; a counter with an unconfirmed batch keeps its local copy until a flush
        confirms it."""
        if not keys:
            return
        async with self._flushing:
            values = await self._call(lambda: self._client.mget(
                [self.prefix + key for key, _ in keys]))
            if values is not None:
                self._take_values(keys, values)

    def _take_values(self, keys: list[tuple[str, bool]], values: list[Any]) -> None:
        """An MGET's values into the local copy (a counter: Redis's value plus what this
        process has not sent yet)."""
        unconfirmed = {key for batch in self._batches.values() for key in batch}
        for (key, counter), raw in zip(keys, values, strict=True):
            if counter and key in unconfirmed:
                continue
            if counter:
                owed = self._owed_for(key)
                if raw is None and not owed:
                    self.local.delete(key)
                else:
                    self.local.set_total(key, float(raw or 0) + owed)
            elif not self._pending(key):
                self._apply_record(key, raw)

    async def _reload(self) -> None:
        """The shared state again: every mirrored family, and every watched key."""
        async def mirrored() -> list[tuple[str, bool]]:
            found: list[tuple[str, bool]] = []
            for family in self.mirrored:
                async for raw in self._client.scan_iter(match=f"{self.prefix}{family}*",
                                                        count=500, _type="string"):
                    key = raw.decode()[len(self.prefix):]
                    found.append((key, key in self._watched and self._watched[key]))
                    if len(found) >= WATCHED_LIMIT:
                        return found
            return found

        keys = await self._call(mirrored) or []
        seen = {key for key, _ in keys}
        await self._refresh(keys + [item for item in self._watched.items()
                                    if item[0] not in seen])

    async def _subscribe(self) -> PubSub | None:
        """A subscription to the change notices (None when Redis does not answer)."""
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            async with asyncio.timeout(max(self.timeout, START_TIMEOUT)):
                await pubsub.subscribe(self.channel)
        except Failure:
            with contextlib.suppress(*Failure):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            return None
        return pubsub

    async def _listen(self, pubsub: PubSub | None) -> None:
        """Applies other processes' change notices (`pubsub`: subscribed before the process
        serves, so none is missed at start); subscribes again after an outage."""
        while not self._closing:
            if pubsub is None:
                if self._up:
                    pubsub = await self._subscribe()
                if pubsub is None:
                    await asyncio.sleep(REFRESH_SECONDS / 4)
                    continue
            try:
                while self._up and not self._closing:
                    message = await pubsub.get_message(timeout=REFRESH_SECONDS)
                    if message is not None and message.get("type") == "message":
                        self._take_notice(message["data"])
            except Failure:
                await asyncio.sleep(REFRESH_SECONDS / 4)
            with contextlib.suppress(*Failure):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            pubsub = None

    # ------------------------------------------------------------ local bookkeeping

    def _owed_for(self, key: str) -> float:
        """This process's increments of a counter that Redis has not confirmed."""
        return self._owed.get(key, (0.0, None))[0] + sum(
            batch[key][0] for batch in self._batches.values() if key in batch)

    def _owe(self, key: str, amount: float, ttl: float | None) -> None:
        before, before_ttl = self._owed.get(key, (0.0, None))
        if key not in self._owed and len(self._owed) >= PENDING_LIMIT:
            return  # bounded: a flood of new counters while Redis is away
        self._owed[key] = (before + amount, ttl if ttl is not None else before_ttl)

    def _queue_record(self, key: str, raw: bytes | None, ttl: float | None) -> None:
        self._records[key] = (raw, ttl)
        self._records.move_to_end(key)
        while len(self._records) > PENDING_LIMIT:
            self._records.popitem(last=False)
        self._wake.set()

    def _watch(self, key: str, counter: bool) -> None:
        watched = self._watched
        if key in watched:
            watched.move_to_end(key)
            return
        watched[key] = counter
        if len(watched) > WATCHED_LIMIT:
            old, _ = watched.popitem(last=False)
            self._fresh.pop(old, None)
            if not old.startswith(self.mirrored) and not self._pending(old):
                self.local.delete(old)  # no longer kept fresh: not kept at all

    def _apply_record(self, key: str, raw: bytes | str | None) -> None:
        self._fresh[key] = time.monotonic()
        record = _record(raw) if raw is not None and len(raw) <= PUSH_LIMIT else None
        if record is None:
            self.local.delete(key)
        else:
            self.local.keep(key, record)

    def _notice(self, key: str, raw: bytes | None, ttl: float | None) -> bytes:
        notice: Record = {"k": key, "p": self.process, "t": ttl, "d": raw is None}
        if raw is not None and len(raw) <= PUSH_LIMIT:
            notice["v"] = orjson.Fragment(raw)
        return orjson.dumps(notice)

    def _take_notice(self, data: bytes) -> None:
        try:
            notice = orjson.loads(data)
            key = str(notice["k"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if notice.get("p") == self.process or self._pending(key):
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


def _record(raw: bytes | str) -> Record | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _entry(fields: Any) -> Record:
    entry: Record = orjson.loads(fields[b"e"])
    return entry


def _reason(exc: BaseException) -> str:
    """Why a call failed, in words that never hold the URL (nor so its password)."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    return type(exc).__name__
