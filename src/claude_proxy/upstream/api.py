"""The upstream APIs as one interface: each builds its request, sends it (streamed or whole),
parses its answer into the proxy's one delta model, recognises the fields it refuses, and says
what its wire looks like. Everything above this layer holds an `UpstreamAPI` and never asks
which one it is: a new API is a new implementation here, not a new arm in every caller.

One object per API (as simonw/llm has one class per OpenAI API): `CHAT` (`/chat/completions`),
`RESPONSES` (`/responses`, OpenAI's reasoning models), and `MESSAGES` (`/v1/messages`, the
Anthropic Messages API of other providers, in `upstream/messages.py`). `api_for` picks one per
provider and model; `api_of` gives back the one an `UpstreamRequest` was built for.

Overflows are recognised for every API alike, where errors are read (`upstream/overflow.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion.reasoning import OpaqueFor
from claude_proxy.conversion.request_converter import UpstreamRequest, convert_request
from claude_proxy.conversion.response_converter import WireParser
from claude_proxy.conversion.reuse import Slot
from claude_proxy.conversion.structured import apply_responses_structured_output
from claude_proxy.conversion.text_tool_calls import (
    TextCallPlan,
    declared_tools,
    reading_text_calls,
)
from claude_proxy.conversion.tool_schemas import OfferedTools
from claude_proxy.errors import ProxyError
from claude_proxy.upstream import chat_completions, messages, responses
from claude_proxy.upstream.capabilities import (
    REASONING,
    REWRITING,
    SUMMARY,
    Refusals,
    drop_refused,
    names_added_field,
    refused_optional_fields,
    refused_structured,
    structured_mode,
)
from claude_proxy.upstream.client import Chunk, OpenAIClient, UpstreamStream
from claude_proxy.upstream.wire import CHAT_WIRE, Wire

IsOurs = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Build:
    """What a request is built with besides the client's body: the upstream model the router
    chose, what that model is known to refuse, how to tell (and unwrap) thinking blocks the
    proxy signed, and the session's prompt-cache key."""

    model: str
    refusals: Refusals
    is_ours: IsOurs = lambda block: False
    opaque_for: OpaqueFor = lambda block: []
    cache_key: str | None = None
    betas: str | None = None
    """The client's `anthropic-beta` header (a Messages upstream gets what it takes of it)."""
    turns: Slot | None = None
    """The conversation's last conversion, for this one to reuse what it shares with it
    (a session's next turn, conversion/reuse.py; /chat/completions only)."""


class UpstreamAPI(Protocol):
    """One upstream API. `name` is what logs, the inspector and feature tables call it."""

    name: str
    label: str
    """How the DEBUG line of each upstream request names it (empty for the default API)."""
    path: str
    """Appended to the provider's base URL (Azure's /responses excepted: see its `endpoint`)."""
    wire: Wire

    def serves(self, model: str, settings: ProviderSettings) -> bool:
        """Whether this API is the one for `model` at this provider."""
        ...

    def build(self, request: dict[str, Any], settings: ProviderSettings,
              build: Build) -> UpstreamRequest:
        """The upstream request for a validated Anthropic request."""
        ...

    def parser(self, upstream: UpstreamRequest) -> WireParser:
        """A fresh parser for the answer to `upstream`."""
        ...

    async def send_stream(self, client: OpenAIClient,
                          upstream: UpstreamRequest) -> UpstreamStream:
        """The answer's stream, opened and read to its first real event."""
        ...

    async def send_once(self, client: OpenAIClient, upstream: UpstreamRequest) -> Chunk:
        """The whole answer as its JSON body."""
        ...

    def events_of(self, answer: Chunk) -> Iterator[Chunk]:
        """A whole answer as the events its stream would have had (one parser for both)."""
        ...

    def refused_fields(self, error: ProxyError, upstream: UpstreamRequest) -> list[str]:
        """What of `upstream` a 400 refuses (names for `Refusals`); [] when it is not that."""
        ...

    async def count_tokens(self, client: OpenAIClient, request: dict[str, Any],
                           settings: ProviderSettings, build: Build) -> int | None:
        """The upstream's own count of a count_tokens request's input, where this API has
        one at this provider; None: the proxy counts itself. Failures raise ProxyError."""
        ...


async def no_count(client: OpenAIClient, request: dict[str, Any], settings: ProviderSettings,
                   build: Build) -> int | None:
    """count_tokens for an API without one (OpenAI's APIs have none)."""
    return None


def with_text_calls(upstream: UpstreamRequest, settings: ProviderSettings) -> UpstreamRequest:
    """The request, told what to read as tool calls from its answer's text: the markup
    families on for its model (`*_TOOL_CALL_PREFIXES`), when it offers tools. With the
    tool-call guard repairing (TOOL_GUARD=repair), a call read from text passes the guard's
    own check (the tool's schema, and the repair ladder); otherwise `declared_check`'s."""
    if not upstream.body.get("tools"):
        return upstream
    model = str(upstream.body.get("model") or "")
    formats = settings.tool_call_markup(model)
    tools = declared_tools(upstream.body) if formats else {}
    if tools:
        check = OfferedTools(tools).accept if settings.guard_mode == "repair" else None
        upstream.text_calls = TextCallPlan(
            tools, formats, in_reasoning=settings.reads_reasoning_tool_calls(model), check=check)
    return upstream


def _refused_common(error: ProxyError, upstream: UpstreamRequest) -> list[str] | None:
    """The optional fields every OpenAI-format API may refuse; None when the error is no
    400 at all (nothing to learn)."""
    if error.status != 400:
        return None
    return refused_optional_fields(error.message, upstream.body)


class ChatCompletions:
    """OpenAI-compatible `/chat/completions`: every provider's default."""

    name = "chat"
    label = ""
    path = "/chat/completions"
    wire = CHAT_WIRE

    def serves(self, model: str, settings: ProviderSettings) -> bool:
        return True

    def build(self, request: dict[str, Any], settings: ProviderSettings,
              build: Build) -> UpstreamRequest:
        refuses = build.refusals.of(build.model)
        rewrites = build.turns is not None and any(refuses(name) for name in REWRITING)
        upstream = convert_request(request, settings, model=build.model, is_ours=build.is_ours,
                                   opaque_for=build.opaque_for,
                                   without_reasoning=refuses(REASONING),
                                   structured=structured_mode(refuses),
                                   cache_key=build.cache_key,
                                   slot=None if rewrites else build.turns)
        drop_refused(upstream.body, refuses)
        return with_text_calls(upstream, settings)

    def parser(self, upstream: UpstreamRequest) -> WireParser:
        return reading_text_calls(chat_completions.ChatCompletionsParser(
            think_tags=upstream.think_tags, leading_think_tags=True,
            show_inline_thinking=upstream.thinking), upstream.text_calls)

    async def send_stream(self, client: OpenAIClient,
                          upstream: UpstreamRequest) -> UpstreamStream:
        if upstream.buffered:
            return await client.open_buffered_stream(upstream.body)
        return await client.open_stream(upstream.body)

    async def send_once(self, client: OpenAIClient, upstream: UpstreamRequest) -> Chunk:
        return await client.complete(upstream.body)

    def events_of(self, answer: Chunk) -> Iterator[Chunk]:
        return chat_completions.buffered_chunks(answer)

    count_tokens = staticmethod(no_count)

    def refused_fields(self, error: ProxyError, upstream: UpstreamRequest) -> list[str]:
        common = _refused_common(error, upstream)
        if common is None or common:
            return common or []
        structured = refused_structured(error.message, upstream.body)
        if structured:
            return structured
        if upstream.extras and names_added_field(error.message, upstream.extras):
            return [REASONING]
        return []


class Responses:
    """OpenAI's `/responses`, for REASONING_MODEL_PREFIXES models (unless
    RESPONSES_API=false): their reasoning comes back only here."""

    name = "responses"
    label = " api=responses"
    path = "/responses"
    wire = responses.WIRE

    def serves(self, model: str, settings: ProviderSettings) -> bool:
        return responses.uses_responses(model, settings)

    def build(self, request: dict[str, Any], settings: ProviderSettings,
              build: Build) -> UpstreamRequest:
        refuses = build.refusals.of(build.model)
        upstream = responses.convert_request(
            request, settings, model=build.model, opaque_for=build.opaque_for,
            without_reasoning=refuses(REASONING), without_summary=refuses(SUMMARY),
            cache_key=build.cache_key)
        apply_responses_structured_output(upstream.body, request)
        drop_refused(upstream.body, refuses)
        return with_text_calls(upstream, settings)

    def parser(self, upstream: UpstreamRequest) -> WireParser:
        return reading_text_calls(responses.ResponsesParser(), upstream.text_calls)

    async def send_stream(self, client: OpenAIClient,
                          upstream: UpstreamRequest) -> UpstreamStream:
        return await client.open_response_stream(upstream.body)

    async def send_once(self, client: OpenAIClient, upstream: UpstreamRequest) -> Chunk:
        return await client.respond(upstream.body)

    def events_of(self, answer: Chunk) -> Iterator[Chunk]:
        return responses.response_events(answer)

    count_tokens = staticmethod(no_count)

    def refused_fields(self, error: ProxyError, upstream: UpstreamRequest) -> list[str]:
        common = _refused_common(error, upstream)
        if common is None or common:
            return common or []
        return responses.refused_fields(error.message, upstream.extras)


class Messages:
    """The Anthropic Messages API of another provider (`api = "messages"`): the client's
    request sanitised for the endpoint's profile (upstream/messages.py)."""

    name = "messages"
    label = " api=messages"
    path = messages.PATH
    wire = messages.WIRE

    def serves(self, model: str, settings: ProviderSettings) -> bool:
        return settings.upstream_api == "messages"

    def build(self, request: dict[str, Any], settings: ProviderSettings,
              build: Build) -> UpstreamRequest:
        return with_text_calls(messages.convert_request(
            request, settings, model=build.model,
            refuses=build.refusals.of(build.model),
            opaque_for=build.opaque_for, betas=build.betas), settings)

    def parser(self, upstream: UpstreamRequest) -> WireParser:
        return reading_text_calls(messages.MessagesParser(), upstream.text_calls)

    async def send_stream(self, client: OpenAIClient,
                          upstream: UpstreamRequest) -> UpstreamStream:
        return await client.open_message_stream(upstream.body, upstream.headers)

    async def send_once(self, client: OpenAIClient, upstream: UpstreamRequest) -> Chunk:
        return await client.message(upstream.body, upstream.headers)

    def events_of(self, answer: Chunk) -> Iterator[Chunk]:
        return messages.message_events(answer)

    def refused_fields(self, error: ProxyError, upstream: UpstreamRequest) -> list[str]:
        if error.status != 400:
            return []
        return messages.refused_fields(error.message, upstream)

    async def count_tokens(self, client: OpenAIClient, request: dict[str, Any],
                           settings: ProviderSettings, build: Build) -> int | None:
        """The endpoint's `/v1/messages/count_tokens` where its profile has one; an endpoint
        that answers it with 404, 405 or 501 is counted by the proxy from then on."""
        upstream = messages.count_request(request, settings, model=build.model,
                                          refuses=build.refusals.of(build.model),
                                          opaque_for=build.opaque_for,
                                          betas=build.betas)
        if upstream is None:
            return None
        try:
            answer = await client.count_message_tokens(upstream.body, upstream.headers)
        except ProxyError as error:
            if error.status in (404, 405, 501):
                build.refusals.remember(build.model, messages.COUNT_TOKENS)
            raise
        counted = answer.get("input_tokens")
        return counted if isinstance(counted, int) and counted >= 0 else None


CHAT: UpstreamAPI = ChatCompletions()
RESPONSES: UpstreamAPI = Responses()
MESSAGES: UpstreamAPI = Messages()
APIS: dict[str, UpstreamAPI] = {api.name: api for api in (CHAT, RESPONSES, MESSAGES)}
"""Every API by name (`UpstreamRequest.api`)."""


def api_for(model: str, settings: ProviderSettings) -> UpstreamAPI:
    """The API `model` is sent to at this provider: the provider's configured one
    (`api = "messages"`), else /responses for the models it serves, else /chat/completions."""
    for api in (MESSAGES, RESPONSES):
        if api.serves(model, settings):
            return api
    return CHAT


def api_of(upstream: UpstreamRequest) -> UpstreamAPI:
    """The API an upstream request was built for."""
    return APIS[upstream.api]
