"""A request whose `tools` hold a `web_search_*` server tool: the search runs for real.

The upstream never sees the server tool. It gets a function `web_search` {query: string}
(forced only if the client forced `web_search`); when the model calls it, the proxy runs the
search, answers the call with the numbered results and lets the model write the summary, at
most `max_uses` searches per request. Claude Code's own side query ("Perform a web search for
the query: …") is searched at once, skipping the first model call. If the summary call fails,
the text is a plain digest of the hits. With no way to search (`off`, no backend) the answer is
Anthropic's `unavailable` error blocks with HTTP 200, never an answer from memory.

The client gets the blocks in Anthropic's order: `message_start` at once, `ping` while a search
or a model call runs, then each block as soon as it is whole (see `blocks.py`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from claude_proxy.config.settings import ProviderSettings, SearchSettings
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.conversion.whole_blocks import Block, text_block
from claude_proxy.errors import ProxyError
from claude_proxy.metrics import Metrics
from claude_proxy.record import current_record, current_trace, mark
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.server_tools import FlowReply, WholeBlockFlow, without_safeguards
from claude_proxy.websearch.backends import (
    MAX_QUERY_CHARS,
    Query,
    SearchBackend,
    SearchFailed,
    filter_hits,
)
from claude_proxy.websearch.native import native_hits, native_kind, native_switch
from claude_proxy.websearch.search_blocks import (
    Search,
    digest,
    numbered_results,
    search_blocks,
    usage,
)

logger = logging.getLogger("claude_proxy.websearch")

SIDE_QUERY_PREFIX = "Perform a web search for the query: "
SERVER_TOOL_TYPE = re.compile(r"^web_search_\d+$")
FUNCTION_NAME = "web_search"
DEFAULT_MAX_USES = 5
REFUSED = frozenset({"max_uses_exceeded", "invalid_tool_input", "query_too_long"})

FUNCTION_TOOL: dict[str, Any] = {
    "name": FUNCTION_NAME,
    "description": "Search the web. Returns numbered results (title, URL, snippet).",
    "input_schema": {"type": "object", "properties": {"query": {
        "type": "string", "description": "The search query"}}, "required": ["query"]},
}

TURN_ON_SEARCH = ("set WEB_SEARCH_BACKEND (searxng, brave, tavily or exa) with WEB_SEARCH_URL "
                  "or WEB_SEARCH_API_KEY, or WEB_SEARCH=native for a provider that searches")


# ---------------------------------------------------------------- recognising the request


def server_search_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and SERVER_TOOL_TYPE.match(str(tool.get("type", ""))):
            return tool
    return None


def is_search_request(body: dict[str, Any]) -> bool:
    """The request holds a `web_search_*` server tool (Claude Code's WebSearch side query,
    or any Anthropic client that lets the model search)."""
    return server_search_tool(body) is not None


def last_user_text(body: dict[str, Any]) -> str:
    for item in reversed(body.get("messages") or []):
        if item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or []
                 if isinstance(b, dict) and b.get("type") == "text"]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def side_query(body: dict[str, Any]) -> str | None:
    """The query of Claude Code's side query: every tool a search tool, and the user text
    `Perform a web search for the query: <query>`."""
    tools = body.get("tools") or []
    if not all(isinstance(t, dict) and SERVER_TOOL_TYPE.match(str(t.get("type", "")))
               for t in tools):
        return None
    text = last_user_text(body)
    return text[len(SIDE_QUERY_PREFIX):] if text.startswith(SIDE_QUERY_PREFIX) else None


def _domains(tool: dict[str, Any], key: str) -> tuple[str, ...]:
    value = tool.get(key)
    return tuple(str(d) for d in value if isinstance(d, str) and d) if isinstance(
        value, list) else ()


@dataclass
class Plan:
    """What one search request asks for, checked before the response starts."""

    body: dict[str, Any]
    mode: str
    side_query: str | None
    max_uses: int
    allowed: tuple[str, ...]
    blocked: tuple[str, ...]
    forced: bool
    provider: ProviderSettings

    def query(self, text: str, max_results: int) -> Query:
        return Query(text, self.allowed, self.blocked, max_results)


def make_plan(body: dict[str, Any], provider: ProviderSettings, has_backend: bool) -> Plan:
    """The plan, or a 400 for a request Anthropic refuses too (both domain lists)."""
    tool = server_search_tool(body) or {}
    allowed, blocked = _domains(tool, "allowed_domains"), _domains(tool, "blocked_domains")
    if allowed and blocked:
        raise ProxyError(400, "web_search: allowed_domains and blocked_domains cannot both "
                              "be set", error_type="invalid_request_error")
    mode = provider.web_search or ("backend" if has_backend else "off")
    max_uses = tool.get("max_uses")
    choice = body.get("tool_choice")
    forced = isinstance(choice, dict) and choice.get("type") == "tool" and choice.get(
        "name") == tool.get("name", FUNCTION_NAME)
    return Plan(body, mode, side_query(body),
                max_uses if isinstance(max_uses, int) and max_uses > 0 else DEFAULT_MAX_USES,
                allowed, blocked, forced, provider)


def upstream_body(plan: Plan, history: list[dict[str, Any]], first: bool,
                  function: bool = True) -> dict[str, Any]:
    """The client's request for one model call: the function `web_search` beside the server
    tool (which the converter leaves out, and the router reads for its web_search route), the
    flow's turns appended, not streamed. The client's `tool_choice` holds for the first call
    only (then naming the function); later calls, which write the summary, are free."""
    body = plan.body
    search = [FUNCTION_TOOL] if function else []
    tools = [replacement for t in body.get("tools") or [] if isinstance(t, dict)
             for replacement in ([t, *search] if SERVER_TOOL_TYPE.match(str(t.get("type", "")))
                                 else [t])]
    request = {**without_safeguards(body), "tools": tools,
               "messages": [*body["messages"], *history], "stream": False}
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") not in ("tool", "any"):
        return request
    if not first or (plan.forced and not function):
        request["tool_choice"] = {"type": "auto"}
    elif plan.forced:
        request["tool_choice"] = {"type": "tool", "name": FUNCTION_NAME}
    return request


def check_query(query: Any) -> str | None:
    """The Anthropic error code for a query that cannot be searched, else None."""
    if not isinstance(query, str) or not query.strip():
        return "invalid_tool_input"
    if len(query) > MAX_QUERY_CHARS:
        return "query_too_long"
    return None


# ---------------------------------------------------------------- the model


class ModelCaller(Protocol):
    """What the flow needs from the service: the provider's settings, a non-streamed model
    call (an Anthropic Message), and a raw call with extra upstream fields (native search)."""

    def provider_for(self, body: dict[str, Any]) -> ProviderSettings: ...

    async def create(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def create_native(self, body: dict[str, Any], switch: Callable[
            [ProviderSettings, str, dict[str, Any]], dict[str, Any] | None],
            ) -> tuple[dict[str, Any], dict[str, Any]]: ...


@dataclass
class Reply(FlowReply):
    """The blocks built so far and how the turn ended."""

    searches: list[Search] = field(default_factory=list)

    def searches_run(self) -> int:
        """Searches that reached a search engine (what max_uses counts)."""
        return sum(1 for s in self.searches if s.error not in REFUSED)


class SearchFlow(WholeBlockFlow[Plan, Reply]):
    what = "search"

    def __init__(self, settings: SearchSettings, backend: SearchBackend | None, caller: ModelCaller,
                 signer: ThinkingSigner, metrics: Metrics) -> None:
        super().__init__()
        self.settings = settings
        self.backend = backend
        self.caller = caller
        self.signer = signer
        self.metrics = metrics

    def plan(self, body: dict[str, Any]) -> Plan:
        return make_plan(body, self.caller.provider_for(body), self.backend is not None)

    def usage(self, plan: Plan, reply: Reply) -> dict[str, Any]:
        return usage(reply.input_tokens or estimate_request_tokens(plan.body),
                     reply.output_tokens, sum(1 for s in reply.searches if s.error is None))

    # ------------------------------------------------------------ the flow

    async def run(self, plan: Plan, emit: Callable[[Block], None]) -> Reply:
        reply = Reply(emit)
        if plan.mode == "native" and await self._native(plan, reply):
            return reply
        if plan.mode == "off" or self.backend is None:
            self._unavailable(plan, reply)
            return reply
        history: list[dict[str, Any]] = []
        if plan.side_query is not None:
            history = await self._search_calls(
                plan, reply, [{"id": "call_web_search_0", "name": FUNCTION_NAME,
                               "input": {"query": plan.side_query}}])
        await self._model_loop(plan, reply, history)
        return reply

    def _unavailable(self, plan: Plan, reply: Reply) -> None:
        logger.warning("web search requested but %s: answering `unavailable`; to search, %s",
                       "WEB_SEARCH=off for this provider" if plan.mode == "off"
                       else "no search backend is configured", TURN_ON_SEARCH)
        # The side query whole (what the client asked); a whole user turn is cut to the limit.
        query = (plan.side_query if plan.side_query is not None
                 else last_user_text(plan.body)[:MAX_QUERY_CHARS])
        self._add_search(reply, Search(query, error="unavailable", source="none"))

    def _add_search(self, reply: Reply, search: Search) -> None:
        reply.searches.append(search)
        for block in search_blocks(search, self.signer):
            reply.emit(block)

    async def _model_loop(self, plan: Plan, reply: Reply,
                          history: list[dict[str, Any]]) -> None:
        """Model calls until it answers without searching (bounded by max_uses)."""
        for turn in range(plan.max_uses + 2):
            try:
                answer = await self.caller.create(
                    upstream_body(plan, history, first=turn == 0 and not history))
            except ProxyError as error:
                if not reply.searches:
                    raise
                logger.warning("the summary call failed (%s); answering with a digest of the "
                               "results", error.message)
                reply.emit(text_block(digest(reply.searches)))
                return
            reply.add(answer)
            turns = await self._answer(plan, reply, answer)
            if turns is None:
                return
            history = [*history, *turns]
        reply.emit(text_block(digest(reply.searches)))

    async def _answer(self, plan: Plan, reply: Reply,
                      answer: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Emit one model answer, running its `web_search` calls; the turns that give it
        the results, or None when the reply is done (a text answer, or calls of the client's
        own tools, which end the turn)."""
        content = [b for b in answer.get("content") or [] if isinstance(b, dict)]
        calls = [b for b in content if b.get("type") == "tool_use"
                 and b.get("name") == FUNCTION_NAME]
        others = [b for b in content if b.get("type") == "tool_use" and b not in calls]
        for block in content:
            if block.get("type") != "tool_use":
                reply.emit(block)
        turns = await self._search_calls(plan, reply, calls, content) if calls else None
        if others:
            for block in others:
                reply.emit(block)
            reply.stop_reason = "tool_use"
            return None
        if turns is not None:
            return turns
        if not any(b.get("type") == "text" for b in content) and reply.searches:
            reply.emit(text_block(digest(reply.searches)))
        reason = str(answer.get("stop_reason") or "end_turn")
        reply.stop_reason = "end_turn" if reason == "tool_use" else reason
        return None

    async def _search_calls(self, plan: Plan, reply: Reply, calls: list[Block],
                            assistant: list[Block] | None = None) -> list[dict[str, Any]]:
        """Run the model's `web_search` calls; the turns that give it the results."""
        results: list[dict[str, Any]] = []
        for call in calls:
            given = call.get("input")  # a string when the model's arguments were no object
            query = given.get("query") if isinstance(given, dict) else None
            search = await self._search(plan, reply, query)
            self._add_search(reply, search)
            results.append({"type": "tool_result", "tool_use_id": call["id"],
                            "content": numbered_results(search)})
        if assistant is None:
            assistant = [{"type": "tool_use", **call} for call in calls]
        return [{"role": "assistant", "content": assistant},
                {"role": "user", "content": results}]

    async def _search(self, plan: Plan, reply: Reply, query: Any) -> Search:
        text = query if isinstance(query, str) else ""
        error = check_query(query)
        if error is None and reply.searches_run() >= plan.max_uses:
            error = "max_uses_exceeded"
        assert self.backend is not None
        if error is not None:
            # The query as the client asked it, whole: a `query_too_long` next to a query
            # cut to the limit would contradict itself.
            search = Search(text, error=error, source=self.backend.name)
            self._log(search, 0.0)
            return search
        started = time.perf_counter()
        try:
            hits = await self.backend.search(plan.query(text, self.settings.web_search_max_results))
            search = Search(text, hits, source=self.backend.name)
        except SearchFailed as failure:
            logger.warning("web search via %s failed: %s", self.backend.name, failure.reason)
            search = Search(text, error=failure.code, source=self.backend.name)
        self._log(search, time.perf_counter() - started)
        return search

    def _log(self, search: Search, seconds: float) -> None:
        outcome = search.error or ("ok" if search.hits else "empty")
        self.metrics.web_searches.labels(search.source, outcome).inc()
        mark("web search", f"{search.source}: {outcome}, {len(search.hits)} hits, query "
                           f"{len(search.query)} chars")
        trace = current_trace()
        if trace is not None:  # a span of its own (the query is not recorded)
            trace.tool_call("web_search", search.source, outcome, seconds)
        logger.info("web_search request_id=%s source=%s query_chars=%d hits=%d outcome=%s "
                    "ms=%.1f", current_record().request_id, search.source, len(search.query),
                    len(search.hits), outcome, seconds * 1e3)

    # ------------------------------------------------------------ native

    async def _native(self, plan: Plan, reply: Reply) -> bool:
        """The provider's own search; False when it has none or it failed (then the
        backend, if any, runs instead)."""
        text = plan.side_query if plan.side_query is not None else last_user_text(plan.body)
        query = plan.query(text[:MAX_QUERY_CHARS], self.settings.web_search_max_results)
        started = time.perf_counter()
        source = f"native:{plan.provider.provider_name}"
        try:
            completion, answer = await self.caller.create_native(
                upstream_body(plan, [], first=True, function=False),
                lambda provider, api, body: native_switch(native_kind(provider, api), query,
                                                          body))
        except ProxyError as error:
            logger.warning("native web search on %s failed or is not available (%s); "
                           "falling back to %s", source,
                           error.message, self.backend.name if self.backend else "unavailable")
            self.metrics.web_searches.labels(source, "unavailable").inc()
            return False
        search = Search(query.text, filter_hits(native_hits(completion), query), source=source)
        self._log(search, time.perf_counter() - started)
        self._add_search(reply, search)
        reply.add(answer)
        for block in answer.get("content") or []:
            reply.emit(block)
        reply.stop_reason = "tool_use" if any(
            b.get("type") == "tool_use" for b in answer.get("content") or []) else "end_turn"
        return True

