"""The FastAPI application: routes, auth, body limits and Anthropic-shaped errors.

Routes and HTTP concerns only: conversion happens in `conversion/`, the flow of one request in
`service.py`, the response's lifetime (disconnects, deadline, SSE relay) in `lifecycle.py`, and
the network in `upstream.py`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from claude_proxy.access import AccessLogMiddleware, current_record
from claude_proxy.auth import key_matches, presented_keys
from claude_proxy.budget import Clock, Gate
from claude_proxy.config import Settings
from claude_proxy.conversion.fields import screen_request
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.errors import ProxyError, error_body, error_type_for_status
from claude_proxy.event_stream import EventStream
from claude_proxy.keys import Identity, KeyRing
from claude_proxy.lifecycle import ClientDisconnected, before_first_byte, relay_events
from claude_proxy.metrics import Metrics
from claude_proxy.models import CountTokensRequest, MessagesRequest, validate_request
from claude_proxy.routing.catalog import health_detail, model_entry, model_ids, models_page
from claude_proxy.routing.config import ProxyConfig, single_provider_config
from claude_proxy.routing.discovery import discover as discover_windows
from claude_proxy.routing.discovery import unknown_windows, windows
from claude_proxy.routing.providers import build_providers
from claude_proxy.routing.sessions import SESSION_HEADER
from claude_proxy.service import MessagesService
from claude_proxy.spend import Ledger
from claude_proxy.state import open_store
from claude_proxy.state.store import StateStore
from claude_proxy.ui.recorder import Recorder, provider_health
from claude_proxy.ui.routes import dashboard_router
from claude_proxy.usage import usage_router
from claude_proxy.websearch.backends import SearchBackend
from claude_proxy.websearch.caller import ServiceCaller
from claude_proxy.websearch.flow import SearchFlow, is_search_request

logger = logging.getLogger("claude_proxy.app")


def json_response(content: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers,
                    media_type="application/json")


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


async def read_json_body(request: Request, limit: int) -> Any:
    """The parsed body, refusing more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    received = bytearray()
    async for piece in request.stream():
        received += piece
        if len(received) > limit:
            raise _too_large(limit)
    if not received:
        raise ProxyError(400, "request body is empty; expected a JSON object")
    try:
        return orjson.loads(received)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc.msg}") from None


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body exceeds the {limit} byte limit",
                      error_type="request_too_large")


# ---------------------------------------------------------------- application


def create_app(settings: Settings, transport: httpx.AsyncBaseTransport | None = None,
               config: ProxyConfig | None = None, clock: Clock = time.time) -> FastAPI:
    """The application for `config` (default: the one provider `settings` describe).
    `clock`: wall-clock time for budget periods and rate limits (a fake one in tests)."""
    config = config or single_provider_config(settings)
    secret = settings.thinking_signature_secret
    signer = ThinkingSigner(secret.get_secret_value() if secret else None)

    metrics = Metrics()
    started = datetime.now(UTC)
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    store = open_store(redis_url, settings.redis_prefix, settings.redis_timeout)
    keyring = KeyRing(config.keys, _admin_key(settings)) if config.keys else None
    if keyring is not None and not _admin_key(settings):
        logger.warning("[keys] are configured but ANTHROPIC_API_KEY is not: the dashboard and "
                       "/metrics are open to anyone who can reach the proxy")
    ledger = Ledger(keyring, config.models, store, metrics, clock) if keyring else None
    gate = Gate(store, clock)

    def identify(request: Request) -> Identity:
        """Who is calling: without `[keys]`, the one client key of old (if any)."""
        if keyring is None:
            check_client_key(request, settings)
            return Identity("-")
        identity = keyring.identify(request.headers)
        if identity is None:
            raise ProxyError(401, "invalid x-api-key", error_type="authentication_error")
        current_record().key = identity.name  # the access line names the key
        return identity

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        providers = build_providers(config, transport, on_retry=metrics.count_retry,
                                    store=store)
        await discover_windows(config, transport)
        unknown = unknown_windows(config)
        if unknown:
            logger.warning("context window unknown for %s: no pre-flight check for %s "
                           "(set context_window in the config file, or CONTEXT_WINDOW)",
                           ", ".join(unknown), "it" if len(unknown) == 1 else "them")
        app.state.store = store
        await store.start()
        if ledger is not None:
            ledger.keep_usage(data_dir(config))
        app.state.service = MessagesService(config, providers, signer, metrics, store, keyring)
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

    app = FastAPI(title="claude-proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, **telemetry_option(os.environ))
    recorder = dashboard_recorder(app, config, store, ledger)
    app.state.recorder = recorder
    app.add_middleware(AccessLogMiddleware, metrics=metrics, observer=recorder, charger=ledger)
    _install_error_handlers(app)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> Response:
        return json_response({"status": "ok", "service": "claude-proxy"})

    @app.get("/health")
    async def health(request: Request) -> Response:
        """Liveness, secret-free; `?detail=1` adds each provider's state (client key
        required when one is set)."""
        if request.query_params.get("detail") not in (None, "", "0", "false"):
            check_client_key(request, settings)
            service: MessagesService = request.app.state.service
            return json_response({"status": "ok", **health_detail(
                service.providers, metrics.cache.ratios(), windows(config),
                service.store.describe())})
        return json_response({"status": "ok"})

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        identify(request)
        service: MessagesService = request.app.state.service
        return json_response(models_page(model_ids(service.router, service.providers),
                                         started))

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> Response:
        identify(request)
        service: MessagesService = request.app.state.service
        if model_id not in model_ids(service.router, service.providers):
            raise ProxyError(404, f"model {model_id!r} not found")
        return json_response(model_entry(model_id, started))

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        if not settings.metrics_public:
            check_client_key(request, settings)
        return Response(metrics.exposition(), media_type=metrics.content_type)

    async def count_tokens(request: Request) -> Response:
        identify(request)
        payload = await read_json_body(request, settings.max_request_bytes)
        body = validate_request(CountTokensRequest, payload)
        screen_request(body, request.headers.get("anthropic-beta"), refuse=False)
        service: MessagesService = request.app.state.service
        return json_response({"input_tokens": service.count_tokens(
            body, request.headers.get(SESSION_HEADER))})

    async def messages(request: Request) -> Response:
        identity = identify(request)
        payload = await read_json_body(request, settings.max_request_bytes)
        body = validate_request(MessagesRequest, payload)
        screen_request(body, request.headers.get("anthropic-beta"))
        gate.admit(identity)  # budget, rpm, tpm: before anything is sent upstream
        service: MessagesService = request.app.state.service
        deadline = asyncio.get_running_loop().time() + settings.total_timeout
        if is_search_request(body):
            return await search_response(request, body, deadline)
        session = request.headers.get(SESSION_HEADER)
        if body.get("stream"):
            converter, stream = await before_first_byte(
                request, service.open_stream(body, session), deadline)
            record = current_record()

            async def finish() -> None:
                await stream.aclose()
                service.remember_session(session, record)

            return EventStream(relay_events(converter, stream, deadline, metrics), finish)
        return json_response(await before_first_byte(request, service.create(body, session),
                                                     deadline))

    hot_routes(app, [Route("/v1/messages", messages, methods=["POST"]),
                     Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])])
    if ledger is not None:
        app.include_router(usage_router(ledger, identify))
    if recorder is not None:
        # After the API's routes: every request is matched against the routes in order.
        app.include_router(dashboard_router(settings, recorder))
    return app


_NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False}


def telemetry_option(environ: Mapping[str, str]) -> dict[str, Any]:
    """FastAPI's native OpenTelemetry (FastAPI 0.16x) looks for global tracer, meter and
    logger providers on every request (~10 µs measured). It stays as FastAPI sets it when the
    environment configures OpenTelemetry (any `OTEL_` variable, as `opentelemetry-instrument`
    reads them); otherwise it is off. Older FastAPI releases have no such option."""
    if any(name.startswith("OTEL_") for name in environ):
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


async def search_response(request: Request, body: dict[str, Any], deadline: float) -> Response:
    """A request with the web_search server tool: the search flow answers it."""
    search: SearchFlow = request.app.state.search
    plan = search.plan(body)
    if body.get("stream"):
        return EventSourceResponse(search.stream(plan, deadline), sep="\n")
    return json_response(await before_first_byte(request, search.create(plan), deadline))


def dashboard_recorder(app: FastAPI, config: ProxyConfig,
                       store: StateStore | None = None,
                       ledger: Ledger | None = None) -> Recorder | None:
    """The dashboard's memory (None with UI_ENABLED=false: then nothing is recorded)."""
    if not config.settings.ui_enabled:
        return None

    def health() -> list[Any]:
        service: MessagesService | None = getattr(app.state, "service", None)
        return provider_health(service.providers) if service is not None else []

    return Recorder(inspect=config.settings.inspect_requests, secrets=config.secrets(),
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

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> Response:
        return json_response(error_body("invalid_request_error",
                                        "request body is nested too deeply"), 400)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        return json_response(error_body("invalid_request_error", str(exc.errors()[:3])), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        return json_response(error_body(error_type_for_status(exc.status_code), message),
                             exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> Response:
        logger.exception("unexpected error while handling a request")
        return json_response(error_body("api_error", "internal proxy error"), 500)
