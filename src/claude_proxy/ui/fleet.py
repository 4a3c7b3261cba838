"""The dashboard's view of every process, through a shared state store (REDIS_URL).

Each finished request writes, off the response's path (the store pipelines it):
- its row to the log `ui:requests`, bounded like this process's ring (the last 1000);
- its numbers to the minute's named counters `ui:minute:<minute>`, which expire after the hour
  the charts show;
- its bodies (the inspector's view, configured secrets replaced; like this process's own,
  the rest of logs.redact is applied when a page is sent it) to `ui:body:<process>:<slot>`: each
  process has INSPECT_REQUESTS slots, reused in turn, each expiring after BODY_TTL; the row
  names its slot, and a slot that has moved on to a later request no longer opens.
Every process also notes itself in `ui:processes` now and then, so the page can say which
processes and hosts it sees, even those that served nothing lately.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import orjson

from claude_proxy.state.store import StateStore, process_name
from claude_proxy.ui.series import MinuteSeries, minute_fields

ROWS_LOG = "ui:requests"
PROCESSES_LOG = "ui:processes"
BODY_TTL = 3600.0
HEARTBEAT_SECONDS = 10.0
SEEN_SECONDS = 60.0
"""A process that noted itself within this long is listed as seen."""
NEWS_BATCH = 200
LATE_ROWS = 2
"""The rows log keeps this many times the rows shown (see `FleetLog.rows`)."""
"""Rows the live feed reads each second to find other processes' new ones."""

Row = dict[str, Any]


class Seen:
    """Row ids one live feed has already sent (bounded: the oldest forgotten)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> bool:
        """True when the id is new."""
        if request_id in self._ids:
            return False
        self._ids[request_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)
        return True


class FleetLog:
    def __init__(self, store: StateStore, *, rows: int, inspect: int, minutes: int,
                 workers: int = 1) -> None:
        self.store = store
        self.rows_limit = rows
        self.inspect_limit = inspect
        self.minutes = minutes
        self.workers = workers
        self.process = process_name()
        self._slot = 0
        self._last_beat = float("-inf")

    # ------------------------------------------------------------ written

    def add(self, row: Row, now: float, body: str | None) -> None:
        """One finished request of this process (`body`: its inspector view as JSON, or None
        when bodies are not kept)."""
        row["process"] = self.process
        if body is not None and self.inspect_limit:
            key = f"ui:body:{self.process}:{self._slot % self.inspect_limit}"
            self._slot += 1
            self.store.put(key, {"id": row["id"], "view": orjson.Fragment(body)},
                           ttl=BODY_TTL)  # the view's JSON as it is, not quoted again
            row["body"] = key
        self.store.append(ROWS_LOG, row, self.rows_limit * LATE_ROWS)
        self.store.add_fields(f"ui:minute:{int(now // 60)}", minute_fields(row),
                              ttl=self.minutes * 60 + 120)
        self.heartbeat(now)

    def heartbeat(self, now: float) -> None:
        if now - self._last_beat >= HEARTBEAT_SECONDS:
            self._last_beat = now
            self.store.append(PROCESSES_LOG, {"process": self.process, "at": now,
                                              "workers": self.workers}, maxlen=256)

    # ------------------------------------------------------------ read

    async def rows(self) -> list[Row]:
        """The fleet's last rows by when their requests finished, oldest first; a row sent
        twice (its first pipeline timed out, yet reached Redis) shown once. The log holds
        LATE_ROWS times as many: a process's rows that waited out an outage reach it late, as
        its newest entries, and would otherwise push the fleet's latest rows out of view
        (`make soak` saw 55 of the last 1000 missing)."""
        rows = await self.store.read_log(ROWS_LOG, self.rows_limit * LATE_ROWS)
        seen: set[str] = set()
        unique = []
        for row in reversed(rows):
            if row["id"] not in seen:
                seen.add(row["id"])
                unique.append(row)
        unique.sort(key=finished_at)
        return unique[-self.rows_limit:]

    async def processes(self, rows: list[Row]) -> list[str]:
        """The processes seen lately: noted themselves, or served one of the rows."""
        since = time.time() - SEEN_SECONDS
        beats = await self.store.read_log(PROCESSES_LOG, 256)
        names = {str(beat["process"]) for beat in beats if beat.get("at", 0) >= since}
        names.update(str(row["process"]) for row in rows[-100:] if row.get("process"))
        names.add(self.process)
        return sorted(names)

    def kept(self, rows: list[Row]) -> list[str]:
        """The ids whose bodies are likely still held: each process's newest
        INSPECT_REQUESTS rows with a body, not older than BODY_TTL."""
        since = time.time() - BODY_TTL
        per_process: dict[str, int] = {}
        kept = []
        for row in reversed(rows):
            process = str(row.get("process"))
            if "body" not in row or row.get("at", 0) < since:
                continue
            if per_process.get(process, 0) < self.inspect_limit:
                per_process[process] = per_process.get(process, 0) + 1
                kept.append(str(row["id"]))
        return kept[::-1]

    async def series(self, now: float) -> MinuteSeries:
        last = int(now // 60)
        minutes = list(range(last - self.minutes + 1, last + 1))
        fields = await self.store.read_fields([f"ui:minute:{minute}" for minute in minutes])
        return MinuteSeries.of(self.minutes, list(zip(minutes, fields, strict=True)))

    async def inspect(self, request_id: str, inspect_limit: int) -> dict[str, Any] | None:
        """A request any process served: its row, and its bodies while its slot holds them."""
        row = next((row for row in reversed(await self.rows()) if row["id"] == request_id),
                   None)
        if row is None:
            return None
        view: dict[str, Any] = {"row": row, "kept": False, "inspect_requests": inspect_limit}
        key = row.get("body")
        stored = await self.store.fetch(str(key)) if key else None
        if stored is not None and stored.get("id") == request_id:
            shown = stored["view"]
            view.update(orjson.loads(shown) if isinstance(shown, str) else shown)
            view["kept"] = True
        return view

    async def news(self, seen: Seen) -> list[Row]:
        """Other processes' rows that this feed has not sent yet, oldest first."""
        rows = await self.store.read_log(ROWS_LOG, NEWS_BATCH)
        return [row for row in rows
                if row.get("process") != self.process and seen.add(str(row["id"]))]


def finished_at(row: Row) -> float:
    """When a row's request finished (its start, `at`, and its duration, `total` ms)."""
    return float(row.get("at") or 0) + float(row.get("total") or 0) / 1e3
