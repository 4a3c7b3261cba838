"""The `/v1/messages` stream's response: pre-encoded SSE bytes, written as they come.

It sends what sse-starlette's `EventSourceResponse` sent on this path, byte for byte (the
same headers, the same `: ping - <UTC time>` comment every 15 s, the same end), at the cost of
a plain streaming response: sse-starlette runs a task group of four tasks per response and a
cancel scope per event (about twice the server CPU per event, and 16–18 KiB more per open
stream). Here the events are written from the request's own task; the server's protocol tells
the request's `Departure` when the client leaves, and a timer sends the pings (under another
ASGI server, one watcher task per response waits for the disconnect and sends them); when the
client leaves the writer is cancelled, and its relay then closes the upstream (see
`lifecycle.relay_events`).
sse-starlette stays where its features serve: the dashboard's live feed, which it ends when
uvicorn's shutdown begins. A `/v1/messages` stream (the server-tool flows' too) lives on past
that, and the drain ends it (server/drain.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from claude_proxy.server.relay import DEPARTURE, Departure, Watching

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
        departure = scope.get(DEPARTURE)
        watching: Watching | Pings = (
            Pings(departure.arm(writer), send, self.ping) if isinstance(departure, Departure)
            else Watching(asyncio.ensure_future(self._watch(receive, send)), writer))
        try:
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            watching.stop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watching.client_left():
                raise
            # The client left: the relay has closed the upstream; nothing more to send.
        finally:
            watching.stop()
            if self.finish is not None:
                await self.finish()

    async def _watch(self, receive: Receive, send: Send) -> None:
        """Returns when the client disconnects; sends a ping every `ping` seconds meanwhile."""
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
    """A stream's pings, every `ping` seconds by a timer, and the client's leaving told by
    its `Departure`: what the watcher task does, without a task per stream."""

    def __init__(self, departure: Departure, send: Send, ping: float) -> None:
        self.departure = departure
        self.send = send
        self.ping = ping
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(ping, self._due)
        self.sending: asyncio.Future[None] | None = None

    def _due(self) -> None:
        """One ping at a time, as the watcher sent them: none while the last one still
        waits for a slow client's socket."""
        if self.sending is None or self.sending.done():
            message: Message = {"type": "http.response.body", "body": ping_comment(),
                                "more_body": True}
            self.sending = asyncio.ensure_future(self.send(message))
        self.timer = self.loop.call_later(self.ping, self._due)

    def client_left(self) -> bool:
        return self.departure.client_left()

    def stop(self) -> None:
        """No ping after this (one due and not yet written is cancelled, as the watcher's)."""
        self.departure.stop()
        self.timer.cancel()
        if self.sending is not None:
            self.sending.cancel()
