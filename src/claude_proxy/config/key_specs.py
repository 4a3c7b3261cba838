"""Keys for people: the `[keys.NAME]` tables of the config file, read into KeySpecs.

Each key is known by its configured NAME everywhere (logs, metrics, usage, the dashboard); the
proxy keeps only the SHA-256 of the key itself, so `key_sha256 = "<hex>"` lets the file live in
git. `ANTHROPIC_API_KEY` stays the administrator's key: every key's usage, the whole dashboard.
With no `[keys]` table nothing here runs and the client key check is exactly the old one.
Who a request comes from is `keys/ring.py`'s question.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")
ADMIN = "admin"
"""The name the administrator's key (ANTHROPIC_API_KEY) is shown and counted under."""
KEY_SETTINGS = ("key", "key_sha256", "providers", "routes", "budget_usd", "budget_period",
                "rpm", "tpm")
NEW_KEY_PREFIX = "sk-cp-"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


class KeyTableError(ValueError):
    """A `[keys.NAME]` table that cannot be used (the config loader names the file)."""


@dataclass(frozen=True)
class KeySpec:
    """One person's (or one tool's) key: what it may use and how much."""

    name: str
    digest: bytes
    """SHA-256 of the key; the key itself is never kept."""
    providers: tuple[str, ...] | None = None
    """The providers it may use (None: all)."""
    routes: tuple[str, ...] | None = None
    """The routes it may use (None: all)."""
    budget_usd: float | None = None
    budget_period: Period = "month"
    rpm: int | None = None
    tpm: int | None = None

    def may_use(self, provider: str, route: str) -> bool:
        return ((self.providers is None or provider in self.providers)
                and (self.routes is None or route in self.routes))


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    """A fresh random key (256 bits)."""
    return NEW_KEY_PREFIX + secrets.token_urlsafe(32)


def key_table(name: str, key: str) -> str:
    """The `[keys.NAME]` table to paste for a new key: its hash only, so it can live in git."""
    return (f"[keys.{name}]\nkey_sha256 = \"{digest_of(key).hex()}\"\n"
            f"# budget_usd = 50\n# budget_period = \"month\"   # day | week | month (UTC)\n"
            f"# rpm = 60\n# tpm = 200000\n# providers = [\"...\"]\n# routes = [\"default\"]\n")


def parse_keys(tables: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[
        dict[str, KeySpec], list[str]]:
    """The `[keys.NAME]` tables as KeySpecs, and the raw keys read from the environment (for
    log redaction). KeyTableError names the table and the setting that is wrong."""
    specs: dict[str, KeySpec] = {}
    raw: list[str] = []
    seen: dict[bytes, str] = {}
    for name, table in tables.items():
        where = f"[keys.{name}]"
        if not isinstance(table, dict):
            raise KeyTableError(f"{where}: expected a table")
        if not _NAME.match(name) or name == ADMIN:
            raise KeyTableError(f"{where}: a key name is letters, digits, '.', '_' or '-' "
                                f"(and not {ADMIN!r}, the administrator's)")
        digest, value = _digest(where, table, environ)
        if value:
            raw.append(value)
        if digest in seen:
            raise KeyTableError(f"{where}: the same key as [keys.{seen[digest]}]")
        seen[digest] = name
        specs[name] = _spec(where, name, digest, table)
    return specs, raw


def _digest(where: str, table: Mapping[str, Any],
            environ: Mapping[str, str]) -> tuple[bytes, str | None]:
    unknown = sorted(set(table) - set(KEY_SETTINGS))
    if unknown:
        raise KeyTableError(f"{where} {unknown[0]}: not a key setting (one of "
                            f"{', '.join(KEY_SETTINGS)})")
    if ("key" in table) == ("key_sha256" in table):
        raise KeyTableError(f"{where}: set exactly one of key = \"env:VAR\" and key_sha256")
    if "key_sha256" in table:
        hexed = str(table["key_sha256"]).strip().lower()
        if not _HEX.match(hexed):
            raise KeyTableError(f"{where} key_sha256: expected 64 hex digits (claude-proxy "
                                f"keys new NAME prints one)")
        return bytes.fromhex(hexed), None
    source = table["key"]
    if not isinstance(source, str) or not source.startswith("env:"):
        raise KeyTableError(f"{where} key: expected \"env:VARIABLE\" (a key is never written "
                            f"in the file; use key_sha256 for its hash)")
    variable = source[4:]
    value = environ.get(variable, "")
    if not value:
        raise KeyTableError(f"{where} key: environment variable {variable} is not set")
    return digest_of(value), value


def _spec(where: str, name: str, digest: bytes, table: Mapping[str, Any]) -> KeySpec:
    period = table.get("budget_period", "month")
    if period not in PERIODS:
        raise KeyTableError(f"{where} budget_period: expected one of {', '.join(PERIODS)}")
    budget = table.get("budget_usd")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                               or budget < 0):
        raise KeyTableError(f"{where} budget_usd: expected a number of dollars >= 0")
    limits = {}
    for limit in ("rpm", "tpm"):
        value = table.get(limit)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise KeyTableError(f"{where} {limit}: expected a whole number >= 1")
        limits[limit] = value
    return KeySpec(name, digest, _names(where, table, "providers"), _names(where, table, "routes"),
                   float(budget) if budget is not None else None, period,
                   limits["rpm"], limits["tpm"])


def _names(where: str, table: Mapping[str, Any], setting: str) -> tuple[str, ...] | None:
    value = table.get(setting)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise KeyTableError(f"{where} {setting}: expected a list of names")
    return tuple(value)
