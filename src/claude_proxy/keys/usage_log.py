"""Spend that survives a restart without Redis: the usage entries in an SQLite file.

One file in DATA_DIR (`usage.sqlite3`; the directory is created with mode 0700). Entries are
queued by the request path and written by one thread in batches, so no request waits for the
disk; at start the ledger reads each key's spend of its current period back into the counters,
and `/v1/usage` reads its answers here (after the queue is written out).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
from pathlib import Path

from claude_proxy.state.store import Record

logger = logging.getLogger("claude_proxy.state")

FILE_NAME = "usage.sqlite3"
COLUMNS = ("ts", "key", "provider", "model", "route", "session", "agent", "input", "output",
           "cache_read", "cache_write", "cost_usd", "request_class", "prompt_id")
_SCHEMA = ("CREATE TABLE IF NOT EXISTS usage (ts REAL, key TEXT, provider TEXT, model TEXT, "
           "route TEXT, session TEXT, agent TEXT, input INTEGER, output INTEGER, "
           "cache_read INTEGER, cache_write INTEGER, cost_usd REAL, request_class TEXT, "
           "prompt_id TEXT)")
_ADDED = {"request_class": "TEXT", "prompt_id": "TEXT"}
"""Columns added since the first schema: a file written before gets them (empty) at start."""
_STOP = object()


def data_directory(path: Path) -> Path:
    """DATA_DIR, created owner-only (spend and session ids are nobody else's business)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class SqliteUsageLog:
    """The usage log in SQLite (see the module docstring); one writer thread."""

    def __init__(self, directory: Path) -> None:
        self.path = data_directory(directory) / FILE_NAME
        self.where: str | None = str(self.path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
            present = {row[1] for row in self._db.execute("PRAGMA table_info(usage)")}
            for column, kind in _ADDED.items():
                if column not in present:
                    self._db.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
            self._db.execute("CREATE INDEX IF NOT EXISTS usage_ts ON usage (ts)")
        self._queue: queue.Queue[object] = queue.Queue()
        self._writer = threading.Thread(target=self._write, name="usage-writer", daemon=True)
        self._writer.start()

    def record(self, entry: Record) -> None:
        self._queue.put(tuple(entry.get(column) for column in COLUMNS))

    def _write(self) -> None:
        while True:
            rows = [self._queue.get()]
            while not self._queue.empty():
                rows.append(self._queue.get_nowait())
            stop = _STOP in rows
            batch = [row for row in rows if isinstance(row, tuple)]
            try:
                if batch:
                    with self._lock:
                        self._db.executemany(
                            f"INSERT INTO usage ({','.join(COLUMNS)}) "
                            f"VALUES ({','.join('?' * len(COLUMNS))})",
                            batch)
            except sqlite3.Error:
                logger.exception("could not write %d usage entries to %s", len(batch),
                                 self.path)
            finally:
                for _ in rows:
                    self._queue.task_done()
            if stop:
                return

    def flush(self) -> None:
        """Waits until every queued entry is in the file."""
        self._queue.join()

    async def entries(self, since: float, until: float) -> list[Record]:
        return await asyncio.to_thread(self._select, since, until)

    def _select(self, since: float, until: float) -> list[Record]:
        self.flush()
        with self._lock:
            rows = self._db.execute(
                f"SELECT {','.join(COLUMNS)} FROM usage WHERE ts >= ? AND ts < ? ORDER BY ts",
                (since, until)).fetchall()
        return [dict(zip(COLUMNS, row, strict=True)) for row in rows]

    def spent(self, key: str, since: float) -> float:
        self.flush()
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM usage "
                                   "WHERE key = ? AND ts >= ?", (key, since)).fetchone()
        return float(row[0])

    def close(self) -> None:
        """Writes out what is queued and closes the file."""
        self._queue.put(_STOP)
        self._writer.join()
        with self._lock:
            self._db.close()
