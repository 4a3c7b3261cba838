"""The safeguards judge: each tool call of a reply to a request with `safeguards` (Claude
Code's Auto mode) judged on a configured route (`[router] safeguards`, SAFEGUARDS_ROUTE).

Each call is one small, non-streamed Messages request (conversion/safeguards.py makes the
prompt and reads the answer) sent through the service like any other, so the route's provider,
conversion and failover apply. It runs under a request record of its own: the judge's call is
not the client's request, and must not overwrite what the access line and spend read. A judge
that fails or runs out of time says so (`unavailable` with the reason); it never guesses.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from claude_proxy.conversion import safeguards
from claude_proxy.errors import ProxyError
from claude_proxy.record import RequestRecord, bind, new_request_id
from claude_proxy.service import MessagesService
from claude_proxy.upstream.overflow import ContextOverflow

logger = logging.getLogger("claude_proxy.safeguards")

JUDGE_PATH = "/v1/messages (safeguards judge)"


class RouteJudge:
    """`safeguards.Judge` on a route: `PROVIDER,MODEL` entries tried in order."""

    def __init__(self, service: MessagesService, route: list[str], timeout: float) -> None:
        self.service = service
        self.route = route
        self.timeout = timeout

    async def __call__(self, body: dict[str, Any],
                       tool_uses: list[dict[str, Any]]) -> safeguards.Status:
        """The verdicts on every tool call of the reply, judged at once."""
        found = await asyncio.gather(*(self.judge(body, use) for use in tool_uses))
        return safeguards.available({use["id"]: status for use, status in zip(tool_uses, found,
                                                                              strict=True)})

    async def judge(self, body: dict[str, Any], tool_use: dict[str, Any]) -> safeguards.Status:
        """One tool call's status: the judge's outcome, or why there is none."""
        reason = "error"
        for entry in self.route:
            request = safeguards.judge_request(body, tool_use, entry)
            try:
                async with asyncio.timeout(self.timeout):
                    message = await asyncio.create_task(self._ask(request))
            except TimeoutError:
                logger.warning("safeguards judge %s took over %gs for tool %s: unavailable",
                               entry, self.timeout, tool_use.get("name"))
                return safeguards.unavailable_call("timeout")
            except ProxyError as error:
                reason = "input_too_long" if isinstance(error, ContextOverflow) else "error"
                logger.warning("safeguards judge %s failed (%d %s)", entry, error.status,
                               error.message)
                continue
            status = safeguards.verdict(message)
            logger.info("safeguards judge %s: tool %s %s", entry, tool_use.get("name"),
                        status.get("outcome", status.get("reason")))
            return status
        return safeguards.unavailable_call(reason)

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The judge's Message, under its own record (this runs as a task: its own context)."""
        bind(RequestRecord(new_request_id(), "POST", JUDGE_PATH))
        return await self.service.create(request)
