"""The `/v1/messages` stream's response: pre-encoded SSE bytes, written as they come.

It sends what sse-starlette's `EventSourceResponse` sent on this path, byte for byte (the
same headers, the same `: ping - <UTC time>` comment every 15 s, the same end), at the cost of
a plain streaming response: sse-starlette runs a task group of four tasks per response and a
cancel scope per event (about twice the server CPU per event, and 16–18 KiB more per open
stream). Here the events are written from the request's own task; the server's protocol
tells of the client's disconnect (`client_gone`) and a timer sends the pings, so an open
stream holds no task of its own between them (a watcher task waiting in `receive()` does
both on servers without `client_gone`). When the client leaves the writer is cancelled, and
its relay then closes the upstream (see `lifecycle.relay_events`).
sse-starlette stays where its features serve: the dashboard's live feed, which it ends when
uvicorn's shutdown begins. A `/v1/messages` stream (the server-tool flows' too) lives on past
that, and the drain ends it (server/drain.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from claude_proxy.server.relay import Watching, client_gone

PING_SECONDS = 15.0
"""sse-starlette's default keep-alive interval, kept."""

HEADERS = [(b"cache-control", b"no-store"), (b"connection", b"keep-alive"),
           (b"x-accel-buffering", b"no"), (b"content-type", b"text/event-stream; charset=utf-8")]
"""What EventSourceResponse(sep="\\n") sends, in its order (tests compare the two)."""


def ping_comment() -> bytes:
    return f": ping - {datetime.now(UTC)}\n\n".encode()


class EventStream(Response):
    """An SSE response of ready-made byte frames; `finish` runs after it, as a background
    task would (also when the client left)."""

    def __init__(self, frames: AsyncIterator[bytes],
                 finish: Callable[[], Awaitable[None]] | None = None,
                 ping: float = PING_SECONDS) -> None:
        self.frames = frames
        self.finish = finish
        self.ping = ping
        self.status_code = 200
        self.raw_headers = list(HEADERS)
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.current_task()
        assert writer is not None
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        gone = client_gone(scope)
        pings = None if gone is None else Pings(send, self.ping)
        watching = Watching(gone or asyncio.ensure_future(self._watch(receive, send)), writer)
        try:
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            stop(watching, pings)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watching.client_left():
                raise
            # The client left: the relay has closed the upstream; nothing more to send.
        finally:
            stop(watching, pings)
            if self.finish is not None:
                await self.finish()

    async def _watch(self, receive: Receive, send: Send) -> None:
        """Returns when the client disconnects; sends a ping every `ping` seconds meanwhile
        (on servers without `client_gone`)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout_at(loop.time() + self.ping):
                    message = await receive()
            except TimeoutError:
                await send({"type": "http.response.body", "body": ping_comment(),
                            "more_body": True})
                continue
            if message["type"] == "http.disconnect":
                return


class Pings:
    """A ping `every` seconds from a timer: each is sent by a task of its own, and the next
    is timed from the end of its send, as the watcher task timed them (a client that reads
    slowly is not sent more)."""

    def __init__(self, send: Send, every: float) -> None:
        self.send = send
        self.every = every
        self.loop = asyncio.get_running_loop()
        self.sending: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(every, self._due)

    def _due(self) -> None:
        self.timer = None
        self.sending = asyncio.ensure_future(self.send(
            {"type": "http.response.body", "body": ping_comment(), "more_body": True}))
        self.sending.add_done_callback(self._sent)

    def _sent(self, sending: asyncio.Task[None]) -> None:
        if self.sending is sending and not sending.cancelled() and sending.exception() is None:
            self.sending = None
            self.timer = self.loop.call_later(self.every, self._due)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.sending is not None:
            self.sending.cancel()
            self.sending = None


def stop(watching: Watching, pings: Pings | None) -> None:
    watching.stop()
    if pings is not None:
        pings.stop()
