"""The dashboard's HTTP side: the page, its live feed, the inspector's data, and the login.

With ANTHROPIC_API_KEY set, everything but the static assets (code, no data) needs the key:
either presented as the API takes it (`x-api-key`, `Authorization: Bearer`), or through the
login form, which sets an HttpOnly, SameSite=Strict session cookie. The cookie's value is
not the key: a random nonce and an expiry, signed with a key derived from the client key, so
that every worker can check it without shared state. Without a key the dashboard is as open
as the API.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import secrets
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse

from claude_proxy.config.settings import Settings
from claude_proxy.errors import error_body
from claude_proxy.keys.auth import key_matches, presented_keys
from claude_proxy.ui.fleet import Seen
from claude_proxy.ui.recorder import Recorder

COOKIE = "claude_proxy_ui"
SESSION_SECONDS = 7 * 24 * 3600
LOGIN_BODY_LIMIT = 4096
TICK_SECONDS = 1.0
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html",
                ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Sessions:
    """Session cookie values that any worker sharing the client key can verify."""

    def __init__(self, client_key: str) -> None:
        self._mac_key = hashlib.sha256(b"claude-proxy dashboard session\0"
                                       + client_key.encode()).digest()

    def _mac(self, nonce: str, expires: int) -> str:
        return hmac.new(self._mac_key, f"{nonce}.{expires}".encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float) -> str:
        nonce, expires = secrets.token_urlsafe(18), int(now) + SESSION_SECONDS
        return f"{nonce}.{expires}.{self._mac(nonce, expires)}"

    def valid(self, value: str, now: float) -> bool:
        nonce, _, rest = value.partition(".")
        expires, _, mac = rest.partition(".")
        if not nonce or not expires.isdigit() or int(expires) < now:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(nonce, int(expires)).encode())


def _static(name: str) -> bytes:
    return (resources.files("claude_proxy.ui") / "static" / name).read_bytes()


def login_page(message: str, next_path: str) -> bytes:
    note = f'<p class="login-error">{html.escape(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>claude-proxy · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/ui/static/app.css"></head>
<body class="login"><form method="post" action="/ui/login" class="login-box">
<h1>claude-proxy</h1><p>This proxy needs its client key (ANTHROPIC_API_KEY) for the dashboard.
</p>{note}<label>Key <input type="password" name="key" autocomplete="current-password"
autofocus required></label><input type="hidden" name="next" value="{html.escape(next_path)}">
<button type="submit">Open the dashboard</button></form></body></html>""".encode()


class Dashboard:
    """What the dashboard's handlers share (`app.state.dashboard`): the recorder, and the
    client key's session cookies when a key is set."""

    def __init__(self, settings: Settings, recorder: Recorder) -> None:
        secret = settings.anthropic_api_key
        self.key = secret.get_secret_value() if secret else ""
        self.sessions = Sessions(self.key) if self.key else None
        self.recorder = recorder
        self.page = _static("index.html")

    def authorized(self, request: Request) -> bool:
        if self.sessions is None:
            return True
        cookie = request.cookies.get(COOKIE)
        if cookie and self.sessions.valid(cookie, time.time()):
            return True
        return key_matches(presented_keys(request.headers), self.key)

    def json_response(self, data: Any, status: int = 200) -> Response:
        return Response(self.recorder.dumps(data), status, headers=SECURITY_HEADERS,
                        media_type="application/json")

    def unauthorized(self) -> Response:
        return self.json_response(error_body("authentication_error", "the dashboard needs "
                                             "the client key (sign in at /ui)"), 401)


def dashboard_of(request: Request) -> Dashboard:
    found: Dashboard = request.app.state.dashboard
    return found


def html_response(content: bytes, status: int = 200) -> Response:
    return Response(content, status, headers=SECURITY_HEADERS, media_type="text/html")


async def show_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    if not dashboard.authorized(request):
        return html_response(login_page("", request.url.path), 401)
    return html_response(dashboard.page)


async def login(request: Request) -> Response:
    dashboard = dashboard_of(request)
    body = await _small_body(request)
    fields = parse_qs(body.decode(errors="replace"))
    next_path = fields.get("next", ["/ui"])[0]
    if not next_path.startswith("/ui") or next_path.startswith("/ui/login"):
        next_path = "/ui"
    if dashboard.sessions is None:
        return Response(status_code=303, headers={"location": next_path})
    if not key_matches([fields.get("key", [""])[0]], dashboard.key):
        return html_response(login_page("That is not the key.", next_path), 401)
    response = Response(status_code=303, headers={"location": next_path,
                                                  "cache-control": "no-store"})
    response.set_cookie(COOKIE, dashboard.sessions.issue(time.time()), max_age=SESSION_SECONDS,
                        path="/ui", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


async def logout() -> Response:
    response = Response(status_code=303, headers={"location": "/ui"})
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


async def feed(request: Request) -> Response:
    dashboard = dashboard_of(request)
    if not dashboard.authorized(request):
        return dashboard.unauthorized()
    return EventSourceResponse(live_feed(dashboard.recorder), ping=15, headers=SECURITY_HEADERS)


async def inspect(request: Request, request_id: str) -> Response:
    dashboard = dashboard_of(request)
    if not dashboard.authorized(request):
        return dashboard.unauthorized()
    view = await dashboard.recorder.fleet_inspect(request_id)
    if view is None:
        where = ("among the fleet's last requests" if dashboard.recorder.sharing()
                 else "in this worker's memory")
        return dashboard.json_response(error_body("not_found_error", f"no such request {where}"),
                                       404)
    return dashboard.json_response(view)


async def static(request: Request, name: str) -> Response:
    suffix = name[name.rfind("."):] if "." in name else ""
    if "/" in name or suffix not in STATIC_TYPES or name == "index.html":
        return dashboard_of(request).json_response(error_body("not_found_error", "no such file"),
                                                   404)
    try:
        content = _static(name)
    except FileNotFoundError:
        return dashboard_of(request).json_response(error_body("not_found_error", "no such file"),
                                                   404)
    return Response(content, media_type=STATIC_TYPES[suffix],
                    headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})


def dashboard_router() -> APIRouter:
    """The dashboard's routes; their handlers read `app.state.dashboard`."""
    router = APIRouter()
    for path, handler, method in (("/ui", show_page, "GET"),
                                  ("/ui/requests/{request_id}", show_page, "GET"),
                                  ("/ui/login", login, "POST"), ("/ui/logout", logout, "POST"),
                                  ("/ui/feed", feed, "GET"),
                                  ("/ui/api/requests/{request_id}", inspect, "GET"),
                                  ("/ui/static/{name}", static, "GET")):
        router.add_api_route(path, handler, methods=[method], include_in_schema=False)
    return router


async def _small_body(request: Request) -> bytes:
    received = bytearray()
    async for piece in request.stream():
        received += piece
        if len(received) > LOGIN_BODY_LIMIT:
            break
    return bytes(received[:LOGIN_BODY_LIMIT])


async def _hello(recorder: Recorder, seen: Seen) -> dict[str, str]:
    """The whole picture, its rows marked as sent."""
    snapshot = await recorder.fleet_snapshot()
    for row in snapshot["requests"]:
        seen.add(str(row["id"]))
    return {"event": "hello", "data": recorder.dumps(snapshot).decode()}


async def live_feed(recorder: Recorder) -> AsyncIterator[dict[str, str]]:
    """`hello` (everything), then `request` as each one finishes and `live` every second;
    a viewer that fell behind gets a fresh `hello`."""
    subscription = recorder.subscribe()
    loop = asyncio.get_running_loop()
    seen = Seen()
    try:
        yield await _hello(recorder, seen)
        next_tick = loop.time() + TICK_SECONDS
        while True:
            if subscription.behind:
                while not subscription.queue.empty():
                    subscription.queue.get_nowait()
                subscription.behind = False
                yield await _hello(recorder, seen)
            wait = next_tick - loop.time()
            if wait <= 0:
                next_tick = loop.time() + TICK_SECONDS
                for row in await recorder.fleet_news(seen):  # other processes' requests
                    yield {"event": "request", "data": recorder.dumps(row).decode()}
                live = await recorder.fleet_live()
                yield {"event": "live", "data": recorder.dumps(live).decode()}
                continue
            try:
                async with asyncio.timeout(wait):
                    event, data = await subscription.queue.get()
            except TimeoutError:
                continue
            yield {"event": event, "data": recorder.dumps(data).decode()}
    finally:
        recorder.unsubscribe(subscription)
