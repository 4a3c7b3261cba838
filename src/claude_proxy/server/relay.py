"""The lifetime of one response: its deadline, the client going away, and the SSE relay.

Before the first byte, upstream work runs as a task raced against the client's disconnect
and the TOTAL_TIMEOUT deadline, so a client that leaves cancels the upstream request at once.
After it, the relay turns chunks into events until the end, a failure (every open block closed,
then one `event: error`), or the deadline. Both are ended by the drain at DRAIN_TIMEOUT
(server/drain.py) the way clients retry: 529, or an `overloaded_error` event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request

from claude_proxy.conversion.response_converter import StreamConverter
from claude_proxy.errors import ProxyError
from claude_proxy.metrics import Metrics
from claude_proxy.record import current_record, record_usage
from claude_proxy.server.drain import Drain, Drained
from claude_proxy.sse import encode_events
from claude_proxy.upstream.client import Batches, Chunk
from claude_proxy.upstream.overflow import context_overflow, recognised

logger = logging.getLogger("claude_proxy.lifecycle")
sse_logger = logging.getLogger("claude_proxy.sse")

T = TypeVar("T")


DRAIN_GRACE = 1.0
"""Seconds a finished stream may take to read the end of the upstream body."""


class ClientDisconnected(Exception):
    """The client closed the connection before the response started."""


def deadline_error() -> ProxyError:
    return ProxyError(504, "the upstream did not finish within TOTAL_TIMEOUT",
                      error_type="timeout_error")


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def before_first_byte(request: Request, work: Awaitable[T], deadline: float,
                            drain: Drain) -> T:
    """`work`'s result, unless the client leaves first (ClientDisconnected), the deadline
    passes (504) or the drain ends (529 `Drained`); either way the work is cancelled and has
    finished cleaning up on return.

    The work runs in the request's own task; the server's protocol (`Departure`), or else a
    watcher task, cancels that task if the client disconnects. (Running the work as a second
    task raced against the watcher cost two task spawns, an `asyncio.wait` and a `gather` per
    request: about 25 µs and several turns of the event loop.)
    """
    handler = asyncio.current_task()
    assert handler is not None
    departure = request.scope.get(DEPARTURE)
    watching: Watching | Departure = (
        departure.arm(handler) if isinstance(departure, Departure)
        else Watching(asyncio.ensure_future(_disconnected(request)), handler))
    timeout = asyncio.timeout_at(deadline)
    drain.waiting(timeout)
    try:
        async with timeout:
            return await work
    except asyncio.CancelledError:
        if watching.client_left():
            raise ClientDisconnected from None
        raise
    except TimeoutError:
        if timeout.expired():
            raise (Drained() if drain.ended else deadline_error()) from None
        raise
    finally:
        drain.answered(timeout)
        watching.stop()


class Watching:
    """Cancels the task handling a request when its watcher returns, i.e. when the client
    disconnected (before the first byte, and while a stream is written)."""

    def __init__(self, watcher: asyncio.Future[None], handler: asyncio.Task[Any]) -> None:
        self.watcher = watcher
        self.handler = handler
        self.left = False
        watcher.add_done_callback(self._ended)

    def _ended(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.left = True
            self.handler.cancel()

    def client_left(self) -> bool:
        """For a CancelledError in the handler: whether the client's leaving caused it, and
        nothing else (the handler's own cancellation is then taken back)."""
        return self.left and self.handler.uncancel() == 0

    def stop(self) -> None:
        self.watcher.remove_done_callback(self._ended)
        self.watcher.cancel()


DEPARTURE = "claude_proxy.departure"
"""The scope entry where the server's protocol (server/http_protocol.py) puts a request's
`Departure`; absent under another ASGI server (then a watcher task does its work)."""


class Departure:
    """Told by the server's protocol when the client disconnects before the response is
    complete; armed, it cancels the task handling the request, as `Watching` does, without
    a watcher task: a task spawned, an event waited on and a cancellation delivered, per
    request, on the request's path."""

    __slots__ = ("armed", "cancelled", "gone")

    def __init__(self) -> None:
        self.armed: asyncio.Task[Any] | None = None
        self.cancelled: asyncio.Task[Any] | None = None
        self.gone = False

    def arm(self, handler: asyncio.Task[Any]) -> Departure:
        """Cancels `handler` when the client leaves — at once (at its next await) if it left
        while nothing was armed, between `before_first_byte` and the stream, as a watcher
        then found `http.disconnect` waiting in `receive()`."""
        self.armed, self.cancelled = handler, None
        if self.gone:
            self.left()
        return self

    def left(self) -> None:
        """The connection is lost with the response incomplete."""
        self.gone = True
        handler, self.armed = self.armed, None
        if handler is not None:
            self.cancelled = handler
            handler.cancel()

    def client_left(self) -> bool:
        """As `Watching.client_left`."""
        return self.cancelled is not None and self.cancelled.uncancel() == 0

    def stop(self) -> None:
        self.armed = None


def after_first_byte(error: ProxyError, converter: StreamConverter) -> ProxyError:
    """After the first byte there is no status: an upstream's context overflow goes in
    Anthropic's words (`prompt is too long: N tokens > M maximum`, an `invalid_request_error`;
    OpenAI's `context_length_exceeded` chunk would otherwise look transient and be retried
    unchanged); server-side failures become `overloaded_error`, the type Claude Code retries."""
    overflow = context_overflow(recognised(error, error.payload), converter.input_tokens,
                                converter.window)
    if overflow is not None:
        return overflow
    if error.status >= 500 or error.error_type == "timeout_error":
        return ProxyError(error.status, error.message, error_type="overloaded_error")
    return error


async def relay_events(converter: StreamConverter, stream: Batches,
                       deadline: float, metrics: Metrics, drain: Drain) -> AsyncIterator[bytes]:
    """Upstream chunks through the converter to SSE bytes, ending in message_stop or in one
    `event: error`. A cancelled relay (the client left) closes the upstream response.

    The relay reads the upstream itself, one batch per network read: a read returns all that
    has arrived since the last one, so what came in while the client was being written to
    goes out in one write. (A reader task per stream, filling a buffer the relay emptied, cost
    a task, an event and their frames: ~3 KiB per open stream, and two task switches per
    read instead of one.)

    The deadline is checked whenever the upstream sends anything; a silent upstream is ended
    by the idle-read timeout (REQUEST_TIMEOUT) instead, so no timer runs per chunk. The drain's
    end is a flag checked before each read, and a cancellation of a read under way.
    """
    loop = asyncio.get_running_loop()
    sent = current_record().events  # for the dashboard: one append per write, nothing more
    metrics.active_streams.inc()
    # message_start goes out with the events of the first chunk, which is already read (the
    # stream was opened up to it), so the client gets its first text one write sooner.
    events = converter.start()
    reading = drain.stream()
    try:
        # After [DONE] only the body's end is left: it is read in the clean-up, after the last
        # events are out. After a stop sequence nothing more is wanted: the upstream is
        # cancelled (finally, below).
        while not (stream.said_done or converter.stopped):
            if reading.due:
                raise Drained()
            batch = await reading.next_of(stream)
            if batch is None:
                break
            if loop.time() > deadline:
                raise deadline_error()
            more, failure = _convert(converter, batch)
            # The reader's frame keeps `batch` until the next network read (seconds, in a
            # slow stream): emptied, it no longer holds the chunks (~7 KiB per stream).
            batch.clear()
            events += more
            if events:
                yield _frame(events, sent)
                events = []
            if failure is not None:
                raise failure
        if not stream.complete and not converter.saw_finish_reason:
            raise ProxyError(502, "upstream stream ended before the response was complete",
                             error_type="overloaded_error")
        if converter.judge is not None:
            # The tool calls are complete and go out; the end waits for the judge's verdicts.
            yield _frame(events + converter.close(), sent)
            events = []
        yield _frame(events + await converter.settle() + converter.finish(), sent)
    except Drained as error:
        yield _frame(events + converter.fail(error), sent)
    except ProxyError as error:
        logger.warning("upstream stream failed after the first byte: %s", error.message)
        error = after_first_byte(error, converter)
        metrics.count_upstream_error(error.error_type)
        yield _frame(events + converter.fail(error), sent)
    finally:
        drain.closed(reading)
        metrics.active_streams.dec()
        record_usage(converter.usage(), converter.reasoning_tokens())
        # The relay may be finishing because it was cancelled (the client left). That is
        # asyncio's own cancellation, delivered once, so the clean-up's awaits still run and
        # the upstream is closed; no anyio cancel scope (which cancels every await until it
        # exits) encloses a relay: EventStream runs it in the request's task. An anyio
        # shield here loaded anyio's asyncio backend into every server (0.9 MiB resident)
        # and stood against neither a second `Task.cancel()` nor anything else.
        if stream.said_done:
            await _drain(stream)
        await stream.aclose()


async def drained(frames: AsyncGenerator[bytes, None], drain: Drain) -> AsyncIterator[bytes]:
    """A server-tool flow's stream (web search, tool search) as the drain ends it: at
    DRAIN_TIMEOUT an `overloaded_error` event follows what was sent. Its frames are whole
    blocks (server_tools.py), so no block is open between two of them."""
    reading = drain.stream()
    try:
        while not reading.due:
            frame = await reading.next_of(frames)
            if frame is None:
                return
            yield frame
        raise Drained()
    except Drained as error:
        yield _frame([error.body()], current_record().events)
    finally:
        drain.closed(reading)
        await frames.aclose()


async def _drain(stream: Batches) -> None:
    """Read the body's end after [DONE] (normally already read or on its way): a response
    closed before it takes its connection with it, and the next request pays for a new one.
    Given up after DRAIN_GRACE; a failure there loses only the connection."""
    try:
        async with asyncio.timeout(DRAIN_GRACE):
            async for _ in stream:
                pass
    except (TimeoutError, ProxyError):
        pass


def _convert(converter: StreamConverter,
             chunks: list[Chunk]) -> tuple[list[dict[str, Any]], ProxyError | None]:
    """The events of some chunks; if one of them is an error, the events before it too."""
    events: list[dict[str, Any]] = []
    for chunk in chunks:
        try:
            events.extend(converter.feed(chunk))
        except ProxyError as error:
            return events, error
        if converter.stopped:
            break
    return events, None


def _frame(events: list[dict[str, Any]], sent: list[bytes]) -> bytes:
    if sse_logger.isEnabledFor(logging.DEBUG):
        for event in events:
            sse_logger.debug("SSE outbound: %s", orjson.dumps(event).decode())
    frame = encode_events(events)
    sent.append(frame)
    return frame
