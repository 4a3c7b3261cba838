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
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from claude_proxy.config.file import ProxyConfig, single_provider_config
from claude_proxy.config.settings import Settings
from claude_proxy.errors import ProxyError, error_body, error_type_for_status
from claude_proxy.keys.budget import Clock, Gate
from claude_proxy.keys.usage_api import usage_router
from claude_proxy.logs import redact_also
from claude_proxy.metrics import Metrics
from claude_proxy.server import endpoints
from claude_proxy.server.access_log import AccessLogMiddleware
from claude_proxy.server.drain import Drain
from claude_proxy.server.endpoints import Wiring, error_response, json_response
from claude_proxy.server.incremental import REMEMBER_FOR
from claude_proxy.server.relay import ClientDisconnected
from claude_proxy.server.reload import Reloader, Source
from claude_proxy.server.wiring import Lasting, close_all, retire, warn_if_spend_unsafe, wire
from claude_proxy.state import open_store
from claude_proxy.state.memo import Memo
from claude_proxy.state.store import StateStore
from claude_proxy.telemetry import Exporters, ProxyFacts, Telemetry, open_telemetry
from claude_proxy.ui.inspect import message_of
from claude_proxy.ui.recorder import Recorder, provider_health
from claude_proxy.ui.routes import Dashboard, dashboard_router

logger = logging.getLogger("claude_proxy.app")


def create_app(settings: Settings, transport: httpx.AsyncBaseTransport | None = None,
               config: ProxyConfig | None = None, clock: Clock = time.time,
               telemetry_exporters: Exporters | None = None,
               source: Source | None = None) -> FastAPI:
    """The application for `config` (default: the one provider `settings` describe).
    `clock`: wall-clock time for budget periods and rate limits (a fake one in tests);
    `telemetry_exporters`: OpenTelemetry's spans and metrics there (tests), else where the
    OTEL_ variables say, if they say; `source`: where a reload reads the configuration again
    (SIGHUP, --watch-config; none: a reload is refused)."""
    config = config or single_provider_config(settings)
    facts = ProxyFacts({}, config.secrets(), message_of)
    telemetry = open_telemetry(os.environ, facts, telemetry_exporters)
    metrics = Metrics()
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    store = open_store(redis_url, settings.redis_prefix, settings.redis_timeout)
    app = FastAPI(title="claude-proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, **telemetry_option(os.environ, own=telemetry is not None))
    lasting = Lasting(metrics, store, Gate(store, clock),
                      Memo(settings.session_memo_bytes, REMEMBER_FOR), datetime.now(UTC),
                      Drain(settings.drain_delay, settings.drain_timeout), clock, facts,
                      transport)
    app.state.lasting, app.state.config = lasting, config
    app.state.store, app.state.telemetry = store, telemetry
    app.state.recorder = dashboard_recorder(app, config, store)
    app.state.reloader = Reloader(source, lasting, lambda: app.state.wiring,
                                  partial(publish, app))
    app.add_middleware(AccessLogMiddleware, metrics=metrics, observer=app.state.recorder,
                       telemetry=telemetry)
    _install_error_handlers(app)
    _add_routes(app)
    return app


def _add_routes(app: FastAPI) -> None:
    """The API's routes, the usage routes (404 without `[keys]`), then the dashboard's
    (routes are matched in order)."""
    app.add_api_route("/", endpoints.root, methods=["GET", "HEAD"])
    app.add_api_route("/health", endpoints.health, methods=["GET"])
    app.add_api_route("/health/live", endpoints.live, methods=["GET"])
    app.add_api_route("/v1/models", endpoints.list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", endpoints.get_model, methods=["GET"])
    app.add_api_route("/metrics", endpoints.prometheus_metrics, methods=["GET"])
    hot_routes(app, [Route("/v1/messages", endpoints.messages, methods=["POST"]),
                     Route("/v1/messages/count_tokens", endpoints.count_tokens,
                           methods=["POST"])])
    app.include_router(usage_router(lambda request: endpoints.wiring(request).ledger,
                                    endpoints.identify))
    if app.state.recorder is not None:
        app.state.dashboard = Dashboard(app.state.config.settings, app.state.recorder)
        app.include_router(dashboard_router())


def publish(app: FastAPI, wired: Wiring) -> None:
    """A reload's configuration, swapped in: the handlers' Wiring (one assignment: a request
    reads it once), the dashboard's key, and the secrets it brought, redacted from now on."""
    secrets = wired.config.secrets()
    redact_also(secrets)
    app.state.lasting.facts.secrets.extend(secrets)
    if app.state.recorder is not None:
        app.state.recorder.add_secrets(secrets)
        app.state.dashboard = Dashboard(wired.settings, app.state.recorder)
    app.state.wiring = wired


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Starts what talks to the world (the configuration's upstream clients, window
    discovery, usage log and search backend, then the store), takes SIGHUP (reload) and
    SIGTERM (drain), and closes it all again. The store starts last: the clients' set-up
    holds the event loop (TLS contexts), and a Redis call waiting meanwhile would time out,
    sending the new process to in-process state, where a spent budget is not seen, just as
    it begins to serve (tests/soak.py's restarts found it on a loaded host)."""
    lasting: Lasting = app.state.lasting
    app.state.wiring = first = await wire(app.state.config, lasting)
    await lasting.store.start()
    reloader: Reloader = app.state.reloader
    reloader.start()
    lasting.drain.take_over_sigterm()
    if first.ledger is not None:
        await warn_if_spend_unsafe(first.ledger)
    try:
        yield
    finally:
        await reloader.stop()
        await close_all(retire(app.state.wiring, None))
        if lasting.usage is not None:
            lasting.usage.close()
        await lasting.store.close()
        lasting.metrics.close()
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


def dashboard_recorder(app: FastAPI, config: ProxyConfig,
                       store: StateStore | None = None) -> Recorder | None:
    """The dashboard's memory (None with UI_ENABLED=false: then nothing is recorded); what it
    shows of providers, keys and the configuration comes from the Wiring served."""
    if not config.settings.ui_enabled:
        return None

    def served() -> Wiring | None:
        found: Wiring | None = getattr(app.state, "wiring", None)
        return found

    def health() -> list[Any]:
        wired = served()
        return provider_health(wired.service.providers) if wired is not None else []

    def keys() -> list[dict[str, Any]]:
        wired = served()
        return wired.ledger.panel() if wired is not None and wired.ledger is not None else []

    def configuration() -> dict[str, Any] | None:
        reloader: Reloader = app.state.reloader
        return reloader.describe() if served() is not None else None

    return Recorder(inspect=config.settings.inspect_requests,
                    inspect_bytes=config.settings.inspect_bytes, secrets=config.secrets(),
                    health=health, store=store, keys=keys, configuration=configuration)


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
