"""The `/v1/messages` stream's own response (event_stream.py) against sse-starlette's
`EventSourceResponse`, which it replaced on that path: the same bytes on the wire (headers,
chunked framing, body, pings), and a client that leaves still ends the relay and the clean-up.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from claude_proxy.cli.command_line import http_protocol
from claude_proxy.server.event_stream import EventStream
from claude_proxy.sse import encode_events
from tests.scripted_upstream import bind_loopback, serve_in_thread, stop_server

FRAMES = [
    encode_events([{"type": "message_start", "message": {"id": "msg_1", "content": []}},
                   {"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}]),
    encode_events([{"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "h\u00e9llo \u2603"}}]),
    encode_events([{"type": "content_block_stop", "index": 0},
                   {"type": "message_stop"}]),
]
PING = re.compile(rb": ping - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\+00:00\n\n")


class Harness:
    """Both responses behind one uvicorn server, with hooks the tests wait on."""

    def __init__(self, http: Any = "auto") -> None:
        self.finished: list[str] = []
        self.closed = threading.Event()
        self.done = threading.Event()
        self.resume: dict[str, asyncio.Event] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sock = bind_loopback()
        routes = [Route("/{kind}/{mode}", self.endpoint, methods=["POST"])]
        self.server, self.thread = serve_in_thread(Starlette(routes=routes), self.sock,
                                                   http=http)

    async def frames(self, mode: str, kind: str) -> AsyncIterator[bytes]:
        try:
            for number, frame in enumerate(FRAMES):
                if number == 1 and mode != "plain":
                    # Wait for the test (after a ping, or forever for a client that leaves).
                    self.loop = asyncio.get_running_loop()
                    self.resume[kind] = event = asyncio.Event()
                    await event.wait()
                yield frame
        finally:
            self.closed.set()

    async def endpoint(self, request: Request) -> Response:
        kind, mode = request.path_params["kind"], request.path_params["mode"]
        await request.body()
        ping = 0.05 if mode == "ping" else None

        async def finish() -> None:
            self.finished.append(kind)
            self.done.set()

        if kind == "old":
            return EventSourceResponse(self.frames(mode, kind), sep="\n", ping=ping,
                                       background=BackgroundTask(finish))
        return EventStream(self.frames(mode, kind), finish, **({"ping": ping} if ping else {}))

    def request(self, path: str) -> socket.socket:
        sock = socket.create_connection(self.sock.getsockname())
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\ncontent-length: 2\r\n\r\n{{}}"
                     .encode())
        return sock

    def stop(self) -> None:
        stop_server(self.server, self.thread)


@pytest.fixture(params=["uvicorn's protocol", "the proxy's protocol"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Under uvicorn's own protocol a watcher task sees the client leave and sends the
    pings; under the proxy's (cli.http_protocol) the request's Departure and a timer do."""
    server = Harness(http_protocol() if request.param == "the proxy's protocol" else "auto")
    yield server
    server.stop()


def read_all(sock: socket.socket) -> bytes:
    received = b""
    while not received.endswith(b"0\r\n\r\n"):
        data = sock.recv(65536)
        assert data, received
        received += data
    sock.close()
    return received


def without_date(raw: bytes) -> bytes:
    return re.sub(rb"date: [^\r]*\r\n", b"", raw)


def test_the_same_bytes_as_event_source_response(harness: Harness) -> None:
    old = read_all(harness.request("/old/plain"))
    assert harness.done.wait(10)
    harness.done.clear()
    new = read_all(harness.request("/new/plain"))
    assert harness.done.wait(10)
    assert without_date(new) == without_date(old)
    head, body = new.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n")[1:] == [
        *[line for line in head.split(b"\r\n") if line.startswith(b"date")], b"server: uvicorn",
        b"cache-control: no-store", b"connection: keep-alive", b"x-accel-buffering: no",
        b"content-type: text/event-stream; charset=utf-8", b"transfer-encoding: chunked"]
    assert body == b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in FRAMES) + b"0\r\n\r\n"
    assert harness.finished == ["old", "new"]


def read_until_ping(sock: socket.socket) -> bytes:
    received = b""
    while not PING.search(received):
        data = sock.recv(65536)
        assert data, received
        received += data
    return received


@pytest.mark.parametrize("kind", ["old", "new"])
def test_pings_while_the_upstream_is_silent(harness: Harness, kind: str) -> None:
    sock = harness.request(f"/{kind}/ping")
    received = read_until_ping(sock)
    assert harness.loop is not None
    harness.loop.call_soon_threadsafe(harness.resume[kind].set)
    received += read_all(sock)
    body = received.split(b"\r\n\r\n", 1)[1]
    pieces = re.findall(rb"[0-9a-f]+\r\n(.*?)\r\n", body, re.S)
    frames = [piece for piece in pieces if piece and not PING.fullmatch(piece)]
    assert frames == FRAMES  # pings are separate chunks between whole frames
    assert any(PING.fullmatch(piece) for piece in pieces)
    assert harness.done.wait(10)
    assert harness.finished == [kind]


def test_a_client_that_leaves_ends_the_relay_and_the_clean_up(harness: Harness) -> None:
    for _ in range(20):
        harness.closed.clear()
        harness.done.clear()
        sock = harness.request("/new/leave")
        received = b""
        while FRAMES[0] not in received:
            received += sock.recv(65536)
        sock.close()
        assert harness.closed.wait(10), "the relay was not closed when the client left"
        assert harness.done.wait(10), "the clean-up did not run"
    assert harness.finished == ["new"] * 20
    assert harness.server.started and not harness.server.should_exit


def tasks_of(harness: Harness) -> int:
    assert harness.server.servers and harness.loop is not None

    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), harness.loop).result(10)


def test_an_open_stream_holds_no_task_of_its_own() -> None:
    """On the proxy's protocol an open stream is its request's task alone: no watcher task
    waiting in `receive()` for the disconnect (1.6 KiB of each idle stream's memory)."""
    harness = Harness(http_protocol())
    try:
        first = harness.request("/new/leave")
        while FRAMES[0] not in first.recv(65536):
            pass
        one = tasks_of(harness)
        second = harness.request("/new/leave")
        while FRAMES[0] not in second.recv(65536):
            pass
        assert tasks_of(harness) == one + 1  # the second request's own task
        first.close()
        second.close()
        assert harness.closed.wait(10)
    finally:
        harness.stop()


def test_headers_match_event_source_response() -> None:
    async def nothing() -> AsyncIterator[bytes]:
        yield b""

    reference: Any = EventSourceResponse(nothing(), sep="\n")
    assert EventStream(nothing()).raw_headers == reference.raw_headers


@pytest.mark.parametrize("count", [1, 16, 17, 2_000])
def test_a_long_batch_is_the_bytes_of_its_events_and_holds_no_buffer_per_event(
        count: int) -> None:
    """An upstream read of a fast stream can hold thousands of chunks, encoded as one batch.
    orjson hands back each event's JSON in a buffer of 4 KiB: held until one join, the
    2,000 events below raised the peak by 8 MiB (the server's peak RSS after a 20,000-chunk
    stream by 11 MiB); joined in parts, the batch costs about twice its own bytes."""
    events = [{"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": f"t{n} \u2603"}} for n in range(count)]
    tracemalloc.start()
    try:
        frame = encode_events(events)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert frame == b"".join(b"event: content_block_delta\ndata: " + json.dumps(
        event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n" for event in events)
    assert peak <= 2 * len(frame) + 80_000
