"""The FastAPI application, composed: what the handlers share, the middleware, the routes, the
error handlers, and the lifespan that starts what talks to the world.

Composition only: the handlers are `server/endpoints.py`, the flow of one request
`service.py`, the response's lifetime (disconnects, deadline, SSE relay) `server/relay.py`,
conversion `conversion/`, and the network `upstream/`.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from claude_proxy.config.file import ProxyConfig, judge_route, single_provider_config
from claude_proxy.config.settings import Settings
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.errors import ProxyError, error_body, error_type_for_status
from claude_proxy.judge import RouteJudge
from claude_proxy.keys.budget import Clock, Gate
from claude_proxy.keys.ring import KeyRing
from claude_proxy.keys.spend import Ledger
from claude_proxy.keys.usage_api import usage_router
from claude_proxy.metrics import Metrics
from claude_proxy.routing.discovery import discover as discover_windows
from claude_proxy.routing.discovery import unknown_windows
from claude_proxy.routing.providers import build_providers
from claude_proxy.server import endpoints
from claude_proxy.server.access_log import AccessLogMiddleware
from claude_proxy.server.endpoints import Wiring, error_response, json_response
from claude_proxy.server.incremental import REMEMBER_FOR
from claude_proxy.server.relay import ClientDisconnected
from claude_proxy.service import MessagesService
from claude_proxy.state import open_store
from claude_proxy.state.memo import Memo
from claude_proxy.state.store import StateStore
from claude_proxy.telemetry import (
    Exporters,
    ProxyFacts,
    Telemetry,
    open_telemetry,
    upstream_of,
)
from claude_proxy.toolsearch.loop import ToolSearchFlow
from claude_proxy.toolsearch.loop import flatten as flatten_tool_search
from claude_proxy.ui.inspect import message_of
from claude_proxy.ui.recorder import Recorder, provider_health
from claude_proxy.ui.routes import Dashboard, dashboard_router
from claude_proxy.websearch.backends import SearchBackend
from claude_proxy.websearch.caller import ServiceCaller
from claude_proxy.websearch.flow import SearchFlow
from claude_proxy.websearch.search_blocks import replay_blocks

logger = logging.getLogger("claude_proxy.app")


def create_app(settings: Settings, transport: httpx.AsyncBaseTransport | None = None,
               config: ProxyConfig | None = None, clock: Clock = time.time,
               telemetry_exporters: Exporters | None = None) -> FastAPI:
    """The application for `config` (default: the one provider `settings` describe).
    `clock`: wall-clock time for budget periods and rate limits (a fake one in tests);
    `telemetry_exporters`: OpenTelemetry's spans and metrics there (tests), else where the
    OTEL_ variables say, if they say."""
    config = config or single_provider_config(settings)
    telemetry = open_telemetry(os.environ, ProxyFacts({
        name: upstream_of(provider.provider_name, provider.openai_base_url)
        for name, provider in config.providers.items()}, config.secrets(), message_of),
        telemetry_exporters)
    metrics = Metrics()
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    store = open_store(redis_url, settings.redis_prefix, settings.redis_timeout)
    keyring = KeyRing(config.keys, _admin_key(settings)) if config.keys else None
    if keyring is not None and not _admin_key(settings):
        logger.warning("[keys] are configured but ANTHROPIC_API_KEY is not: the dashboard and "
                       "/metrics are open to anyone who can reach the proxy")
    ledger = Ledger(keyring, config.models, store, metrics, clock) if keyring else None
    app = FastAPI(title="claude-proxy", lifespan=partial(lifespan, transport=transport),
                  docs_url=None, redoc_url=None, openapi_url=None,
                  **telemetry_option(os.environ, own=telemetry is not None))
    gate = Gate(store, clock)
    bodies = Memo(settings.session_memo_bytes, REMEMBER_FOR)
    app.state.wiring = Wiring(settings, config, metrics, gate, keyring, datetime.now(UTC),
                              bodies)
    app.state.store, app.state.ledger, app.state.telemetry = store, ledger, telemetry
    app.state.recorder = dashboard_recorder(app, config, store, ledger)
    app.add_middleware(AccessLogMiddleware, metrics=metrics, observer=app.state.recorder,
                       charger=ledger, telemetry=telemetry)
    _install_error_handlers(app)
    _add_routes(app)
    return app


def _add_routes(app: FastAPI) -> None:
    """The API's routes, the usage routes with `[keys]`, then the dashboard's (routes are
    matched in order)."""
    app.add_api_route("/", endpoints.root, methods=["GET", "HEAD"])
    app.add_api_route("/health", endpoints.health, methods=["GET"])
    app.add_api_route("/v1/models", endpoints.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", endpoints.get_model, methods=["GET"])
    app.add_api_route("/metrics", endpoints.prometheus_metrics, methods=["GET"])
    hot_routes(app, [Route("/v1/messages", endpoints.messages, methods=["POST"]),
                     Route("/v1/messages/count_tokens", endpoints.count_tokens,
                           methods=["POST"])])
    if app.state.ledger is not None:
        app.include_router(usage_router(app.state.ledger, endpoints.identify))
    if app.state.recorder is not None:
        app.state.dashboard = Dashboard(app.state.wiring.settings, app.state.recorder)
        app.include_router(dashboard_router())


def replayed(body: dict[str, Any], signer: ThinkingSigner) -> dict[str, Any]:
    """Earlier turns' server-tool blocks (tool search, web search) as the upstream takes them:
    tool search first, whose `server_tool_use` blocks are not searches of the web."""
    return replay_blocks(flatten_tool_search(body), signer)


@asynccontextmanager
async def lifespan(app: FastAPI, transport: httpx.AsyncBaseTransport | None
                   ) -> AsyncIterator[None]:
    """Starts what talks to the world (upstream clients, window discovery, the store, the
    usage log, the search backend) and closes it again."""
    wired: Wiring = app.state.wiring
    config, settings, metrics, store = wired.config, wired.settings, wired.metrics, app.state.store
    secret = settings.thinking_signature_secret
    signer = ThinkingSigner(secret.get_secret_value() if secret else None)
    providers = build_providers(config, transport, on_retry=metrics.count_retry, store=store)
    await discover_windows(config, transport)
    unknown = unknown_windows(config)
    if unknown:
        logger.warning("context window unknown for %s: no pre-flight check for %s "
                       "(set context_window in the config file, or CONTEXT_WINDOW)",
                       ", ".join(unknown), "it" if len(unknown) == 1 else "them")
    await store.start()
    ledger: Ledger | None = app.state.ledger
    if ledger is not None:
        ledger.keep_usage(data_dir(config))
    app.state.service = MessagesService(config, providers, signer, metrics, store, wired.keyring,
                                        replay=partial(replayed, signer=signer))
    app.state.tool_search = ToolSearchFlow(app.state.service)
    route = judge_route(config)
    if route:
        app.state.service.judge = RouteJudge(app.state.service, route,
                                             settings.safeguards_timeout)
    backend = SearchBackend(settings) if settings.web_search_backend else None
    app.state.search = SearchFlow(settings, backend, ServiceCaller(app.state.service),
                                  signer, metrics)
    try:
        yield
    finally:
        for provider in providers.values():
            await provider.client.aclose()
        if backend is not None:
            await backend.aclose()
        if ledger is not None:
            ledger.log.close()
        await store.close()
        metrics.close()
        telemetry: Telemetry | None = app.state.telemetry
        if telemetry is not None:
            telemetry.shutdown()


_NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False}


def telemetry_option(environ: Mapping[str, str], own: bool = False) -> dict[str, Any]:
    """FastAPI's native OpenTelemetry (FastAPI 0.16x) looks for global tracer, meter and
    logger providers on every request (~10 µs measured). It is off when the proxy's own
    telemetry is on (`own`: `telemetry/` makes the SERVER span, ended after the request's
    record is complete, which FastAPI's ends before; 23 µs a request against FastAPI's span
    and HTTP metrics' 59 µs, measured with both on an SDK provider). Otherwise it stays as
    FastAPI sets it when the environment configures OpenTelemetry (any `OTEL_` variable, as
    `opentelemetry-instrument` reads them), and is off without one. Older FastAPI releases
    have no such option."""
    if not own and any(name.startswith("OTEL_") for name in environ):
        return {}
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": _NO_TELEMETRY}


def hot_routes(app: FastAPI, routes: list[Route]) -> None:
    """The API's busiest routes, as plain Starlette routes first in the route list: routes are
    matched in order, and FastAPI's per-request work for a route (dependency solving, its exit
    stacks), which these handlers do not use, measured 26 µs of the ~40 µs the framework
    spent on one request before any of ours, and its wrapper's frames ~5 KiB per open
    stream (bench/README.md). Errors still reach the exception handlers: those run around
    every route."""
    app.router.routes[0:0] = routes


def data_dir(config: ProxyConfig) -> Path:
    """DATA_DIR, else `data/` beside the config file (keys exist only with one)."""
    if config.settings.data_dir:
        return Path(config.settings.data_dir)
    return Path(config.source).resolve().parent / "data"


def _admin_key(settings: Settings) -> str | None:
    key = settings.anthropic_api_key
    return key.get_secret_value() if key is not None else None


def dashboard_recorder(app: FastAPI, config: ProxyConfig,
                       store: StateStore | None = None,
                       ledger: Ledger | None = None) -> Recorder | None:
    """The dashboard's memory (None with UI_ENABLED=false: then nothing is recorded)."""
    if not config.settings.ui_enabled:
        return None

    def health() -> list[Any]:
        service: MessagesService | None = getattr(app.state, "service", None)
        return provider_health(service.providers) if service is not None else []

    return Recorder(inspect=config.settings.inspect_requests,
                    inspect_bytes=config.settings.inspect_bytes, secrets=config.secrets(),
                    health=health, store=store,
                    keys=ledger.panel if ledger is not None else None)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProxyError)
    async def proxy_error(_: Request, exc: ProxyError) -> Response:
        return error_response(exc)

    @app.exception_handler(ClientDisconnected)
    async def client_left(_: Request, exc: ClientDisconnected) -> Response:
        logger.info("client disconnected before the response started; upstream cancelled")
        return Response(status_code=499)

    @app.exception_handler(ClientDisconnect)
    async def client_left_mid_body(_: Request, exc: ClientDisconnect) -> Response:
        # Before its body was complete: nothing was sent upstream, the access line says 499.
        return Response(status_code=499)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> Response:
        return _too_deep()

    @app.exception_handler(orjson.JSONEncodeError)
    async def too_deep_to_write(request: Request, exc: orjson.JSONEncodeError) -> Response:
        # orjson reads 1,024 levels but writes 255: a tool's input or schema nested deeper
        # parses, and then cannot be written into the upstream request.
        if "Recursion limit" in str(exc):
            return _too_deep()
        return await unexpected_error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        return json_response(error_body("invalid_request_error", str(exc.errors()[:3])), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        return json_response(error_body(error_type_for_status(exc.status_code), message),
                             exc.status_code, dict(exc.headers or {}))

    app.add_exception_handler(Exception, unexpected_error)


async def unexpected_error(_: Request, exc: Exception) -> Response:
    """A fault of the proxy's own (no client's input leads here: requests are validated at
    the edge). The connection is closed after the answer: uvicorn closes it once the error
    has been logged, and the client must not send its next request on it."""
    logger.exception("unexpected error while handling a request")
    return json_response(error_body("api_error", "internal proxy error"), 500,
                         {"connection": "close"})


def _too_deep() -> Response:
    return json_response(error_body("invalid_request_error",
                                    "request body is nested too deeply"), 400)
