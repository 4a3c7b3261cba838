"""Reading the configuration again while serving: SIGHUP, and `--watch-config`.

SIGHUP (with --workers N sent to the parent, which passes it on: cli/supervisor.py), and with
WATCH_CONFIG a change of the config file or of the env file (a Kubernetes ConfigMap or Secret
update swaps a symlink: the path then names another file), makes every process read both
files again, as at start. A configuration that loads is wired whole (server/wiring.py) and
swapped in at once: keys, prices, budgets, providers, routes and their windows change
together, and a request already running finishes on the Wiring it started with. One that does
not load is refused whole: the old configuration stays, and the error is logged and shown in
`/health?detail=1` and on the dashboard until a reload succeeds.

What the process was started with stays until a restart (RESTART_ONLY: the address, the
state store, the dashboard's memory, the log file, the drain's timings); a change of those is
logged as such.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from claude_proxy.config.file import ConfigurationError, ProxyConfig
from claude_proxy.config.settings import Settings
from claude_proxy.server.endpoints import Wiring
from claude_proxy.server.wiring import (
    Close,
    Lasting,
    close_all,
    retire,
    warn_if_spend_unsafe,
    wire,
)

logger = logging.getLogger("claude_proxy.reload")

Loader = Callable[[], ProxyConfig]
RESTART_ONLY = ("host", "port", "redis_url", "redis_prefix", "redis_timeout", "ui_enabled",
                "inspect_requests", "inspect_bytes", "session_memo_bytes", "log_file",
                "data_dir", "drain_delay", "drain_timeout", "watch_config", "metrics_public")
"""Process-wide settings a reload reads but does not apply (they take a restart)."""
WATCH_SECONDS = 2.0
"""How often --watch-config looks at the files (one stat each)."""


@dataclass(frozen=True)
class Source:
    """Where the configuration is read from: `load` reads it (ConfigurationError naming what
    is wrong); `env_file` is watched with the config file it names or the command gave."""

    load: Loader
    env_file: Path | None = None


class Reloader:
    """One process's reloads (see the module docstring)."""

    def __init__(self, source: Source | None, lasting: Lasting, current: Callable[[], Wiring],
                 publish: Callable[[Wiring], None]) -> None:
        self.source = source
        self.lasting = lasting
        self.current = current
        self.publish = publish
        self.generation = 1
        self.loaded_at = datetime.now(UTC)
        self.error: str | None = None
        self.failed_at: datetime | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retired: list[list[Close]] = []
        """What reloads retired and is not closed yet (each reload's closers)."""

    def describe(self) -> dict[str, Any]:
        """What /health?detail=1 and the dashboard show: the configuration served, and the
        last reload's refusal while no later one succeeded."""
        wired = self.current()
        return {"source": wired.config.source, "generation": self.generation,
                "loaded_at": _iso(self.loaded_at), "reload": "SIGHUP" + (
                    ", watching the files" if wired.settings.watch_config else ""),
                "error": self.error, "failed_at": _iso(self.failed_at)}

    # ------------------------------------------------------------ a reload

    async def reload(self, why: str) -> bool:
        """Reads the configuration again and swaps it in; False (the old one kept) when it
        does not load."""
        if self.source is None:
            logger.warning("%s: nothing to reload (the configuration was given in code)", why)
            return False
        async with self._lock:
            old = self.current()
            try:
                config = await asyncio.to_thread(self.source.load)
                new = await wire(config, self.lasting, old)
            except Exception as exc:  # whatever is wrong in the files, the old one serves on
                self._refused(why, exc)
                return False
            self._warn_restart_only(old.settings, new.settings)
            self.publish(new)
            self._retire(old, new)
            self.generation += 1
            self.loaded_at, self.error, self.failed_at = datetime.now(UTC), None, None
            logger.info("configuration %d loaded (%s) from %s: %s", self.generation, why,
                        config.source, changes(old, new))
            if new.ledger is not None:  # budgets may be new: said as loudly as at start
                await warn_if_spend_unsafe(new.ledger)
            return True

    def _refused(self, why: str, exc: Exception) -> None:
        self.error = str(exc) or type(exc).__name__
        self.failed_at = datetime.now(UTC)
        if isinstance(exc, ConfigurationError):
            logger.error("configuration not reloaded (%s): %s; still serving configuration %d",
                         why, self.error, self.generation)
        else:
            logger.exception("configuration not reloaded (%s); still serving configuration %d",
                             why, self.generation)

    def _warn_restart_only(self, old: Settings, new: Settings) -> None:
        changed = [name.upper() for name in RESTART_ONLY
                   if getattr(old, name) != getattr(new, name)]
        if changed:
            logger.warning("changed in the configuration, but only a restart applies them: %s",
                           ", ".join(changed))

    def _retire(self, old: Wiring, new: Wiring) -> None:
        """What only `old` used is closed once no request can still use it: a request lasts
        at most TOTAL_TIMEOUT."""
        closers = retire(old, new)
        if closers:
            self._retired.append(closers)
            self._spawn(self._close_later(closers, old.settings.total_timeout))

    async def _close_later(self, closers: list[Close], after: float) -> None:
        await asyncio.sleep(after)
        self._retired.remove(closers)
        await close_all(closers)

    # ------------------------------------------------------------ triggers

    def start(self) -> None:
        """SIGHUP reloads (in the main thread, where signals are handled: not in a test's
        server thread); with WATCH_CONFIG, so does a change of the files."""
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda number, frame: loop.call_soon_threadsafe(
                self._spawn, self.reload("SIGHUP")))
        if self.source is not None and self.current().settings.watch_config:
            self._spawn(self._watch())

    async def stop(self) -> None:
        """At shutdown: the watcher stops, and what was retired is closed now."""
        for task in list(self._tasks):
            task.cancel()
        for closers in self._retired:
            await close_all(closers)
        self._retired = []

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        """Reloads when a watched file's identity or version (inode, size, modification time)
        changes."""
        seen = self._stamps()
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            now = self._stamps()
            if now != seen:
                seen = now
                await self.reload("a watched file changed")

    def _stamps(self) -> list[tuple[int, int, int] | None]:
        return [stamp(path) for path in watched(self.source, self.current().config)]


def watched(source: Source | None, config: ProxyConfig) -> list[Path]:
    """The env file the command gave, and the config file the configuration came from."""
    files = [source.env_file] if source is not None and source.env_file is not None else []
    config_file = Path(config.source)
    if config_file.is_file():
        files.append(config_file)
    return files


def stamp(path: Path) -> tuple[int, int, int] | None:
    """A file's identity and version as a stat through its symlinks sees them (None when it
    is missing, e.g. while a ConfigMap's links are swapped)."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def changes(old: Wiring, new: Wiring) -> str:
    """What a reload changed, by name (never a key): keys, providers, routes."""
    said = []
    for what, before, after in (("keys", old.config.keys, new.config.keys),
                                ("providers", old.config.providers, new.config.providers)):
        added = sorted(set(after) - set(before))
        removed = sorted(set(before) - set(after))
        changed = sorted(name for name in set(before) & set(after)
                         if before[name] != after[name])
        parts = [f"+{name}" for name in added] + [f"-{name}" for name in removed] + [
            f"~{name}" for name in changed]
        said.append(f"{what} {' '.join(parts) if parts else 'unchanged'}")
    said.append("routes " + ("changed" if old.config.router != new.config.router
                             else "unchanged"))
    facts = [(wired.config.models.provider_level, wired.config.models.per_model)
             for wired in (old, new)]
    said.append("windows and prices " + ("changed" if facts[0] != facts[1] else "unchanged"))
    return "; ".join(said)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")
