"""The server's side of the wire: uvicorn's httptools protocol, its response head sent with
the first body bytes, and a request body whose HTTP framing breaks answered by the
application.

uvicorn writes a response's status line and headers in one `transport.write` and its body in
another, each a `send` system call at once; on loopback a send does the receiver's TCP work
too, and the client wakes for a head it cannot use without the body. Here the head waits for
the next write when that follows in the same step (a JSON answer's body, a stream's first
events: they leave together), and otherwise leaves at the end of the loop iteration (a
stream whose first event comes later still gets its headers at once). Same bytes, same order.

The application learns that a client left from the protocol's `connection_lost` (`client_gone`)
rather than from a task waiting in `receive()` for the whole response: such a watcher cost
each open stream a task, four coroutine frames, a timeout, a timer and a future (and each
request waiting for its upstream the same again), 1.6 KiB of the ~50 KiB an idle stream
holds (tracemalloc, 500 streams), and 12–15 µs of CPU to start and cancel, where a future
costs 0.1 KiB.
"""

from __future__ import annotations

import asyncio
from typing import Any

# uvicorn's protocol class is not its public API: pyproject.toml bounds uvicorn below the next
# minor release for that reason (re-check the write path on each one).
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from claude_proxy.errors import ProxyError
from claude_proxy.server.relay import RECEIVE_KEY

_HEAD = b"HTTP/1.1 "


class HeadHoldingTransport:
    """A transport that holds a response head until the next write or the end of the
    current loop iteration, whichever comes first; everything else is the real one's."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif data.startswith(_HEAD):
            self._head = data
            self._loop.call_soon(self._release)
            return
        self._transport.write(data)

    def _release(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class FramedReceive:
    """A request's `receive` that raises the client's 400 once its body's framing has broken
    (a chunk size that is no number, a chunk that does not end where it said): the
    application answers it, with its own error body and access line, instead of waiting for
    a body that will not come."""

    __slots__ = ("broken", "leaving", "receive")

    def __init__(self, receive: Any) -> None:
        self.receive = receive
        self.broken = False
        self.leaving: asyncio.Future[None] | None = None

    def gone(self) -> asyncio.Future[None]:
        """A new future, done at the client's disconnect (`client_gone`). Reading resumes, as
        it does when `receive()` waits, so that a closed connection is seen."""
        cycle = self.receive.__self__
        self.leaving = asyncio.get_running_loop().create_future()
        if cycle.disconnected:
            self.leaving.set_result(None)
        else:
            cycle.flow.resume_reading()
        return self.leaving

    def disconnected(self) -> None:
        if self.leaving is not None and not self.leaving.done():
            self.leaving.set_result(None)

    async def __call__(self) -> Any:
        if not self.broken:
            message = await self.receive()
            if not self.broken:
                return message
        raise ProxyError(400, "request body is not valid HTTP/1.1 framing",
                         headers={"connection": "close"})


class HeadHoldingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a HeadHoldingTransport (`uvicorn.Config(http=...)`),
    each piece of a request body handed on as httptools made it and read through
    `FramedReceive`."""

    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport
        super().connection_made(HeadHoldingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        """The new request's `receive` through `FramedReceive` (its task, just made, has not
        run yet: it reads `receive` when it does)."""
        super().on_headers_complete()
        cycle: Any = self.cycle  # its `receive` is a method: replaced on the instance
        if cycle is not None and not isinstance(cycle.receive, FramedReceive):
            cycle.receive = FramedReceive(cycle.receive)
            cycle.scope[RECEIVE_KEY] = cycle.receive

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, then the waiting `client_gone` future told (uvicorn marks the cycle
        disconnected only while its response is incomplete; so does this)."""
        cycle: Any = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected and isinstance(cycle.receive, FramedReceive):
            cycle.receive.disconnected()

    def on_body(self, body: bytes) -> None:
        """uvicorn adds each piece to a bytearray and hands on `bytes()` of it: two copies of
        every byte received (of an 800 KB conversation, 1.6 MB of copying and the page faults
        of fresh memory, on every request). A piece that comes when none is waiting for the
        application is kept as it is, and `bytes()` of it is itself; pieces that come before
        the application took the one before are joined as uvicorn joins them."""
        cycle = self.cycle
        if cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)
            return
        cycle.body = body  # type: ignore[assignment]  # uvicorn's is a bytearray, or bytes
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes httptools cannot parse: a plain-text 400 written past the
        application. While the application is still reading the request's body, it is the
        one to answer (`FramedReceive`); the connection closes after that answer, and what
        else arrives on it is not read."""
        cycle = self.cycle
        if cycle is None or cycle.response_started or not cycle.more_body \
                or not isinstance(cycle.receive, FramedReceive):
            super().send_400_response(msg)
            return
        if not cycle.receive.broken:
            cycle.receive.broken = True
            cycle.keep_alive = False
            self.flow.pause_reading()
            cycle.message_event.set()
