"""SIGTERM as a rolling update needs it: the load balancer told first, open answers finished.

On the first SIGTERM (later ones change nothing; SIGINT stops as uvicorn does):
1. `/health` answers 503 `draining` at once (`/health/live` stays 200), so that a load
   balancer's readiness check takes the process out of rotation; what still arrives is served;
2. DRAIN_DELAY seconds later uvicorn's own shutdown begins: the socket closes, idle
   connections close, and uvicorn waits for the requests still open;
3. DRAIN_TIMEOUT seconds after the SIGTERM, what is still open ends the way Anthropic's clients
   retry: a stream with an `overloaded_error` event after its open blocks are closed, a request
   still waiting for its upstream's first byte with a 529 `overloaded_error` answer. uvicorn's
   graceful timeout, set FINAL_WRITES past that, only ever cuts a client that does not read its
   last bytes.
With --workers N the parent passes SIGTERM on to every worker (cli/supervisor.py), and each
drains as above.

What the drain ends is registered by the relay (server/relay.py): a stream for its lifetime
(`Reading`: one set entry, and a flag per upstream read), a request waiting for its first
byte by its deadline's asyncio.Timeout (rescheduled to now when the drain ends).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from claude_proxy.errors import ProxyError

logger = logging.getLogger("claude_proxy.lifecycle")

T = TypeVar("T")

FINAL_WRITES = 5.0
"""Seconds uvicorn waits past DRAIN_TIMEOUT for the last events to reach the clients."""
DRAINED = ("the proxy is restarting and could not finish this answer within DRAIN_TIMEOUT; "
           "send the request again")


class Drained(ProxyError):
    """An answer the drain ended: Anthropic's `overloaded_error`, which clients retry."""

    def __init__(self) -> None:
        super().__init__(529, DRAINED, error_type="overloaded_error")


class Reading:
    """An open stream as the drain sees it: its task, whether it is waiting for the upstream
    (the drain's end then cancels that wait), and whether its end is due."""

    __slots__ = ("due", "task", "waiting")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.waiting = False
        self.due = False

    async def next_of(self, items: AsyncIterator[T]) -> T | None:
        """The next of `items` (None at their end), read as a wait the drain's end may cut:
        then `Drained`, the cancellation taken back."""
        self.waiting = True
        try:
            return await anext(items, None)
        except asyncio.CancelledError:
            if self.due and self.task is not None and self.task.uncancel() == 0:
                raise Drained() from None
            raise
        finally:
            self.waiting = False


def graceful_shutdown(delay: float, timeout: float) -> float:
    """uvicorn's timeout_graceful_shutdown: from the socket's close (DRAIN_DELAY after the
    SIGTERM) to FINAL_WRITES past DRAIN_TIMEOUT."""
    return max(timeout - delay, 0.0) + FINAL_WRITES


class Drain:
    """One process's drain (see the module docstring)."""

    def __init__(self, delay: float, timeout: float) -> None:
        self.delay = delay
        self.timeout = max(timeout, delay)
        self.draining = False
        self.ended = False
        self._streams: set[Reading] = set()
        self._waiting: set[asyncio.Timeout] = set()

    # ------------------------------------------------------------ what is open

    def stream(self) -> Reading:
        reading = Reading(asyncio.current_task())
        self._streams.add(reading)
        return reading

    def closed(self, reading: Reading) -> None:
        self._streams.discard(reading)

    def waiting(self, timeout: asyncio.Timeout) -> None:
        if self.ended:
            timeout.reschedule(asyncio.get_running_loop().time())
        self._waiting.add(timeout)

    def answered(self, timeout: asyncio.Timeout) -> None:
        self._waiting.discard(timeout)

    # ------------------------------------------------------------ the sequence

    def begin(self, stop: Callable[[], None]) -> None:
        """/health says `draining` from now; `stop` (uvicorn's shutdown) after DRAIN_DELAY;
        whatever is still open is ended at DRAIN_TIMEOUT."""
        if self.draining:
            logger.info("SIGTERM again: still draining")
            return
        self.draining = True
        logger.info("SIGTERM: draining (/health answers 503); the socket closes in %g s, open "
                    "answers may take %g s", self.delay, self.timeout)
        loop = asyncio.get_running_loop()
        loop.call_later(self.delay, stop)
        loop.call_later(self.timeout, self.end)

    def end(self) -> None:
        """DRAIN_TIMEOUT: every open stream ends with `overloaded_error`, every request still
        waiting for its upstream answers 529."""
        self.ended = True
        if self._streams or self._waiting:
            logger.warning("DRAIN_TIMEOUT (%g s) reached: ending %d open streams and %d waiting "
                           "requests with overloaded_error", self.timeout, len(self._streams),
                           len(self._waiting))
        now = asyncio.get_running_loop().time()
        for timeout in list(self._waiting):
            timeout.reschedule(now)
        for reading in list(self._streams):
            reading.due = True
            if reading.waiting and reading.task is not None:
                reading.task.cancel(DRAINED)

    def take_over_sigterm(self) -> None:
        """Put `begin` before the SIGTERM handler the server installed (uvicorn's, which then
        runs after DRAIN_DELAY). Only in the main thread, where signals are handled; a server
        in another thread (the tests') keeps its own."""
        if threading.current_thread() is not threading.main_thread():
            return
        handler = signal.getsignal(signal.SIGTERM)
        if not callable(handler):
            return
        loop = asyncio.get_running_loop()
        server_stop = handler

        def on_sigterm(number: int, frame: Any) -> None:
            loop.call_soon_threadsafe(self.begin, lambda: server_stop(number, frame))

        signal.signal(signal.SIGTERM, on_sigterm)
