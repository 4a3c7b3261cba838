"""The lifetime of one response: its deadline, the client going away, and the SSE relay.

Before the first byte, upstream work runs as a task raced against the client's disconnect
and the TOTAL_TIMEOUT deadline, so a client that leaves cancels the upstream request at once.
After it, the relay turns chunks into events until the end, a failure (every open block closed,
then one `event: error`), or the deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
import orjson
from starlette.requests import Request

from claude_proxy.access import current_record, record_usage
from claude_proxy.conversion.response_converter import StreamConverter
from claude_proxy.errors import ProxyError
from claude_proxy.metrics import Metrics
from claude_proxy.sse import encode_events
from claude_proxy.upstream import Chunk, UpstreamStream

logger = logging.getLogger("claude_proxy.lifecycle")
sse_logger = logging.getLogger("claude_proxy.sse")

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response started."""


def deadline_error() -> ProxyError:
    return ProxyError(504, "the upstream did not finish within TOTAL_TIMEOUT",
                      error_type="timeout_error")


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def before_first_byte(request: Request, work: Awaitable[T], deadline: float) -> T:
    """`work`'s result, unless the client leaves first (ClientDisconnected) or the deadline
    passes (504); either way the work is cancelled and has finished cleaning up on return."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        async with asyncio.timeout_at(deadline):
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        pass
    finally:
        for pending in (task, watcher):
            pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.done() and not task.cancelled():
        return task.result()
    if watcher.done() and not watcher.cancelled():
        raise ClientDisconnected
    raise deadline_error()


def transient(error: ProxyError) -> ProxyError:
    """After the first byte there is no status: server-side failures become
    `overloaded_error`, the type Claude Code retries."""
    if error.status >= 500 or error.error_type == "timeout_error":
        return ProxyError(error.status, error.message, error_type="overloaded_error")
    return error


class ChunkPump:
    """Reads the upstream in its own task while the relay writes to the client.

    The reader runs on until it has to wait for the network, so everything one network read
    brought in (often many SSE events) is waiting when the relay wakes up, and goes to the
    client in one write instead of one write per event.
    """

    def __init__(self, stream: UpstreamStream) -> None:
        self.chunks: list[Chunk] = []
        self.arrived = asyncio.Event()
        self.finished = False
        self.error: ProxyError | None = None
        self._stream = stream

    async def run(self) -> None:
        try:
            async for batch in self._stream:
                self.chunks.extend(batch)
                self.arrived.set()
        except ProxyError as error:
            self.error = error
        finally:
            self.finished = True
            self.arrived.set()

    async def take(self) -> list[Chunk]:
        """Everything read so far (waiting for something, or for the end)."""
        await self.arrived.wait()
        self.arrived.clear()
        taken, self.chunks = self.chunks, []
        return taken


async def relay_events(converter: StreamConverter, stream: UpstreamStream,
                       deadline: float, metrics: Metrics) -> AsyncIterator[bytes]:
    """Upstream chunks through the converter to SSE bytes, ending in message_stop or in one
    `event: error`. A cancelled relay (the client left) stops the reader and closes the
    upstream response.

    The deadline is checked whenever the upstream sends anything; a silent upstream is ended
    by the idle-read timeout (REQUEST_TIMEOUT) instead, so no timer runs per chunk.
    """
    loop = asyncio.get_running_loop()
    sent = current_record().events  # for the dashboard: one append per write, nothing more
    pump = ChunkPump(stream)
    reader = asyncio.ensure_future(pump.run())
    metrics.active_streams.inc()
    try:
        yield _frame(converter.start(), sent)
        while not pump.finished or pump.chunks:
            chunks = await pump.take()
            if loop.time() > deadline:
                raise deadline_error()
            events, failure = _convert(converter, chunks)
            if events:
                yield _frame(events, sent)
            if failure is not None:
                raise failure
        if pump.error is not None:
            raise pump.error
        if not stream.complete and not converter.saw_finish_reason:
            raise ProxyError(502, "upstream stream ended before the response was complete",
                             error_type="overloaded_error")
        yield _frame(converter.finish(), sent)
    except ProxyError as error:
        logger.warning("upstream stream failed after the first byte: %s", error.message)
        metrics.count_upstream_error(transient(error).error_type)
        yield _frame(converter.fail(transient(error)), sent)
    finally:
        metrics.active_streams.dec()
        record_usage(converter.usage(), converter.reasoning_tokens())
        reader.cancel()
        # The relay may be finishing because it was cancelled (the client left): shield the
        # clean-up, or its first await would be cancelled too and the upstream left open.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(reader, return_exceptions=True)
            await stream.aclose()


def _convert(converter: StreamConverter,
             chunks: list[Chunk]) -> tuple[list[dict[str, Any]], ProxyError | None]:
    """The events of some chunks; if one of them is an error, the events before it too."""
    events: list[dict[str, Any]] = []
    for chunk in chunks:
        try:
            events.extend(converter.feed(chunk))
        except ProxyError as error:
            return events, error
    return events, None


def _frame(events: list[dict[str, Any]], sent: list[list[dict[str, Any]]]) -> bytes:
    sent.append(events)
    if sse_logger.isEnabledFor(logging.DEBUG):
        for event in events:
            sse_logger.debug("SSE outbound: %s", orjson.dumps(event).decode())
    return encode_events(events)
