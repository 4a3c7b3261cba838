"""What the server-tool flows (web search, tool search) share: the stream of a reply built
from whole blocks while the flow runs.

The client gets `message_start` at once, a `ping` while the flow waits on a search or a model
call, each block as soon as it is whole (`conversion/whole_blocks.py` renders it), then the
end the flow's result gives, or one `error` event when the flow failed or ran out of time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from claude_proxy.conversion import safeguards
from claude_proxy.conversion.ids import new_message_id
from claude_proxy.conversion.whole_blocks import (
    Block,
    Event,
    block_events,
    message,
    message_end,
    message_start,
)
from claude_proxy.errors import ProxyError
from claude_proxy.record import current_record, record_usage
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.sse import encode_event, encode_events

logger = logging.getLogger("claude_proxy.server_tools")

T = TypeVar("T")
Emit = Callable[[Block], None]
PING_SECONDS = 5.0


def without_safeguards(body: dict[str, Any]) -> dict[str, Any]:
    """A flow's own model calls are not the client's reply: nobody judges them."""
    return {key: value for key, value in body.items() if key != "safeguards"}


def unjudged(body: dict[str, Any]) -> dict[str, Any]:
    """What a flow's reply says to a request with `safeguards`: nobody judged its tool calls
    (`unsupported`); nothing without."""
    if not safeguards.requested(body):
        return {}
    return {"safeguard_results": safeguards.results(safeguards.UNSUPPORTED)}


def managed(body: dict[str, Any], reply: FlowReply) -> dict[str, Any]:
    """`context_management` for a request that has it: what the model calls applied."""
    if body.get("context_management") is None:
        return {}
    return {"context_management": {"applied_edits": reply.applied_edits or []}}


class Planned(Protocol):
    @property
    def body(self) -> dict[str, Any]: ...


@dataclass
class FlowReply:
    """What every flow's reply keeps: where its blocks go, how it ended, the usage of its
    model calls, and the context-management edits they applied."""

    emit: Emit
    stop_reason: str = "end_turn"
    input_tokens: int = 0
    output_tokens: int = 0
    applied_edits: list[dict[str, Any]] | None = None
    """The first model call's (the client's conversation, as the upstream got it)."""

    def add(self, answer: dict[str, Any]) -> None:
        """One model call's Message: its usage, and the first `applied_edits`."""
        used = answer.get("usage")
        if isinstance(used, dict):
            self.input_tokens += int(used.get("input_tokens") or 0)
            self.output_tokens += int(used.get("output_tokens") or 0)
        managed = answer.get("context_management")
        if self.applied_edits is None and isinstance(managed, dict):
            self.applied_edits = list(managed.get("applied_edits") or [])


P = TypeVar("P", bound=Planned)
R = TypeVar("R", bound=FlowReply)


class WholeBlockFlow(Generic[P, R]):
    """A server-tool flow's two renderings: `run` emits whole blocks and gives the reply;
    `usage` is the reply's usage."""

    what = "server tool"
    """The flow's name in an error."""

    def __init__(self) -> None:
        self.ping_seconds = PING_SECONDS

    async def run(self, plan: P, emit: Emit) -> R:
        raise NotImplementedError

    def usage(self, plan: P, reply: R) -> dict[str, Any]:
        raise NotImplementedError

    async def create(self, plan: P) -> dict[str, Any]:
        """The whole Message, for a non-streaming client."""
        content: list[Block] = []
        reply = await self.run(plan, content.append)
        answer = message(new_message_id(), plan.body["model"], content, reply.stop_reason,
                         self.recorded(plan, reply))
        answer.update(unjudged(plan.body))
        answer.update(managed(plan.body, reply))
        current_record().message = answer  # for the dashboard's inspector
        return answer

    def stream(self, plan: P, deadline: float) -> AsyncGenerator[bytes, None]:
        """SSE bytes: message_start at once, a ping while waiting, each block when whole."""
        return whole_block_stream(
            plan.body["model"], estimate_request_tokens(plan.body),
            lambda emit: self.run(plan, emit), partial(self.end, plan),
            deadline=deadline, ping_seconds=self.ping_seconds, what=self.what)

    def end(self, plan: P, reply: R) -> list[Event]:
        events = message_end(reply.stop_reason, self.recorded(plan, reply))
        events[0]["delta"].update(unjudged(plan.body))
        events[0].update(managed(plan.body, reply))
        return events

    def recorded(self, plan: P, reply: R) -> dict[str, Any]:
        """The reply's usage, also on the request's record (the access line, spend)."""
        result = self.usage(plan, reply)
        record_usage(result, 0)
        record = current_record()
        record.stream, record.client_body = bool(plan.body.get("stream")), plan.body
        return result


async def whole_block_stream(model: str, input_tokens: int, run: Callable[[Emit], Awaitable[T]],
                             ending: Callable[[T], list[Event]], *, deadline: float,
                             ping_seconds: float, what: str) -> AsyncGenerator[bytes, None]:
    """SSE bytes of a flow: `run(emit)` emits whole blocks and returns its result, which
    `ending` turns into the message's end. `what` names the flow in an error."""
    queue: asyncio.Queue[list[Event]] = asyncio.Queue()
    index = 0

    def emit(block: Block) -> None:
        nonlocal index
        queue.put_nowait(block_events(index, block))
        index += 1

    async def work() -> T:
        async with asyncio.timeout_at(deadline):
            return await run(emit)

    sent = current_record().events  # for the dashboard: one append per write

    def frame(events: list[Event]) -> bytes:
        encoded = encode_events(events)
        sent.append(encoded)
        return encoded

    yield frame([message_start(new_message_id(), model, input_tokens)])
    task = asyncio.ensure_future(work())
    try:
        while not task.done() or not queue.empty():
            if queue.empty():
                done, _ = await asyncio.wait({task}, timeout=ping_seconds)
                if not done and queue.empty():
                    yield encode_event({"type": "ping"})
                continue
            yield frame(queue.get_nowait())
        yield frame(_ending(task, ending, what))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _ending(task: asyncio.Future[T], ending: Callable[[T], list[Event]],
            what: str) -> list[Event]:
    try:
        result = task.result()
    except TimeoutError:
        return [ProxyError(504, f"the {what} did not finish within TOTAL_TIMEOUT",
                           error_type="overloaded_error").body()]
    except ProxyError as error:
        kind = "overloaded_error" if error.status >= 500 else error.error_type
        logger.warning("%s request failed after the first byte: %s", what, error.message)
        return [ProxyError(error.status, error.message, error_type=kind).body()]
    return ending(result)
