"""A request whose `tools` hold Anthropic's tool search server tool: the proxy runs the search.

The upstream never sees the server tool nor the deferred tools (`defer_loading`) it has not
loaded: the request converter leaves both out. It gets a function of the server tool's name
(`pattern` for regex, `query` for bm25, and `limit`); when the model calls it, the proxy
searches the deferred tools (`matching.py`), answers the call with `tool_reference` blocks
(which load those tools and read as their definitions: conversion/tools.py) and asks the model
again, at most MAX_SEARCHES searches per request. The client gets Anthropic's blocks: a
`server_tool_use` and a `tool_search_tool_result` per search (an error result for a bad
pattern, never a failed request), then the model's answer, and
`usage.server_tool_use.tool_search_requests`. When the conversation comes back, these blocks
are flattened for the upstream (`flatten`), the found tools staying loaded.

Like the web search (websearch/), each model call is a non-streamed request through the
service; a streaming client gets `message_start` at once and each block when it is whole.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from claude_proxy.conversion.census import holds
from claude_proxy.conversion.whole_blocks import (
    Block,
    new_server_tool_id,
    text_block,
)
from claude_proxy.errors import ProxyError
from claude_proxy.record import current_record, mark
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.server_tools import FlowReply, WholeBlockFlow, without_safeguards
from claude_proxy.service import MessagesService
from claude_proxy.toolsearch.matching import (
    BadInput,
    bm25_search,
    compile_pattern,
    regex_search,
)

logger = logging.getLogger("claude_proxy.toolsearch")

SERVER_TOOL_TYPE = re.compile(r"^tool_search_tool_(regex|bm25)(_\d+)?$")
RESULT = "tool_search_tool_result"
DEFAULT_LIMIT = 5
MAX_LIMIT = 20
MAX_SEARCHES = 5
"""Searches one request may run; later calls get a `too_many_requests` result."""
REGEX_SECONDS = 2.0
"""How long one pattern may run over the tools (a pathological regex is cut off)."""


def server_tool(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The tool search server tool and its position in `tools`, if the request has one."""
    for position, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and SERVER_TOOL_TYPE.match(str(tool.get("type", ""))):
            return position, tool
    return None


def is_tool_search_request(body: dict[str, Any]) -> bool:
    return server_tool(body) is not None


@dataclass(frozen=True)
class Plan:
    """What one tool-search request asks for, checked before the response starts."""

    body: dict[str, Any]
    name: str
    """The server tool's name (the function the model calls, and the blocks' `name`)."""
    kind: str
    """`regex` or `bm25`."""
    deferred: list[dict[str, Any]]

    @property
    def argument(self) -> str:
        return "pattern" if self.kind == "regex" else "query"

    def function(self) -> dict[str, Any]:
        """The function the upstream model gets in the server tool's place."""
        how = ("a Python regular expression (re.search, case-insensitive, at most 200 "
               "characters) matched against each tool's name, description and argument names"
               if self.kind == "regex" else "words ranked (BM25) against each tool's name, "
               "description and argument names")
        return {"name": self.name, "description": (
            f"Search {len(self.deferred)} more tools that are not loaded yet, by {how}. "
            "The tools found are returned with their definitions and can be called from then "
            "on."), "input_schema": {"type": "object", "properties": {
                self.argument: {"type": "string"},
                "limit": {"type": "integer", "description": "How many tools at most (default "
                                                            f"{DEFAULT_LIMIT})"}},
                "required": [self.argument]}}


def make_plan(body: dict[str, Any]) -> Plan:
    """The plan, or a 400 naming the field for a request Anthropic refuses too."""
    found = server_tool(body)
    assert found is not None
    position, tool = found
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if sum(1 for t in tools if SERVER_TOOL_TYPE.match(str(t.get("type", "")))) > 1:
        raise ProxyError(400, "tools: only one tool search tool may be given")
    if tool.get("defer_loading"):
        raise ProxyError(400, f"tools.{position}.defer_loading: the tool search tool itself "
                              "cannot be deferred")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ProxyError(400, f"tools.{position}.name: Field required")
    kind = "regex" if "regex" in str(tool["type"]) else "bm25"
    deferred = [t for t in tools if t.get("defer_loading") and isinstance(t.get("name"), str)
                and t.get("type") in (None, "custom")]
    return Plan(body, name, kind, deferred)


@dataclass
class Reply(FlowReply):
    """The blocks built so far, how the turn ended, and the model's turns so far."""

    searches: int = 0
    """Searches run (what `tool_search_requests` counts)."""
    history: list[dict[str, Any]] = field(default_factory=list)


class ToolSearchFlow(WholeBlockFlow[Plan, Reply]):
    what = "tool search"

    def __init__(self, service: MessagesService) -> None:
        super().__init__()
        self.service = service

    @staticmethod
    def plan(body: dict[str, Any]) -> Plan:
        return make_plan(body)

    def usage(self, plan: Plan, reply: Reply) -> dict[str, Any]:
        return {"input_tokens": reply.input_tokens or estimate_request_tokens(plan.body),
                "output_tokens": reply.output_tokens, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0,
                                    "tool_search_requests": reply.searches}}

    # ------------------------------------------------------------ the loop

    async def run(self, plan: Plan, emit: Callable[[Block], None]) -> Reply:
        """Model calls until the model answers without searching."""
        reply = Reply(emit)
        for _ in range(MAX_SEARCHES + 2):
            answer = await self.service.create(self._upstream_body(plan, reply.history))
            reply.add(answer)
            if not await self._answer(plan, reply, answer):
                return reply
        return reply

    def _upstream_body(self, plan: Plan, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The client's request with the search function beside the server tool (which the
        converter leaves out, as it does deferred tools nothing has loaded), the flow's turns
        appended, not streamed."""
        body = plan.body
        return {**without_safeguards(body), "tools": [*(body.get("tools") or []),
                                                      plan.function()],
                "messages": [*body["messages"], *history], "stream": False}

    async def _answer(self, plan: Plan, reply: Reply, answer: dict[str, Any]) -> bool:
        """Emit one model answer, running its searches; whether the model is to be asked
        again (it searched, and called none of the client's tools)."""
        content = [b for b in answer.get("content") or [] if isinstance(b, dict)]
        calls = [b for b in content if b.get("type") == "tool_use" and b.get("name") == plan.name]
        others = [b for b in content if b.get("type") == "tool_use" and b not in calls]
        for block in content:
            if block.get("type") != "tool_use":
                reply.emit(block)
        results = [await self._search(plan, reply, call) for call in calls]
        if others:
            for block in others:
                reply.emit(block)
            reply.stop_reason = "tool_use"
            return False
        if not calls:
            reason = str(answer.get("stop_reason") or "end_turn")
            reply.stop_reason = "end_turn" if reason == "tool_use" else reason
            return False
        reply.history += [{"role": "assistant", "content": content},
                          {"role": "user", "content": results}]
        return True

    async def _search(self, plan: Plan, reply: Reply, call: Block) -> dict[str, Any]:
        """Run one search call: its two blocks to the client; the tool_result for the model."""
        given = call.get("input")
        arguments: dict[str, Any] = given if isinstance(given, dict) else {}
        server_id = new_server_tool_id()
        reply.emit({"type": "server_tool_use", "id": server_id, "name": plan.name,
                    "input": arguments})
        try:
            names = await self._found(plan, reply, arguments)
        except BadInput as bad:
            reply.emit(_error_block(server_id, "invalid_tool_input", str(bad)))
            return _tool_result(call, f"Tool search error: invalid_tool_input: {bad}")
        except _Refused as refused:
            reply.emit(_error_block(server_id, refused.code, refused.message))
            return _tool_result(call, f"Tool search error: {refused.code}: {refused.message}")
        references = [{"type": "tool_reference", "tool_name": name} for name in names]
        reply.emit({"type": RESULT, "tool_use_id": server_id, "content": {
            "type": "tool_search_tool_search_result", "tool_references": references}})
        mark("tool search", f"{plan.kind}: {len(names)} of {len(plan.deferred)} tools")
        return _tool_result(call, references or "No tools matched.")

    async def _found(self, plan: Plan, reply: Reply, arguments: dict[str, Any]) -> list[str]:
        if reply.searches >= MAX_SEARCHES:
            raise _Refused("too_many_requests", f"at most {MAX_SEARCHES} searches a request")
        limit = arguments.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise BadInput(f"limit must be an integer from 1 to {MAX_LIMIT}")
        query = arguments.get(plan.argument, arguments.get("query", arguments.get("pattern")))
        if plan.kind == "bm25":
            names = bm25_search(query, plan.deferred, limit)
        else:
            compiled = compile_pattern(query)
            try:  # in a thread: a pathological pattern must not stall the event loop
                names = await asyncio.wait_for(asyncio.to_thread(
                    regex_search, compiled, plan.deferred, limit), REGEX_SECONDS)
            except TimeoutError:
                raise _Refused("execution_time_exceeded",
                               f"the pattern ran longer than {REGEX_SECONDS:g}s") from None
        reply.searches += 1
        logger.info("tool search request_id=%s kind=%s found=%d of %d",
                    current_record().request_id, plan.kind, len(names), len(plan.deferred))
        return names


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _error_block(server_id: str, code: str, message: str) -> Block:
    return {"type": RESULT, "tool_use_id": server_id, "content": {
        "type": "tool_search_tool_result_error", "error_code": code, "error_message": message}}


def _tool_result(call: Block, content: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call["id"], "content": content}


# ---------------------------------------------------------------- replay


def flatten(body: dict[str, Any]) -> dict[str, Any]:
    """The request with earlier turns' tool-search blocks as the upstream can take them: a
    `server_tool_use` of the search tool → a line saying what was searched; its result → the
    `tool_reference` blocks (which keep the tools loaded, and read as their definitions), or
    the error as text. Without such blocks the body itself (every request of a long
    conversation asks, and most have none: the census answers first)."""
    messages = body.get("messages")
    if (not isinstance(messages, list) or not holds(messages, RESULT, "server_tool_use")
            or not any(_holds_search(m) for m in messages)):
        return body
    return {**body, "messages": [_flattened(m) for m in messages]}


def _holds_search(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and (b.get("type") == RESULT or (
            b.get("type") == "server_tool_use"
            and str(b.get("name", "")).startswith("tool_search_tool_"))) for b in content)


def _flattened(message: Any) -> Any:
    if not _holds_search(message):
        return message
    content: list[Any] = []
    for block in message["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "server_tool_use" and str(block.get("name", "")).startswith(
                "tool_search_tool_"):
            arguments = block.get("input") if isinstance(block.get("input"), dict) else {}
            what = arguments.get("pattern", arguments.get("query", ""))
            content.append(text_block(f"Searched the tools for {what!r}."))
        elif kind == RESULT:
            content.extend(_result_blocks(block.get("content")))
        else:
            content.append(block)
    return {**message, "content": content}


def _result_blocks(result: Any) -> list[Any]:
    if isinstance(result, dict) and result.get("type") == "tool_search_tool_search_result":
        references = [r for r in result.get("tool_references") or []
                      if isinstance(r, dict) and r.get("type") == "tool_reference"]
        return references or [text_block("No tools matched.")]
    code = result.get("error_code") if isinstance(result, dict) else None
    return [text_block(f"Tool search error: {code or 'unavailable'}")]
