"""`GET /v1/usage` and `GET /v1/usage/me`: spend and tokens, added up from the usage log.

`/v1/usage?group_by=key|model|provider|day|session|request_class|prompt_id&from=&to=`: the
administrator sees every key, a key only itself. `from` / `to` are dates (`2026-11-01`; `to`
counts its whole day), ISO times or epoch seconds; by default the current calendar month.
`/v1/usage/me`: the caller's spend today and in its budget period, and what is left (what
`claude-proxy statusline` shows).
Answers carry key names, never a key or its hash.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from claude_proxy.errors import ProxyError
from claude_proxy.keys.budget import period_bounds
from claude_proxy.keys.ring import Identity
from claude_proxy.keys.spend import ADMIN_PERIOD, USAGE_FIELDS, Ledger
from claude_proxy.state.store import Record

GROUPS = ("key", "model", "provider", "day", "session", "request_class",
          "prompt_id")
"""`request_class` and `prompt_id`: Claude Code's gateway hints (record.py), `-` without them."""
ANTHROPIC_NAMES = {"input": "input_tokens", "output": "output_tokens",
                   "cache_read": "cache_read_input_tokens",
                   "cache_write": "cache_creation_input_tokens"}


def parse_moment(text: str, end: bool) -> float:
    """A query bound: epoch seconds, an ISO time, or a date (its start, or for `to` its end)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        day = date.fromisoformat(text)
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return (moment + timedelta(days=1 if end else 0)).timestamp()
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ProxyError(400, f"{'to' if end else 'from'}: expected a date (2026-11-01), an "
                              f"ISO time or epoch seconds, got {text[:40]!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def group_name(entry: Record, group_by: str) -> str:
    if group_by == "day":
        return datetime.fromtimestamp(float(entry["ts"]), UTC).date().isoformat()
    value = entry.get(group_by)
    return str(value) if value else "-"


def aggregate(entries: list[Record], group_by: str) -> tuple[list[dict[str, Any]],
                                                             dict[str, Any]]:
    """One row per group (sorted by its name) and the total: requests, tokens, cost."""
    rows: dict[str, dict[str, Any]] = {}
    total = _empty()
    for entry in entries:
        name = group_name(entry, group_by)
        row = rows.setdefault(name, {group_by: name, **_empty()})
        for target in (row, total):
            target["requests"] += 1
            for kind in USAGE_FIELDS:
                target[ANTHROPIC_NAMES[kind]] += int(entry.get(kind) or 0)
            target["cost_usd"] += float(entry.get("cost_usd") or 0.0)
    for target in (*rows.values(), total):
        target["cost_usd"] = round(target["cost_usd"], 6)
    return [rows[name] for name in sorted(rows)], total


def _empty() -> dict[str, Any]:
    return {"requests": 0, **{name: 0 for name in ANTHROPIC_NAMES.values()}, "cost_usd": 0.0}


def usage_router(ledger_of: Callable[[Request], Ledger | None],
                 identify: Callable[[Request], Identity]) -> APIRouter:
    """The usage routes; `ledger_of`: the ledger of the configuration the request runs on
    (None without `[keys]`: 404, as if the routes did not exist)."""
    router = APIRouter()

    def answer(content: Any) -> Response:
        return Response(orjson.dumps(content), media_type="application/json")

    def ledger_for(request: Request) -> Ledger:
        ledger = ledger_of(request)
        if ledger is None:
            raise ProxyError(404, "no [keys] are configured: usage is counted for team keys "
                                  "only", error_type="not_found_error")
        return ledger

    @router.get("/v1/usage")
    async def usage(request: Request) -> Response:
        ledger = ledger_for(request)
        identity = identify(request)
        params = request.query_params
        group_by = params.get("group_by", "key")
        if group_by not in GROUPS:
            raise ProxyError(400, f"group_by: expected one of {', '.join(GROUPS)}")
        now = ledger.clock()
        since = (parse_moment(params["from"], end=False) if params.get("from")
                 else period_bounds("month", now)[0].timestamp())
        until = parse_moment(params["to"], end=True) if params.get("to") else now + 1
        entries = await ledger.log.entries(since, until)
        if not identity.admin:
            entries = [entry for entry in entries if entry.get("key") == identity.name]
        rows, total = aggregate(entries, group_by)
        return answer({"group_by": group_by, "from": iso(since), "to": iso(until),
                       "key": None if identity.admin else identity.name,
                       "data": rows, "total": total})

    @router.get("/v1/usage/me")
    async def me(request: Request) -> Response:
        ledger = ledger_for(request)
        identity = identify(request)
        spec = identity.spec
        period = spec.budget_period if spec is not None else ADMIN_PERIOD
        today, spent = await ledger.spent_now(spec, identity.name)
        budget = spec.budget_usd if spec is not None else None
        _, end = period_bounds(period, ledger.clock())
        return answer({
            "key": identity.name, "today_usd": round(today, 6),
            "period": period, "period_usd": round(spent, 6), "budget_usd": budget,
            "remaining_usd": round(max(budget - spent, 0.0), 6) if budget is not None else None,
            "resets_at": end.isoformat().replace("+00:00", "Z"),
            "rpm": spec.rpm if spec is not None else None,
            "tpm": spec.tpm if spec is not None else None})

    return router
