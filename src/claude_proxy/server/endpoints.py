"""The API's route handlers, at module level as Starlette has them: each reads what it works
with from the application's state (`Wiring`, made from the configuration by
`server/wiring.wire`, swapped whole by a reload), so the handlers are plain functions, not
closures. A request takes the Wiring once, at its first read (`wiring`), and keeps it to its
end: a reload meanwhile changes nothing of what it runs on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from claude_proxy.config.file import ProxyConfig
from claude_proxy.config.settings import Settings
from claude_proxy.conversion.census import Remembered
from claude_proxy.conversion.fields import screen_request
from claude_proxy.conversion.reuse import Slot
from claude_proxy.errors import ProxyError
from claude_proxy.keys.auth import key_matches, presented_keys
from claude_proxy.keys.budget import Gate
from claude_proxy.keys.ring import Identity, KeyRing
from claude_proxy.keys.spend import Ledger
from claude_proxy.metrics import Metrics
from claude_proxy.record import current_record
from claude_proxy.routing.catalog import (
    family_defaults,
    health_detail,
    model_entry,
    model_ids,
    models_page,
)
from claude_proxy.routing.discovery import windows
from claude_proxy.routing.sessions import SESSION_HEADER
from claude_proxy.server import incremental
from claude_proxy.server.drain import Drain
from claude_proxy.server.event_stream import EventStream
from claude_proxy.server.relay import before_first_byte, drained, relay_events
from claude_proxy.server.requests import CountTokensRequest, MessagesRequest, validate_request
from claude_proxy.service import MessagesService
from claude_proxy.state.memo import Memo
from claude_proxy.toolsearch.loop import ToolSearchFlow, is_tool_search_request
from claude_proxy.websearch.flow import SearchFlow, is_search_request


@dataclass(frozen=True)
class Wiring:
    """What the handlers share, made from one configuration (`app.state.wiring`); the
    metrics, gate, memo, start time and drain are the process's, shared by every one."""

    settings: Settings
    config: ProxyConfig
    metrics: Metrics
    gate: Gate
    keyring: KeyRing | None
    started: datetime
    """When the process started: the `created_at` of the models it lists."""
    bodies: Memo
    """Each session's last request body as its next one can reuse it (incremental.py)."""
    service: MessagesService
    search: SearchFlow
    tool_search: ToolSearchFlow
    ledger: Ledger | None
    """What the configuration's keys spend (None without `[keys]`)."""
    drain: Drain


PINNED = "claude_proxy.wiring"
"""The request scope's key for the Wiring the request runs on."""


def wiring(request: Request) -> Wiring:
    """The Wiring this request runs on: the current one at its first read, kept in its scope
    to its end (one dict lookup a read)."""
    scope = request.scope
    found: Wiring | None = scope.get(PINNED)
    if found is None:
        found = scope[PINNED] = request.app.state.wiring
    return found


def service_of(request: Request) -> MessagesService:
    return wiring(request).service


def json_response(content: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers,
                    media_type="application/json")


TOOL_CALLS_HEADER = "x-claude-proxy-tool-calls"


def message_response(message: dict[str, Any]) -> Response:
    """A whole Message; with what the tool-call guard found of the calls it checked for it
    (`valid=1;repaired=2`, docs/tool-calls.md), when it checked any. A stream has no such
    header: its head goes out before any call exists."""
    outcomes = current_record().tool_outcomes()
    summary = ";".join(f"{outcome}={count}" for outcome, count in outcomes.items())
    return json_response(message, headers={TOOL_CALLS_HEADER: summary} if summary else None)


def error_response(error: ProxyError) -> Response:
    return json_response(error.body(), error.status, error.headers)


# ---------------------------------------------------------------- request guards


def check_client_key(request: Request, settings: Settings) -> None:
    """When ANTHROPIC_API_KEY is set, `x-api-key` or `Authorization: Bearer` must match it."""
    if settings.anthropic_api_key is None or not settings.anthropic_api_key.get_secret_value():
        return
    expected = settings.anthropic_api_key.get_secret_value()
    if not key_matches(presented_keys(request.headers), expected):
        raise ProxyError(401, "invalid x-api-key", error_type="authentication_error")


def identify(request: Request) -> Identity:
    """Who is calling: without `[keys]`, the one client key of old (if any)."""
    wired = wiring(request)
    if wired.keyring is None:
        check_client_key(request, wired.settings)
        return Identity("-")
    identity = wired.keyring.identify(request.headers)
    if identity is None:
        raise ProxyError(401, "invalid x-api-key", error_type="authentication_error")
    record = current_record()
    record.key = identity.name  # the access line names the key
    record.charger = wired.ledger
    return identity


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes before reading them all. Its pieces are
    joined once, at the end: a bytearray grown piece by piece was copied as it grew, and
    orjson copies a bytearray before it parses it (on an 800 KB conversation, three copies
    instead of one)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    pieces: list[bytes] = []
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise _too_large(limit)
        pieces.append(piece)
    if not size:
        raise ProxyError(400, "request body is empty; expected a JSON object")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def parse_json(raw: bytes) -> Any:
    """The body parsed, kept as it came on the request's record (the inspector's copy)."""
    current_record().client_json = raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _not_json(exc) from None


def validated_body(raw: bytes, bodies: Memo, identity: Identity,
                   session: str | None) -> tuple[dict[str, Any], Slot | None]:
    """The request parsed and validated, and its conversation's last conversion (None
    when it is not remembered). In a session, what its previous body shares with this one
    is neither parsed nor checked again (incremental.py), nor converted again
    (conversion/reuse.py), and this body is remembered for the next (the memo is per caller
    and session: a session id chosen by one key is not another's)."""
    if not session:
        return validate_request(MessagesRequest, parse_json(raw)), None
    current_record().client_json = raw
    key = f"{identity.name}\n{session}"
    kept: incremental.SessionBodies = bodies.get(key) or incremental.SessionBodies()
    try:
        body, parsed = kept.parse(raw)
    except orjson.JSONDecodeError as exc:
        raise _not_json(exc) from None
    if parsed is None:
        return validate_request(MessagesRequest, body), None
    bodies.put(key, kept, kept.weight)
    body["messages"] = Remembered(parsed.messages, parsed.known)
    valid = validate_request(MessagesRequest, body,
                             known=parsed.rest if parsed.rest_known else None)
    parsed.running, parsed.known = valid["messages"].running, []
    return valid, parsed.turns


def _not_json(exc: orjson.JSONDecodeError) -> ProxyError:
    return ProxyError(400, f"request body is not valid JSON: {exc.msg}")


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body exceeds the {limit} byte limit",
                      error_type="request_too_large")


# ---------------------------------------------------------------- the API


async def messages(request: Request) -> Response:
    identity = identify(request)
    wired = wiring(request)
    raw = await read_body(request, wired.settings.max_request_bytes)
    session = request.headers.get(SESSION_HEADER)
    body, turns = validated_body(raw, wired.bodies, identity, session)
    record = current_record()
    record.betas = request.headers.get("anthropic-beta")
    screen_request(body, record.betas)
    await wired.gate.admit(identity)  # budget, rpm, tpm: before anything is sent upstream
    service = service_of(request)
    deadline = asyncio.get_running_loop().time() + wired.settings.total_timeout
    if is_search_request(body):
        return await search_response(request, body, deadline)
    if is_tool_search_request(body):
        return await tool_search_response(request, body, deadline)
    if body.get("stream"):
        converter, stream = await before_first_byte(
            request, service.open_stream(body, session, raw, turns), deadline, wired.drain)
        # Once the first events are on their way: freeing a long conversation's objects
        # (130 µs at 800 KB in a loop) is not for the first text to wait for.
        asyncio.get_running_loop().call_soon(record.release_parsed)

        async def finish() -> None:
            await stream.aclose()
            service.remember_session(session, record)

        return EventStream(relay_events(converter, stream, deadline, wired.metrics, wired.drain),
                           finish)
    return message_response(await before_first_byte(
        request, service.create(body, session, raw, turns), deadline, wired.drain))


async def search_response(request: Request, body: dict[str, Any], deadline: float) -> Response:
    """A request with the web_search server tool: the search flow answers it."""
    wired = wiring(request)
    plan = wired.search.plan(body)
    if body.get("stream"):
        return EventStream(drained(wired.search.stream(plan, deadline), wired.drain))
    return message_response(await before_first_byte(request, wired.search.create(plan), deadline,
                                                    wired.drain))


async def tool_search_response(request: Request, body: dict[str, Any],
                               deadline: float) -> Response:
    """A request with the tool search server tool: the tool-search flow answers it."""
    wired = wiring(request)
    plan = wired.tool_search.plan(body)
    if body.get("stream"):
        return EventStream(drained(wired.tool_search.stream(plan, deadline), wired.drain))
    return message_response(await before_first_byte(request, wired.tool_search.create(plan),
                                                    deadline, wired.drain))


async def count_tokens(request: Request) -> Response:
    identify(request)
    raw = await read_body(request, wiring(request).settings.max_request_bytes)
    body = validate_request(CountTokensRequest, parse_json(raw))
    current_record().betas = request.headers.get("anthropic-beta")
    screen_request(body, current_record().betas, refuse=False)
    return json_response({"input_tokens": await service_of(request).count_input(
        body, request.headers.get(SESSION_HEADER), raw)})


async def list_models(request: Request) -> Response:
    identify(request)
    service = service_of(request)
    return json_response(models_page(model_ids(service.router, service.providers),
                                     wiring(request).started, service.router,
                                     service.config.models))


async def get_model(request: Request) -> Response:
    identify(request)
    model_id = request.path_params["model_id"]
    service = service_of(request)
    ids = model_ids(service.router, service.providers)
    if model_id not in ids:
        raise ProxyError(404, f"model {model_id!r} not found")
    return json_response(model_entry(model_id, wiring(request).started, service.router,
                                     service.config.models,
                                     model_id in family_defaults(service.router, ids)))


# ---------------------------------------------------------------- operations


async def root(request: Request) -> Response:
    return json_response({"status": "ok", "service": "claude-proxy"})


async def health(request: Request) -> Response:
    """Readiness, secret-free: 503 `draining` from SIGTERM on (server/drain.py). `?detail=1`
    adds each provider's state, the configuration's (its last reload) and where spend is
    kept (client key required when one is set)."""
    wired = wiring(request)
    status, code = ("draining", 503) if wired.drain.draining else ("ok", 200)
    if request.query_params.get("detail") not in (None, "", "0", "false"):
        check_client_key(request, wired.settings)
        service = wired.service
        configuration: dict[str, Any] = request.app.state.reloader.describe()
        spend = await wired.ledger.durability() if wired.ledger is not None else None
        return json_response({"status": status, **health_detail(
            service.providers, wired.metrics.cache.ratios(), windows(wired.config),
            service.store.describe()), "configuration": configuration, "spend": spend}, code)
    return json_response({"status": status}, code)


async def live(request: Request) -> Response:
    """Liveness: 200 while the process serves, draining or not (a liveness probe that
    failed during a drain would have the process killed before its answers end)."""
    return json_response({"status": "ok"})


async def prometheus_metrics(request: Request) -> Response:
    wired = wiring(request)
    if not wired.settings.metrics_public:
        check_client_key(request, wired.settings)
    return Response(wired.metrics.exposition(), media_type=wired.metrics.content_type)
