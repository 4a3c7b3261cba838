"""What users rely on in the upstream client, kept on aiohttp's transport (transport.py):
proxies from the environment, a custom CA, timeouts, the connection limit, cancellation, and
no session left open on shutdown or reload (what broke in other projects that made this move:
LiteLLM #15659, #11389, #30778, #24230).

Client disconnects mid-stream and before the first byte, idle and total timeouts are covered
end to end in test_resilience.py, which runs on this transport.
"""

from __future__ import annotations

import asyncio
import gc
import json
import ssl
import subprocess
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
import uvloop

from claude_proxy.config.settings import Settings
from claude_proxy.conversion.reuse import Spliced
from claude_proxy.errors import ProxyError
from claude_proxy.server.app import create_app
from claude_proxy.upstream.client import EXACT_BELOW, OpenAIClient, encoded
from claude_proxy.upstream.transport import (
    AiohttpTransport,
    OneShotBody,
    UpstreamHttpClient,
    httpx_error_for,
    shared_ssl_context,
)
from tests.scripted_upstream import bind_loopback

ANSWER = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "via"}}]}).encode()
OK = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
      % (len(ANSWER), ANSWER))


class RawServer:
    """A loopback server in its own thread that answers every request with `reply` (TLS when
    given a context), noting each request's head and how many connections were open at once."""

    def __init__(self, reply: bytes = OK, tls: ssl.SSLContext | None = None,
                 hold: bool = False) -> None:
        self.reply, self.tls, self.hold = reply, tls, hold
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.open = self.most_open = 0
        self.closed = threading.Event()
        self.sock = bind_loopback()
        self.port = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._serve, sock=self.sock, ssl=self.tls)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.bodies.append(await reader.readexactly(length))
                if self.hold:  # never answer: the client gives up (cancels) first
                    await reader.read()
                    return
                writer.write(self.reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            self.open -= 1
            writer.close()
            self.closed.set()

    def stop(self) -> None:
        async def stop() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.stop()


def client_for(base_url: str, **overrides: Any) -> OpenAIClient:
    return OpenAIClient(Settings(openai_api_key="k", openai_base_url=base_url, max_retries=0,
                                 **overrides))


async def ask(client: OpenAIClient) -> dict[str, Any]:
    try:
        return await client.complete({"model": "m", "messages": []})
    finally:
        await client.aclose()


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
                 "https_proxy", "all_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---------------------------------------------------------------- proxies


def test_http_proxy_from_the_environment_carries_the_request(
        raw: RawServer, no_proxy_env: pytest.MonkeyPatch) -> None:
    no_proxy_env.setenv("HTTP_PROXY", f"http://user:pw@127.0.0.1:{raw.port}")
    answer = asyncio.run(ask(client_for("http://upstream.invalid:8080/v1")))
    assert answer["choices"][0]["message"]["content"] == "via"
    assert raw.heads[0].startswith(
        b"POST http://upstream.invalid:8080/v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nauthorization: bearer k\r\n" in raw.heads[0].lower()
    assert b"\r\nproxy-authorization: basic dxnlcjpwdw==\r\n" in raw.heads[0].lower()


def test_no_proxy_sends_that_host_directly(raw: RawServer,
                                           no_proxy_env: pytest.MonkeyPatch) -> None:
    no_proxy_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{raw.port}")
    no_proxy_env.setenv("NO_PROXY", "upstream.invalid")
    with pytest.raises(ProxyError) as raised:
        asyncio.run(ask(client_for("http://upstream.invalid:8080/v1")))
    assert raised.value.message == "upstream connection failed (ConnectError)"
    assert raw.heads == []


def test_https_proxy_is_asked_for_a_tunnel(no_proxy_env: pytest.MonkeyPatch) -> None:
    refused = b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n"
    server = RawServer(reply=refused)
    try:
        no_proxy_env.setenv("HTTPS_PROXY", f"http://user:pw@127.0.0.1:{server.port}")
        with pytest.raises(ProxyError) as raised:
            asyncio.run(ask(client_for("https://upstream.invalid/v1")))
    finally:
        server.stop()
    assert server.heads[0].startswith(b"CONNECT upstream.invalid:443 HTTP/1.1\r\n")
    assert b"\r\nProxy-Authorization: Basic dXNlcjpwdw==\r\n" in server.heads[0]
    assert raised.value.message == "upstream connection failed (ProxyError)"


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made by the openssl CLI."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.mark.parametrize("trusted", [False, True])
def test_ssl_cert_file_names_the_ca_to_trust(certificate: tuple[Path, Path], trusted: bool,
                                             no_proxy_env: pytest.MonkeyPatch) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    server = RawServer(tls=context)
    if trusted:
        no_proxy_env.setenv("SSL_CERT_FILE", str(certificate[0]))
    try:
        client = client_for(f"https://127.0.0.1:{server.port}/v1")
        if trusted:
            assert asyncio.run(ask(client))["choices"][0]["message"]["content"] == "via"
        else:
            with pytest.raises(ProxyError) as raised:
                asyncio.run(ask(client))
            assert raised.value.message == "upstream connection failed (ConnectError)"
            assert isinstance(raised.value.__cause__.__cause__,  # type: ignore[union-attr]
                              aiohttp.ClientConnectorCertificateError)
    finally:
        server.stop()


@pytest.mark.parametrize("tls", [False, True])
@pytest.mark.parametrize("loop", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_a_spliced_body_arrives_as_the_bytes_it_joins_to(
        certificate: tuple[Path, Path], tls: bool, loop: Callable[[], asyncio.AbstractEventLoop],
        no_proxy_env: pytest.MonkeyPatch) -> None:
    """A session's next turn goes out in the pieces it was written in (conversion/reuse.py
    `Spliced`: bytes and views, one `writelines`): the server reads the very bytes they join
    to, in plain text and over TLS, on uvloop's transports and on asyncio's."""
    context = None
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*certificate)
        no_proxy_env.setenv("SSL_CERT_FILE", str(certificate[0]))
    whole = bytes(range(256)) * 4096
    view = memoryview(whole)
    spliced = Spliced([view[:10], whole[10:300_000], b"", view[300_000:900_001],
                       whole[900_001:]], len(whole))
    server = RawServer(tls=context)
    scheme = "https" if tls else "http"

    async def send() -> int:
        transport = AiohttpTransport(shared_ssl_context(), httpx.Limits())
        request = httpx.Request("POST", f"{scheme}://127.0.0.1:{server.port}/v1/x",
                                headers={"content-length": str(len(spliced))},
                                stream=OneShotBody(spliced))
        try:
            response = await transport.handle_async_request(request)
            await response.aread()
            return response.status_code
        finally:
            await transport.aclose()

    try:
        with asyncio.Runner(loop_factory=loop) as runner:
            assert runner.run(send()) == 200
    finally:
        server.stop()
    assert server.bodies == [whole]


# ---------------------------------------------------------------- timeouts and limits


def test_httpx_timeouts_become_aiohttps(raw: RawServer) -> None:
    transport = AiohttpTransport(ssl.create_default_context(), httpx.Limits())
    request = httpx.Request("POST", "http://x/", extensions={
        "timeout": httpx.Timeout(60.0, connect=3.0).as_dict()})
    timeout = transport._timeout(request)
    assert (timeout.sock_connect, timeout.sock_read, timeout.connect, timeout.total) == (
        3.0, 60.0, 60.0, None)
    assert transport._timeout(request) is timeout  # made once per distinct timeout


@pytest.mark.parametrize(("failure", "expected"), [
    (aiohttp.ConnectionTimeoutError("connect"), httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError("read"), httpx.ReadTimeout),
    (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError("cut"), httpx.RemoteProtocolError),
    (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
])
def test_aiohttp_failures_are_httpcores(failure: Exception, expected: type[Exception]) -> None:
    assert type(httpx_error_for(failure)) is expected


def test_read_timeout_ends_a_silent_upstream(no_proxy_env: pytest.MonkeyPatch) -> None:
    server = RawServer(hold=True)
    try:
        with pytest.raises(ProxyError) as raised:
            asyncio.run(ask(client_for(f"http://127.0.0.1:{server.port}/v1",
                                       request_timeout=0.2)))
        assert server.closed.wait(10)
    finally:
        server.stop()
    assert (raised.value.status, raised.value.message) == (
        504, "upstream timed out (ReadTimeout)")


def test_the_connection_limit_holds(raw: RawServer) -> None:
    async def many(limit: int | None) -> int:
        raw.most_open = 0
        client = UpstreamHttpClient(limits=httpx.Limits(max_connections=limit))
        url = f"http://127.0.0.1:{raw.port}/"
        await asyncio.gather(*(client.post(url, content=b"{}") for _ in range(10)))
        await client.aclose()
        return raw.most_open

    assert asyncio.run(many(2)) == 2
    assert asyncio.run(many(None)) == 10  # the check above can fail


def test_a_cancelled_request_closes_its_connection(no_proxy_env: pytest.MonkeyPatch) -> None:
    server = RawServer(hold=True)

    async def cancel() -> dict[str, int]:
        client = client_for(f"http://127.0.0.1:{server.port}/v1")
        task = asyncio.ensure_future(client.complete({"model": "m", "messages": []}))
        while not server.heads:
            await asyncio.sleep(0)  # a turn of the loop, until the server has the request
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        counts = client.connection_counts()
        await client.aclose()
        return counts

    try:
        assert asyncio.run(cancel()) == {"active": 0, "idle": 0}
        assert server.closed.wait(10), "the upstream connection stayed open"
    finally:
        server.stop()


# ---------------------------------------------------------------- sessions


def open_sessions() -> list[aiohttp.ClientSession]:
    gc.collect()
    return [o for o in gc.get_objects()
            if isinstance(o, aiohttp.ClientSession) and not o.closed]


def test_no_session_outlives_shutdown_or_reload(raw: RawServer,
                                                no_proxy_env: pytest.MonkeyPatch) -> None:
    """Three start/stop cycles of the app (what a reload does), each with a request sent."""
    settings = Settings(openai_api_key="k", openai_base_url=f"http://127.0.0.1:{raw.port}/v1")
    before = len(open_sessions())

    async def cycle() -> AiohttpTransport:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            client = app.state.wiring.service.client
            await client.complete({"model": "m", "messages": []})
            transport = client._client._transport
            assert isinstance(transport, AiohttpTransport) and transport.session is not None
            assert len(open_sessions()) == before + 1
        return transport

    for _ in range(3):
        transport = asyncio.run(cycle())
        assert transport.session is None
        assert len(open_sessions()) == before


def test_a_request_after_shutdown_opens_no_session(raw: RawServer,
                                                  no_proxy_env: pytest.MonkeyPatch) -> None:
    """The client sends to its transport itself (not through `client.send`, which refused a
    closed client): a request that arrives after shutdown is a 502 and no new session."""
    client = client_for(f"http://127.0.0.1:{raw.port}/v1")
    before = len(open_sessions())

    async def late() -> ProxyError:
        await ask(client)  # one request, then the client is closed
        with pytest.raises(ProxyError) as caught:
            await client.complete({"model": "m", "messages": []})
        return caught.value

    error = asyncio.run(late())
    assert (error.status, error.message) == (502, "upstream connection failed (ConnectError)")
    assert len(open_sessions()) == before


def test_the_request_body_is_not_kept_while_the_answer_is_open(
        raw: RawServer, no_proxy_env: pytest.MonkeyPatch) -> None:
    """A stream lasts minutes and a Claude Code request is 100 KB or more: the transport
    takes the body once sent, and the upstream got it whole, with the headers httpx sent."""
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]}

    async def send() -> tuple[httpx.Request, bytes]:
        client = client_for(f"http://127.0.0.1:{raw.port}/v1")
        response = await client._send(client.url, big, {}, accept="application/json")
        await response.aclose()
        await client.aclose()
        return response.request, raw.heads[0]

    request, head = asyncio.run(send())
    assert isinstance(request.stream, OneShotBody) and request.stream.taken
    assert request.stream.take() == b""
    length = len(json.dumps(big, separators=(",", ":")))
    assert head.decode().split("\r\n")[1:-2] == [
        f"host: 127.0.0.1:{raw.port}", "accept-encoding: gzip, deflate", "connection: keep-alive",
        f"user-agent: python-httpx/{httpx.__version__}", "content-type: application/json",
        "authorization: Bearer k", "accept: application/json", f"content-length: {length}"]


@pytest.mark.parametrize("length", [100, 3_000, 20_000, EXACT_BELOW - 100])
def test_a_short_request_body_holds_no_more_memory_than_its_length(length: int) -> None:
    """The record keeps the body for the inspector while a stream is open and in its ring
    after; orjson 3.12 and later hand back their working buffer (4 KiB for 100 bytes, 256
    KiB for 20 KB), so a short body is copied to its own size, its JSON unchanged."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * length}]}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = encoded(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept == orjson.dumps(body) and type(kept) is bytes
    assert held <= len(kept) + 64  # the bytes object's header and its allocator's rounding


def test_an_injected_transport_is_used_as_given() -> None:
    """`create_app(transport=...)` and the tests' mocks: the client sends through it, and the
    body it reads is the request's whole body."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=ANSWER)

    settings = Settings(openai_api_key="k", openai_base_url="http://upstream.test/v1")
    client = OpenAIClient(settings, transport=httpx.MockTransport(answer))
    assert asyncio.run(ask(client))["choices"][0]["message"]["content"] == "via"
    assert json.loads(seen[0].content) == {"model": "m", "messages": []}
    assert seen[0].url == "http://upstream.test/v1/chat/completions"


def test_a_burst_in_one_read_hands_on_its_first_two_chunks_one_by_one() -> None:
    """An upstream that sends its whole answer in one write: the opening and the first text
    are handed on (and sent to the client) before the rest of the read is parsed."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": f"w{n}"}}]} for n in range(5)]
    burst = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=httpx.ByteStream(burst + b"data: [DONE]\n\n"))

    async def batches() -> list[list[dict[str, Any]]]:
        settings = Settings(openai_api_key="k", openai_base_url="http://upstream.test/v1")
        client = OpenAIClient(settings, transport=httpx.MockTransport(answer))
        stream = await client.open_stream({"model": "m", "messages": [], "stream": True})
        read = [list(batch) async for batch in stream]
        assert stream.complete
        await stream.aclose()
        await client.aclose()
        return read

    assert asyncio.run(batches()) == [chunks[:1], chunks[1:2], chunks[2:]]
