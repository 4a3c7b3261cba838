"""Budgets and rate limits: calendar periods, the counters' names, and the check made before
anything is sent upstream.

The check is local reads of the state store (its copy, for a shared backend): this period's
spend, and this minute's requests and tokens. The spend may overshoot the budget by at most the
requests already in flight when it was reached: they were admitted while it was not.

An exhausted budget answers like Anthropic's own gateway for Claude Code: 429 `billing_error`
with `x-should-retry: false`, so Claude Code stops at once instead of retrying ten times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from claude_proxy.config.key_specs import KeySpec, Period
from claude_proxy.errors import ProxyError
from claude_proxy.keys.ring import Identity
from claude_proxy.state.store import StateStore

Clock = Callable[[], float]
"""Wall-clock seconds since the epoch (time.time; a fake one in the tests)."""
MINUTE = 60
COUNTER_SLACK = 86400.0
"""Seconds a period's counter outlives the period (for the usage answers of late readers)."""


def period_bounds(period: Period, now: float) -> tuple[datetime, datetime]:
    """The calendar period (UTC) holding `now`: a day, an ISO week from Monday, a month."""
    moment = datetime.fromtimestamp(now, UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day, day + timedelta(days=1)
    if period == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    following = (start + timedelta(days=32)).replace(day=1)
    return start, following


def spend_counter(name: str, period: Period, now: float) -> tuple[str, float]:
    """The store counter of `name`'s spend in the period holding `now`, and its TTL."""
    start, end = period_bounds(period, now)
    return (f"spend:{name}:{period}:{start.date().isoformat()}",
            end.timestamp() - now + COUNTER_SLACK)


def minute_counter(kind: str, name: str, now: float) -> tuple[str, float]:
    """This minute's counter of requests (`rpm`) or tokens (`tpm`), and its TTL."""
    return f"{kind}:{name}:{int(now // MINUTE)}", 2.0 * MINUTE


def money(amount: float) -> str:
    return f"${amount:,.2f}"


def utc_text(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


class Gate:
    """Admits a key's request, or refuses it with the error its client understands."""

    def __init__(self, store: StateStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    async def admit(self, identity: Identity) -> None:
        """Raises the 429 of an exhausted budget or an exceeded rpm/tpm; else counts the
        request towards this minute's rpm."""
        spec = identity.spec
        if spec is None:
            return
        now = self.clock()
        if spec.budget_usd is not None:
            await self._budget(spec, spec.budget_usd, now)
        if spec.rpm is not None:
            self._limit(spec, "rpm", spec.rpm, now)
        if spec.tpm is not None:
            self._limit(spec, "tpm", spec.tpm, now)
        if spec.rpm is not None:
            key, ttl = minute_counter("rpm", spec.name, now)
            self.store.add(key, 1.0, ttl)

    async def _budget(self, spec: KeySpec, budget: float, now: float) -> None:
        """The fleet's spend as it is now, not this process's copy of it (up to a second old,
        and new processes start without one): with four processes the copies let a key
        spend its budget about four times over (tests/soak.py measured 2.4x in its first
        second; a process just restarted admitted a spent key until its first refresh). One
        round trip to the shared store, for keys with a budget only; without it (or with Redis
        away) the local copy answers, failing open."""
        counter, ttl = spend_counter(spec.name, spec.budget_period, now)
        spent = await self.store.fresh_total(counter, ttl)
        if spent < budget:
            return
        _, end = period_bounds(spec.budget_period, now)
        raise ProxyError(
            429, f"Usage budget reached: the budget of {money(budget)} per "
                 f"{spec.budget_period} for key {spec.name} is spent ({money(spent)}); "
                 f"it resets at {utc_text(end)}",
            error_type="billing_error", headers={"x-should-retry": "false"})

    def _limit(self, spec: KeySpec, kind: str, limit: int, now: float) -> None:
        used = self.store.total(minute_counter(kind, spec.name, now)[0])
        if used < limit:
            return
        wait = max(1, math.ceil(MINUTE - now % MINUTE))
        what = "requests" if kind == "rpm" else "tokens"
        raise ProxyError(429, f"key {spec.name} is over its limit of {limit} {what} per "
                              f"minute; retry in {wait} s",
                         error_type="rate_limit_error", headers={"retry-after": str(wait)})
