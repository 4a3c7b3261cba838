"""The Redis store's write-behind queue: what this process wrote that Redis has not confirmed.

What it guarantees:
- a write returns at once; the queue sends what gathered in one command (one script, APPLY:
  one reply to wait for; the store flushes it FLUSH_DELAY after the first write, or at once
  for `sync`), off the request's path;
- each batch of counter increments, and each flush of records, log entries and minute
  counters, is applied by Redis once, however often it is sent: it goes under an id that a
  script remembers (BATCH_MEMORY_MS), so one whose reply timed out (a paused Redis may still
  apply it) is sent again as it was, first, and never doubles a count or a log entry;
- a key's last write wins: records keep their order, and unconfirmed flushes go before new ones;
- while a write of a key is unconfirmed (`pending`, `owed_for`), this process's copy of the key
  is newer than what Redis may answer, and the mirror (mirror.py) leaves it alone;
- bounded while Redis is away: past PENDING_LIMIT writes and UNCONFIRMED_LIMIT flushes the
  oldest are dropped (a counter's increments add up in one entry, so its sum is kept);
- a backlog goes in parts of FLUSH_OPS operations, FLUSHES_PER_CALL parts per round trip, so
  each call is answered within REDIS_TIMEOUT (sent whole, an outage's backlog took longer than
  that on a loaded host, and was lost with the process: tests/soak.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection

T = TypeVar("T")
Call = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""The store's breaker: one Redis operation within REDIS_TIMEOUT, None when it failed."""
Notice = Callable[[str, bytes | None, float | None], bytes | None]
"""The change notice a record's write publishes (None: a key nobody mirrors)."""
Increments = dict[str, tuple[float, float | None]]
"""Counter increments by key: (amount, ttl)."""
Flush = tuple[bytes, list[bytes], list[str]]
"""A flush as sent: its operations (JSON), the values they name, the records' keys."""

PENDING_LIMIT = 10_000
"""Writes waiting for Redis (while it is away, the oldest are dropped past this)."""
BATCH_MEMORY_MS = 3_600_000
"""How long Redis remembers that a batch of increments was applied."""
UNCONFIRMED_LIMIT = 256
"""Flushes kept for sending again while Redis does not confirm them (the oldest dropped)."""
FLUSH_OPS = 256
"""The most operations in one flush."""
FLUSHES_PER_CALL = 8
"""Flushes sent in one command (one round trip, one REDIS_TIMEOUT)."""
HEAD = 3
"""APPLY's first arguments: the ids' lifetime, the parts, the key read after them."""
APPLY = """
local applied = 0
for _, part in ipairs(cjson.decode(ARGV[2])) do
  if redis.call('SET', part[1], '1', 'NX', 'PX', ARGV[1]) then
    applied = applied + 1
    for _, c in ipairs(part[3]) do
      redis.call('INCRBYFLOAT', c[1], c[2])
      if c[3] > 0 then redis.call('EXPIRE', c[1], c[3]) end
    end
    local base = part[2]
    for _, op in ipairs(part[4]) do
      local kind = op[1]
      if kind == 's' then
        if op[4] > 0 then redis.call('SET', op[2], ARGV[base + op[3]], 'PX', op[4])
        else redis.call('SET', op[2], ARGV[base + op[3]]) end
      elseif kind == 'd' then redis.call('DEL', op[2])
      elseif kind == 'p' then redis.call('PUBLISH', op[2], ARGV[base + op[3]])
      elseif kind == 'x' then
        redis.call('XADD', op[2], 'MAXLEN', '~', op[4], '*', 'e', ARGV[base + op[3]])
      elseif kind == 'h' then redis.call('HINCRBYFLOAT', op[2], op[3], op[4])
      elseif kind == 'e' then redis.call('EXPIRE', op[2], op[3])
      end
    end
  end
end
if ARGV[3] ~= '' then return redis.call('GET', ARGV[3]) end
return applied
"""
"""Everything one round trip sends, as one command (one reply to wait for and parse, one
script run in Redis): the parts in ARGV[2] (JSON), each `[id, base, increments, operations]`
applied once per id (a part sent again after its reply timed out is skipped); increments
`[key, amount, ttl]` (the amount as text: INCRBYFLOAT reads all its digits); operations
(records, notices, log entries, minute counters) name their values by index from `base`
among the ARGV that follow; then the value of ARGV[3] (none when empty)."""


class WriteQueue:
    """The writes of one process on their way to Redis (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, prefix: str, call: Call, notice: Notice,
                 channel: str) -> None:
        self.client = client
        self.prefix = prefix
        self.call = call
        self.notice = notice
        self.channel = channel
        self.lock = asyncio.Lock()
        """One flush at a time, so that `sync` also waits for the one under way; refreshes
        of counters take it too (a batch in flight may already be in Redis's value)."""
        self._owed: Increments = {}
        """Counter increments not yet sent."""
        self._batches: OrderedDict[str, Increments] = OrderedDict()
        """Increments sent under an id, until Redis confirms them."""
        self._records: OrderedDict[str, tuple[bytes | None, float | None]] = OrderedDict()
        """Records to write (None: delete), the last write of a key winning."""
        self._unconfirmed: OrderedDict[str, Flush] = OrderedDict()
        """Flushes sent under an id until Redis confirms them."""
        self._unconfirmed_keys: Counter[str] = Counter()
        """Keys written by unconfirmed flushes."""
        self._appends: deque[tuple[str, bytes, int]] = deque(maxlen=PENDING_LIMIT)
        self._fields: dict[str, tuple[dict[str, float], float]] = {}
        self._posted: tuple[AbstractConnection, list[tuple[str, Increments]],
                            list[tuple[str, Flush]]] | None = None
        """What `post` wrote whose reply is not read yet: its connection, what it carries."""
        self._apply = client.register_script(APPLY)

    # ------------------------------------------------------------ queueing

    def add(self, key: str, amount: float, ttl: float | None) -> None:
        before, before_ttl = self._owed.get(key, (0.0, None))
        if key not in self._owed and len(self._owed) >= PENDING_LIMIT:
            return  # bounded: a flood of new counters while Redis is away
        self._owed[key] = (before + amount, ttl if ttl is not None else before_ttl)

    def put(self, key: str, raw: bytes | None, ttl: float | None) -> None:
        """A record's write (None: its deletion)."""
        self._records[key] = (raw, ttl)
        self._records.move_to_end(key)
        while len(self._records) > PENDING_LIMIT:
            self._records.popitem(last=False)

    def delete(self, key: str) -> None:
        """Forgets the key's queued increments (a batch is applied whole or not at all) and
        queues its deletion."""
        self._owed.pop(key, None)
        for batch in self._batches.values():
            batch.pop(key, None)
        self.put(key, None, None)

    def append(self, log: str, raw: bytes, maxlen: int) -> None:
        self._appends.append((log, raw, maxlen))

    def add_fields(self, key: str, amounts: dict[str, float], ttl: float) -> None:
        queued, _ = self._fields.get(key, ({}, ttl))
        for name, amount in amounts.items():
            queued[name] = queued.get(name, 0.0) + amount
        self._fields[key] = (queued, ttl)

    # ------------------------------------------------------------ what is not confirmed

    def owed_for(self, key: str) -> float:
        """This process's increments of a counter that Redis has not confirmed."""
        return self._owed.get(key, (0.0, None))[0] + sum(
            batch[key][0] for batch in self._batches.values() if key in batch)

    def pending(self, key: str) -> bool:
        """Whether this process has a write of the record `key` that Redis has not confirmed."""
        return key in self._records or key in self._unconfirmed_keys

    def counters_in_flight(self) -> set[str]:
        """Counters with a batch sent but not confirmed: Redis's value may or may not hold it."""
        return {key for batch in self._batches.values() for key in batch}

    # ------------------------------------------------------------ sending

    async def load_scripts(self) -> None:
        """The scripts, loaded once (a restarted Redis has lost them: its NOSCRIPT opens the
        breaker, and they are loaded again when it is back), so that a flush is one EVALSHA,
        not a SCRIPT EXISTS first."""
        await self.call(lambda: self.client.script_load(APPLY))

    async def read(self, key: str) -> tuple[bool, Any]:
        """A counter's value in Redis, to which the caller adds what this process still owes
        it (`owed_for`): one GET when Redis has confirmed every batch this process sent (what
        is queued is owed, and waits for the next flush, off the request's path); else read
        after those batches, sent again in the same command. Whether Redis answered, and the
        value. The caller holds `lock`."""
        if not await self.collect():
            return False, None
        if self._batches:  # sent, not confirmed: Redis's value may hold them or not
            return await self.flush(key)

        async def get() -> tuple[Any]:  # a tuple: the key may be missing (None)
            return (await self.client.get(key),)

        answered = await self.call(get)
        return (False, None) if answered is None else (True, answered[0])

    async def flush(self, read: str | None = None) -> tuple[bool, Any]:
        """Every queued write, in as few round trips as the backlog allows, and with `read`,
        that key's value read after them in the same round trip. Whether Redis confirmed them
        all (if not they stay queued, bounded), and the value read (None when there was
        nothing to send, and so nothing read). The caller holds `lock`."""
        if not await self.collect():
            return False, None
        batches, writes = self._queued()
        if not (batches or writes):
            return True, None
        while len(writes) > FLUSHES_PER_CALL:  # a backlog: oldest first, a call at a time
            if not (await self._send(batches, writes[:FLUSHES_PER_CALL]))[0]:
                return False, None
            batches, writes = [], writes[FLUSHES_PER_CALL:]
        return await self._send(batches, writes, read)

    async def post(self) -> bool:
        """Every queued write handed to Redis (written to its connection) without waiting for
        its reply, which the next call on the queue reads (`collect`): a charge is in Redis's
        hands before the answer's last byte, and the answer does not wait for Redis. Whether
        it was written. The caller holds `lock`."""
        if not await self.collect():
            return False
        batches, writes = self._queued()
        if len(writes) > FLUSHES_PER_CALL:  # a backlog: sent and confirmed in parts
            return (await self.flush())[0]
        if not (batches or writes):
            return True
        command = self._command(batches, writes, None)
        pool = self.client.connection_pool

        async def write() -> AbstractConnection:
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]
            try:
                await connection.send_command("EVALSHA", *command)
            except BaseException:
                await connection.disconnect()
                await pool.release(connection)
                raise
            return connection

        connection = await self.call(write)
        if connection is not None:
            self._posted = (connection, batches, writes)
        return connection is not None

    async def collect(self) -> bool:
        """The reply to what `post` wrote, if any: its writes are confirmed, or, when Redis
        failed meanwhile, stay queued to be sent again (each applied once, by its id). Whether
        Redis confirmed them. The caller holds `lock`."""
        if self._posted is None:
            return True
        connection, batches, writes = self._posted
        self._posted = None
        pool = self.client.connection_pool
        read_at_all = False

        async def read() -> Any:
            nonlocal read_at_all
            read_at_all = True
            try:
                return await connection.read_response()
            except BaseException:
                await connection.disconnect()  # a reply may still come: never read it
                raise
            finally:
                await pool.release(connection)

        if await self.call(read) is None:
            if not read_at_all:  # the breaker was already open
                await connection.disconnect()
                await pool.release(connection)
            return False
        self._sent(batches, writes)
        return True

    def _queued(self) -> tuple[list[tuple[str, Increments]], list[tuple[str, Flush]]]:
        """What is to be sent: the counter batches and flushes not confirmed, oldest first
        (the increments owed and the writes queued since taken as new ones)."""
        if self._owed:
            self._batches[uuid.uuid4().hex] = self._owed
            self._owed = {}
        self._take_writes()
        return list(self._batches.items()), list(self._unconfirmed.items())

    def _command(self, batches: list[tuple[str, Increments]], writes: list[tuple[str, Flush]],
                 read: str | None) -> list[Any]:
        """APPLY's EVALSHA arguments: counter batches and flushes, each applied once (by its
        id), and the value of `read` after them."""
        parts: list[bytes] = []
        values: list[bytes] = []
        for batch, counters in batches:
            parts.append(orjson.dumps([
                f"{self.prefix}batch:{batch}", HEAD, [
                    [self.prefix + key, repr(amount), max(1, int(ttl)) if ttl is not None else 0]
                    for key, (amount, ttl) in counters.items()], []]))
        for flush, (ops, named, _) in writes:
            parts.append(b"[%b,%d,[],%b]" % (orjson.dumps(f"{self.prefix}batch:{flush}"),
                                             HEAD + len(values), ops))
            values += named
        return [self._apply.sha, 0, BATCH_MEMORY_MS, b"[%b]" % b",".join(parts), read or "",
                *values]

    async def _send(self, batches: list[tuple[str, Increments]],
                    writes: list[tuple[str, Flush]],
                    read: str | None = None) -> tuple[bool, Any]:
        """One command, its reply awaited: whether Redis confirmed, and the value read."""
        command = self._command(batches, writes, read)

        async def apply() -> tuple[Any]:  # a tuple: a key read may be None
            return (await self.client.evalsha(*command),)

        answered = await self.call(apply)
        if answered is None:
            return False, None
        self._sent(batches, writes)
        return True, answered[0] if read is not None else None

    def _sent(self, batches: list[tuple[str, Increments]],
              writes: list[tuple[str, Flush]]) -> None:
        for batch, _ in batches:
            self._batches.pop(batch, None)
        for flush, _ in writes:
            self._confirmed(flush)

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

    def _operations(self, records: OrderedDict[str, tuple[bytes | None, float | None]],
                    appends: list[tuple[str, bytes, int]],
                    fields: dict[str, tuple[dict[str, float], float]],
                    ) -> tuple[list[list[Any]], list[bytes]]:
        """The writes as APPLY's operations, and the values they name (by their index from
        the part's base): one command for the whole flush, so that Redis answers once, not
        once a write."""
        ops: list[list[Any]] = []
        values: list[bytes] = []

        def value(raw: bytes) -> int:
            values.append(raw)
            return len(values)  # APPLY reads it at ARGV[base + this]

        for key, (raw, ttl) in records.items():
            if raw is None:
                ops.append(["d", self.prefix + key])
            else:
                ops.append(["s", self.prefix + key, value(raw),
                            0 if ttl is None else max(1, int(ttl * 1000))])
            notice = self.notice(key, raw, ttl)
            if notice is not None:
                ops.append(["p", self.channel, value(notice)])
        for log, raw, maxlen in appends:
            ops.append(["x", self.prefix + log, value(raw), maxlen])
        for key, (amounts, ttl) in fields.items():
            ops += [["h", self.prefix + key, name, amount] for name, amount in amounts.items()]
            ops.append(["e", self.prefix + key, max(1, int(ttl))])
        return ops, values
