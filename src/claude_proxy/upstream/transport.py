"""The upstream's HTTP transport: httpx's API (requests, responses, timeouts, proxies from the
environment) over aiohttp's connection pool.

Why: per streamed chunk httpx's own transport (httpcore) cost 18–19 µs of CPU against 4–5 µs
for aiohttp's (200 concurrent streams × 200 chunks, loopback), and httpcore's pool scans and
polls every idle connection whenever a request starts or ends. This is the same idea as the
`httpx-aiohttp` package (what the OpenAI and Anthropic SDKs offer as their fast client), kept
in our hands because its exception mapping turns a dropped connection into `ConnectTimeout`
and it sends no request twice on a stale connection.

What users rely on, kept: connect/read/pool timeouts from `httpx.Timeout`, `HTTP(S)_PROXY`
and `NO_PROXY` (httpx's own mounts, one transport per proxy), `SSL_CERT_FILE`/`SSL_CERT_DIR`
(httpx's SSL context), the connection limit, cancellation (a cancelled request closes its
connection), and one `aiohttp.ClientSession` per transport, closed with the client.

A request that fails on a *reused* connection before any byte of the answer came back (the
server had closed it: llama.cpp after each streamed reply, gateways after an idle timeout) is
sent once more on a fresh connection: the server never saw it, so this is no retry.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import os
import ssl
import sys
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_writer import StreamWriter
from yarl import URL

from claude_proxy.conversion.reuse import Spliced

_REUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("upstream_reused", default=False)
"""Whether the current request's connection came from the pool (set by `_Connector`)."""


class _Connector(aiohttp.TCPConnector):
    """aiohttp's pool, telling the request whether its connection was used before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._seen: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: Any) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            _REUSED.set(protocol in self._seen)
            self._seen.add(protocol)
        return connection


def httpx_error_for(exc: BaseException) -> httpx.TransportError | None:
    """An aiohttp failure as the httpx exception httpcore raises for the same event."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(exc) or "connect timed out")
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return httpx.ReadTimeout(str(exc) or "read timed out")
    if isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return httpx.ProxyError(str(exc))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(str(exc))
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(str(exc))
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(str(exc))
    if isinstance(exc, aiohttp.ClientError):
        return httpx.RemoteProtocolError(str(exc))
    return None


@contextmanager
def _httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        mapped = httpx_error_for(exc)
        if mapped is None:
            raise
        raise mapped from exc


class OneShotBody(httpx.AsyncByteStream):
    """A request body the transport takes once, so that it is not kept for as long as the
    response is open (a Claude Code request is 100 KB or more; a stream lasts minutes)."""

    def __init__(self, body: bytes | Spliced) -> None:
        self._body = body
        self.taken = False

    def take(self) -> bytes | Spliced:
        body, self._body, self.taken = self._body, b"", True
        return body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield bytes(self._body)  # another transport (the tests' mocks) reads it whole


LARGE_BODY = 64 * 1024
"""From this size a request body is written after its headers rather than joined to them."""


class _HeadersFirst(aiohttp.BytesPayload):
    """A large request body, written after its headers. aiohttp joins the headers and the
    first chunk into one write, and on Python before 3.12.9 it does so by copying them into
    one buffer: on Claude Code's 800 KB conversations, a copy of the body (and the page
    faults of a fresh 800 KB) on every request. An empty first write sends the headers
    alone; the body then goes to the socket as it is. (Were aiohttp to stop holding the
    headers back, the empty write would do nothing and the join would come back: slower,
    never wrong.)"""

    async def write_with_length(self, writer: AbstractStreamWriter,
                                content_length: int | None) -> None:
        await writer.write(b"")
        await super().write_with_length(writer, content_length)


WRITELINES_UNSAFE = ((3, 12) <= sys.version_info < (3, 12, 9)
                     or (3, 13) <= sys.version_info < (3, 13, 2))
"""Pythons whose asyncio `writelines` ignored the write buffer's limit (CVE-2024-12254)."""


class _Pieces(aiohttp.Payload):
    """A session's next turn, written as the pieces it was made of (conversion/reuse.py
    `Spliced`: the shared prefix's bytes are the earlier body's, never joined), after its
    headers, in one `writelines` on the connection: uvloop sends them with one `writev`,
    copying nothing (conversion/reuse.py says what that saved). aiohttp's
    own `writelines` joins them before Python 3.12.9 (for the CVE above, which only
    asyncio's transport had; on 3.11 that one joins them itself). Where the CVE is, they
    are joined here too."""

    _value: Spliced

    def __init__(self, body: Spliced) -> None:
        super().__init__(body)
        self._size = len(body)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._value).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: AbstractStreamWriter,
                                content_length: int | None) -> None:
        await writer.write(b"")  # the headers, alone (as _HeadersFirst)
        transport = writer.transport if isinstance(writer, StreamWriter) else None
        if transport is None or WRITELINES_UNSAFE:
            await writer.write(bytes(self._value))
            return
        if transport.is_closing():
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        transport.writelines(self._value.pieces)
        await writer.drain()


def _payload(body: bytes | Spliced) -> bytes | aiohttp.Payload | None:
    if isinstance(body, Spliced):
        return _Pieces(body)
    if len(body) >= LARGE_BODY:
        return _HeadersFirst(body)
    return body or None


class _Body(httpx.AsyncByteStream):
    """The answer's body, one piece per network read (the relay batches by read)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        with _httpx_errors():
            while data := await content.readany():
                yield data

    async def aclose(self) -> None:
        """Back to the pool when read to its end; closed (never reused) otherwise."""
        if self._response.content.is_eof():
            self._response.release()
        else:
            self._response.close()


_HEADER_STRINGS: dict[tuple[bytes, bytes], tuple[str, str]] = {}
"""Request headers as aiohttp takes them (text), one copy shared by every request."""
HEADER_STRINGS_KEPT = 256
"""The endpoints' headers are a few dozen; beyond this (content lengths) none is added."""


def _header_strings(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The headers as text, as httpx's `multi_items` gives them (names in lower case).
    aiohttp keeps a request's headers for as long as its answer is open: decoded anew, every
    open stream held its own copy of the same few strings. (ASCII ones are shared: the usual
    case.)"""
    if headers.encoding != "ascii":
        return headers.multi_items()
    made = []
    for pair in headers.raw:
        strings = _HEADER_STRINGS.get(pair)
        if strings is None:
            strings = (pair[0].lower().decode("ascii"), pair[1].decode("ascii"))
            if len(_HEADER_STRINGS) < HEADER_STRINGS_KEPT:
                _HEADER_STRINGS[pair] = strings
        made.append(strings)
    return made


def _proxy_headers(proxy: httpx.Proxy) -> dict[str, str]:
    """The proxy's own headers, and its `user:password@` as basic auth (as httpx sends it)."""
    headers = dict(proxy.headers)
    if proxy.auth:
        token = base64.b64encode(":".join(proxy.auth).encode()).decode()
        headers["Proxy-Authorization"] = f"Basic {token}"
    return headers


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session (created in the running loop at first use), through `proxy` if
    given. A second, connection-per-request session is only made for the rare resend."""

    def __init__(self, ssl_context: ssl.SSLContext, limits: httpx.Limits,
                 proxy: httpx.Proxy | None = None) -> None:
        self._ssl = ssl_context
        self._limits = limits
        self._proxy_url = str(proxy.url) if proxy else None
        self._proxy_headers = _proxy_headers(proxy) if proxy else None
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}
        self.resends = 0
        """Requests sent again after a reused connection turned out closed (for tests)."""

    def _new_session(self, *, force_close: bool = False) -> aiohttp.ClientSession:
        keep = {"force_close": True} if force_close else {
            "keepalive_timeout": self._limits.keepalive_expiry}
        connector = _Connector(ssl=self._ssl, limit=self._limits.max_connections or 0, **keep)
        return aiohttp.ClientSession(connector=connector, trust_env=False,
                                     auto_decompress=False,
                                     cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=aiohttp.ClientTimeout(total=None))

    @property
    def session(self) -> aiohttp.ClientSession | None:
        return self._session

    def connection_counts(self) -> dict[str, int]:
        """Open connections, busy and idle."""
        if self._session is None:
            return {"active": 0, "idle": 0}
        connector = self._session.connector
        assert isinstance(connector, _Connector)
        idle = sum(len(pool) for pool in connector._conns.values())
        return {"active": len(connector._acquired), "idle": idle}

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        given = request.extensions.get("timeout", {})
        key = (given.get("connect"), given.get("read"), given.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            # aiohttp's `connect` covers waiting for a pooled connection and connecting.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=key[0], sock_read=key[1],
                                            connect=key[2])
            self._timeouts[key] = timeout
        return timeout

    async def _send(self, session: aiohttp.ClientSession, request: httpx.Request,
                    body: bytes | Spliced) -> aiohttp.ClientResponse:
        headers = _header_strings(request.headers)
        if self._proxy_headers and request.url.scheme == "http":
            # Forwarded by the proxy, not tunnelled: its headers go with the request (aiohttp
            # sends `proxy_headers` only with a CONNECT).
            headers += self._proxy_headers.items()
        return await session.request(
            request.method, URL(str(request.url), encoded=True),
            headers=headers, data=_payload(body),
            allow_redirects=False, compress=False, timeout=self._timeout(request),
            proxy=self._proxy_url, proxy_headers=self._proxy_headers)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        stream = request.stream
        body = stream.take() if isinstance(stream, OneShotBody) else await request.aread()
        session = self._session
        if session is None:
            session = self._session = self._new_session()
        with _httpx_errors():
            _REUSED.set(False)
            try:
                response = await self._send(session, request, body)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if not _REUSED.get():
                    raise
                # The server had closed this pooled connection; it never saw the request.
                self.resends += 1
                if self._fresh is None:
                    self._fresh = self._new_session(force_close=True)
                response = await self._send(self._fresh, request, body)
        # As bytes: httpx keeps them as they are (decoded to text and encoded back, each
        # header was made twice more, and kept for as long as the answer is open).
        return httpx.Response(response.status, headers=response.raw_headers,
                              stream=_Body(response), request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


class _NoCookies(httpx.Cookies):
    """An upstream's cookies are not kept: one client serves every user of the proxy (and
    keeping them cost as much as building the request)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_SSL_CONTEXTS: dict[tuple[bool, bool, str | None, str | None], ssl.SSLContext] = {}


def shared_ssl_context(verify: ssl.SSLContext | str | bool = True, cert: Any = None,
                       trust_env: bool = True) -> ssl.SSLContext:
    """httpx's SSL context for these settings, made once per process: each one holds its
    own parsed copy of the CA bundle (0.6–0.8 MiB, not given back when dropped), and every
    provider's client, a proxy's, and the start-up's window discovery asked for the same."""
    if not isinstance(verify, bool) or cert is not None:
        return httpx.create_ssl_context(verify, cert, trust_env)
    environment = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    key = (verify, trust_env, *environment) if trust_env else (verify, False, None, None)
    context = _SSL_CONTEXTS.get(key)
    if context is None:
        context = _SSL_CONTEXTS[key] = httpx.create_ssl_context(verify, None, trust_env)
    return context


class UpstreamHttpClient(httpx.AsyncClient):
    """`httpx.AsyncClient` whose transports (direct, and one per environment proxy) are
    `AiohttpTransport`s; an explicit `transport` (the tests' mocks) is used as given."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cookies = _NoCookies()

    def _init_transport(self, verify: ssl.SSLContext | str | bool = True,
                        cert: Any = None, trust_env: bool = True, http1: bool = True,
                        http2: bool = False, limits: httpx.Limits | None = None,
                        transport: httpx.AsyncBaseTransport | None = None,
                        **kwargs: Any) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        return AiohttpTransport(shared_ssl_context(verify, cert, trust_env),
                               limits or httpx.Limits())

    def _init_proxy_transport(self, proxy: httpx.Proxy,
                              verify: ssl.SSLContext | str | bool = True, cert: Any = None,
                              trust_env: bool = True, http1: bool = True, http2: bool = False,
                              limits: httpx.Limits | None = None,
                              **kwargs: Any) -> httpx.AsyncBaseTransport:
        return AiohttpTransport(shared_ssl_context(verify, cert, trust_env),
                               limits or httpx.Limits(), proxy)
