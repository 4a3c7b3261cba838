"""The proxy's uvicorn protocol (wire.py): a response's head leaves with its first body bytes
when they follow at once, and on its own at the end of the loop iteration when they do not.
A real uvicorn server on loopback, read with a raw socket so each `recv` shows what arrived."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from starlette.types import Receive, Scope, Send

from claude_proxy.cli.command_line import http_protocol
from claude_proxy.server.http_protocol import HeadHoldingTransport
from claude_proxy.server.relay import DEPARTURE, Departure
from tests.scripted_upstream import bind_loopback, serve_in_thread, stop_server

released = threading.Event()
"""Set by a test once it has read the late stream's head: only then does its body come."""


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/echo":
        await echo(receive, send)
        return
    if scope["path"] == "/departure":
        await wait_for_departure(scope)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")]})
    if scope["path"] == "/late":
        while not released.is_set():
            await asyncio.sleep(0.01)
    await send({"type": "http.response.body", "body": b"hello"})


async def echo(receive: Receive, send: Send) -> None:
    """The body's digest, its length and how many pieces it came in, read slowly (so that
    pieces also arrive while the one before is still waiting to be taken)."""
    digest, size, pieces, more = hashlib.sha256(), 0, 0, True
    while more:
        message = await receive()
        body = message.get("body", b"")
        assert type(body) is bytes
        digest.update(body)
        size, pieces, more = size + len(body), pieces + 1, message.get("more_body", False)
        await asyncio.sleep(0.002)
    answer = f"{digest.hexdigest()} {size} {pieces}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


armed, departed = threading.Event(), threading.Event()
"""Set by /departure's handler once it waits armed, and once the client's leaving cancelled
it through its Departure."""


async def wait_for_departure(scope: Scope) -> None:
    """Waits, armed, until the client leaves: the protocol, not a watcher task, cancels it."""
    departure = scope.get(DEPARTURE)
    assert isinstance(departure, Departure)
    task = asyncio.current_task()
    assert task is not None
    departure.arm(task)
    armed.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        if departure.client_left():
            departed.set()
            return
        raise


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = bind_loopback()
    server, thread = serve_in_thread(app, sock, own_headers_only=True, http=http_protocol())
    yield sock.getsockname()[1]
    released.set()
    stop_server(server, thread)


def request(port: int, path: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    return client


def read_until(client: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        piece = client.recv(65536)
        assert piece, f"connection closed after {data!r}"
        data += piece
    return data


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n"


def test_the_protocol_is_the_head_holding_one() -> None:
    assert http_protocol().__name__ == "HeadHoldingHttpToolsProtocol"


def test_a_client_leaving_before_the_answer_cancels_its_handler_through_the_protocol(
        port: int) -> None:
    """The request's Departure (in its scope) is told by the protocol's connection_lost:
    the handler is cancelled, and knows it was the client, with no task watching."""
    armed.clear()
    departed.clear()
    client = request(port, "/departure")
    assert armed.wait(10)
    client.close()
    assert departed.wait(10)


def test_a_client_gone_before_the_handler_is_armed_cancels_it_when_it_is() -> None:
    """A client that leaves between two armings (the answer's wait and the stream's) is not
    missed: the next arming cancels its handler at once, as a watcher task found
    `http.disconnect` waiting in `receive()`."""
    async def run() -> tuple[bool, bool]:
        departure = Departure()
        departure.left()  # the connection is lost while nothing is armed
        task = asyncio.current_task()
        assert task is not None
        departure.arm(task)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return True, departure.client_left()
        return False, False

    assert asyncio.run(run()) == (True, True)


class RecordingTransport:
    """What the socket would be asked to send, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


TICK, CLOSE = "end of the loop iteration", "close"


def written_after_each(*steps: bytes | str) -> tuple[list[list[bytes]], bool]:
    """Runs `steps` (a write's bytes, TICK or CLOSE) on a HeadHoldingTransport over a
    recording one: what the socket had been asked to send after each step, and whether the
    real transport was closed."""
    real = RecordingTransport()

    async def run() -> list[list[bytes]]:
        transport = HeadHoldingTransport(real, asyncio.get_running_loop())
        seen = []
        for step in steps:
            if step == TICK:
                await asyncio.sleep(0)
            elif step == CLOSE:
                transport.close()
            else:
                assert isinstance(step, bytes)
                transport.write(step)
            seen.append(list(real.writes))
        return seen

    return asyncio.run(run()), real.closed


def test_head_and_first_body_go_out_as_one_write() -> None:
    seen, _ = written_after_each(HEAD, b"hello", b" more", TICK)
    # The release at the end of the iteration finds nothing held.
    assert seen == [[], [HEAD + b"hello"], [HEAD + b"hello", b" more"],
                    [HEAD + b"hello", b" more"]]


def test_a_head_alone_leaves_at_the_end_of_the_iteration_or_on_close() -> None:
    seen, closed = written_after_each(HEAD, TICK, HEAD, CLOSE)
    assert seen == [[], [HEAD], [HEAD], [HEAD, HEAD]] and closed


def test_a_head_whose_body_comes_later_is_not_held_back(port: int) -> None:
    with request(port, "/late") as client:
        assert read_until(client, b"\r\n\r\n") == HEAD  # before the body exists
        released.set()
        assert read_until(client, b"hello") == b"hello"


def test_keep_alive_answers_stay_in_order(port: int) -> None:
    with request(port, "/now") as client:
        assert read_until(client, b"hello") == HEAD + b"hello"
        client.sendall(b"GET /now HTTP/1.1\r\nhost: x\r\n\r\n")
        assert read_until(client, b"hello") == HEAD + b"hello"


def test_a_body_sent_in_many_pieces_reaches_the_application_whole(port: int) -> None:
    """Pieces are handed on as httptools made them, and joined as uvicorn joins them when
    several came before the application took the one before: whatever the timing, the
    application reads the very bytes sent, in order."""
    body = os.urandom(3 * 1024 * 1024 + 17)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: "
                       + str(len(body)).encode() + b"\r\n\r\n")
        cuts = [*range(0, 2_100_000, 700_000), *range(2_100_000, len(body), 8192)]
        for start, end in zip(cuts, [*cuts[1:], len(body)], strict=True):
            client.sendall(body[start:end])
            if end - start < 65536:
                time.sleep(0.0005)  # small pieces: several come while the app sleeps
        data = b""
        while b"\r\n\r\n" not in data:
            data += client.recv(65536)
        head, answer = data.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(answer) < length:
            answer += client.recv(65536)
    digest, size, pieces = answer.decode().split()
    assert (digest, int(size)) == (hashlib.sha256(body).hexdigest(), len(body))
    assert int(pieces) > 1
