"""The Anthropic Messages API of other providers (`POST {base}/v1/messages`): what each
endpoint takes, the request as the client sent it minus what the endpoint refuses or misreads,
and its event stream parsed into the proxy's one delta model.

DeepSeek, Kimi/Moonshot, GLM/Z.AI, MiniMax, DashScope and the local servers (vLLM, SGLang,
llama-server, Ollama) answer the Messages API themselves, each with its own faults (their
sources are beside each profile below and in tests/test_messages_upstream.py; the user's page
is docs/messages-upstreams.md). The request is the client's body, sanitised per profile
(`MESSAGES_PROFILES`): top-level fields outside the profile's list are left out, and so are
`anthropic-beta` values outside its allow-list, the newer nested fields (`cache_control.scope`,
`defer_loading` / `tool_reference`, `input_examples`, `output_config.task_budget`,
`thinking.display`), server tools and Claude Code's billing-header system block. What an
endpoint still refuses at run time is learned (`refused_fields`, kept by `Refusals` in the
state store) and left out from then on.

Thinking: the upstream's `signature` (and a `redacted_thinking` block's `data`) rides in the
proxy's signed envelope as an opaque item, bound to this provider, model and key; it goes back
only there. A thinking block from anywhere else goes to a Messages endpoint per its profile:
dropped, or with `signature: ""` (Kimi, DeepSeek), and after a 400 "Invalid `signature` in
`thinking` block" it is dropped for that model (`FOREIGN_THINKING`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion.deltas import (
    Delta,
    Finish,
    OpaqueReasoning,
    ReasoningText,
    Text,
    ToolCall,
    UpstreamFailure,
    Usage,
)
from claude_proxy.conversion.messages import is_billing_header, tool_reference_text
from claude_proxy.conversion.reasoning import OpaqueFor
from claude_proxy.conversion.request_converter import UpstreamRequest, anonymous_user
from claude_proxy.conversion.tools import is_server_tool, referenced_tool_names
from claude_proxy.upstream.wire import Wire

Event = dict[str, Any]
Block = dict[str, Any]

PATH = "/v1/messages"
ANTHROPIC_VERSION = "2023-06-01"
"""The only version of the Messages API (DeepSeek and Ollama ignore the header)."""

SIGNATURE = "anthropic_signature"
"""The opaque item that carries an upstream thinking block's own `signature`."""
REDACTED = "anthropic_redacted_thinking"
"""The opaque item that carries an upstream `redacted_thinking` block's `data`."""

# Names learned by `Refusals` (per provider and model), besides top-level field names.
FOREIGN_THINKING = "thinking:foreign"
"""A thinking block not minted by this endpoint was refused: such blocks are dropped."""
BETAS = "anthropic-beta"
"""The `anthropic-beta` header as a whole was refused (no value named)."""
BETA = "anthropic-beta:"
"""`anthropic-beta:<value>`: one value refused."""
SCOPE, DEFER, REFERENCE = "cache_control.scope", "defer_loading", "tool_reference"
EXAMPLES, TASK_BUDGET, DISPLAY = "input_examples", "output_config.task_budget", "thinking.display"
SERVER_TOOLS, BILLING = "server_tools", "billing_header"
CACHE = "cache_control"
"""Every breakpoint (an endpoint that refuses `cache_control` wherever it is)."""
NESTED = (SCOPE, DEFER, REFERENCE, EXAMPLES, TASK_BUDGET, DISPLAY, SERVER_TOOLS, BILLING)
"""Everything below the top level the proxy may leave out, by its refusal name."""

STANDARD_FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "stream", "stop_sequences", "temperature",
    "top_p", "top_k", "metadata", "tools", "tool_choice", "thinking", "output_config"})
"""The request fields every Anthropic-compatible endpoint documents (DeepSeek's table,
api-docs.deepseek.com/guides/anthropic_api.md; MiniMax's, platform.minimax.io text-anthropic-api;
Ollama's anthropic-compatibility page; all read 2026-11-28); newer ones (`context_management`,
`service_tier`, `speed`, `container`, the safeguard and advisor fields, ...) are left out."""

SAFE_BETAS = frozenset({"interleaved-thinking-2025-05-14",
                        "fine-grained-tool-streaming-2025-05-14"})
"""Beta values passed to a hosted endpoint by default: they ask for nothing the endpoint must
know (thinking between tool calls, unbuffered tool arguments). Claude Code's others
(`advanced-tool-use-*`, `context-management-*`, ...) turned Kimi's answers into 400 "Invalid
request Error" (MoonshotAI/Kimi-K2.5#5) and Z.AI's tool list into deferred tools
(zai-org/feedback#172)."""

ForeignThinking = Literal["drop", "empty_signature", "text"]
Refuses = Callable[[str], bool]


@dataclass(frozen=True)
class MessagesProfile:
    """What one family of Messages endpoints takes."""

    auth: tuple[str, ...] = ("x-api-key", "bearer")
    """How the key is sent: `x-api-key`, `Authorization: Bearer`, or both (DeepSeek takes
    either, Bearer winning; Z.AI's setup uses Bearer, bigmodel's curl x-api-key)."""
    fields: frozenset[str] | None = STANDARD_FIELDS
    """Top-level request fields sent (None: all)."""
    betas: frozenset[str] | None = SAFE_BETAS
    """`anthropic-beta` values sent (None: all)."""
    strip: frozenset[str] = frozenset(NESTED)
    """Nested fields left out (NESTED names)."""
    foreign_thinking: ForeignThinking = "drop"
    """A thinking block another endpoint minted: left out, sent with `signature: ""`, or
    sent as text."""
    adaptive: bool = True
    """Takes `thinking: {"type": "adaptive"}`; else it becomes `enabled` with a budget."""
    thinks_unasked: bool = False
    """Thinks when the request has no `thinking` field, so `disabled` is sent then."""


HOSTED = MessagesProfile()
PASS_THROUGH = MessagesProfile(auth=("x-api-key",), fields=None, betas=None,
                               strip=frozenset(), foreign_thinking="drop")
"""`generic`: an endpoint no profile knows (Anthropic itself, another proxy): the body as the
client sent it; only what it refuses is learned and left out."""
MESSAGES_PROFILES: dict[str, MessagesProfile] = {
    # "Unsupported model names ... thinking is on by default" and a placeholder thinking block
    # is accepted (api-docs.deepseek.com/guides/thinking_mode.md; musistudio/
    # claude-code-router#1639 [unverified]); `thinking.type` is enabled|disabled only.
    "deepseek": MessagesProfile(foreign_thinking="empty_signature", adaptive=False,
                                thinks_unasked=True),
    # Unsigned thinking is accepted only as `signature: ""` (anomalyco/opencode#44713);
    # signatures are not validated (NousResearch/hermes-agent#66948).
    "kimi": MessagesProfile(foreign_thinking="empty_signature"),
    "glm": HOSTED,
    "minimax": HOSTED,
    "dashscope": MessagesProfile(adaptive=False),
    "vllm": HOSTED,
    "llamacpp": HOSTED,
    "ollama": HOSTED,
    "generic": PASS_THROUGH,
}


COUNTS_TOKENS = frozenset({"vllm", "llamacpp"})
"""Profiles whose servers document `POST /v1/messages/count_tokens`: vLLM (vllm-project/vllm
#35588), SGLang (which runs with the vllm profile; docs.sglang.io anthropic_api) and
llama-server (its tools/server/README.md). Ollama documents none; the hosted endpoints'
support is unverified, so they are counted by the proxy."""
COUNT_PATH = "/count_tokens"
COUNT_TOKENS = "count_tokens"
"""The refusal name of an endpoint without a working count (404, 405, 501)."""


def count_request(request: dict[str, Any], settings: ProviderSettings, *, model: str,
                  refuses: Refuses = lambda name: False,
                  opaque_for: OpaqueFor = lambda block: [],
                  betas: str | None = None) -> UpstreamRequest | None:
    """The count_tokens request for this endpoint (the Messages request without
    `max_tokens` and `stream`), or None where the proxy counts itself."""
    if settings.provider_name not in COUNTS_TOKENS or refuses(COUNT_TOKENS):
        return None
    upstream = convert_request({**request, "max_tokens": 1}, settings, model=model,
                               refuses=refuses, opaque_for=opaque_for, betas=betas)
    for name in ("max_tokens", "stream"):
        upstream.body.pop(name, None)
    return upstream


def profile_of(settings: ProviderSettings) -> MessagesProfile:
    return MESSAGES_PROFILES.get(settings.provider_name, HOSTED)


def endpoint(settings: ProviderSettings) -> str:
    """`{base}/v1/messages`, the base URL being the one the provider documents for Anthropic
    SDKs (e.g. `https://api.deepseek.com/anthropic`)."""
    return settings.openai_base_url + PATH


def auth_headers(settings: ProviderSettings) -> dict[str, str]:
    """The headers every request to the endpoint carries: its key per the profile, and
    `anthropic-version`."""
    headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
    key = settings.openai_api_key.get_secret_value()
    if key:
        kinds = profile_of(settings).auth
        if "x-api-key" in kinds:
            headers["x-api-key"] = key
        if "bearer" in kinds:
            headers["authorization"] = f"Bearer {key}"
    return headers


# ---------------------------------------------------------------- request


def convert_request(request: dict[str, Any], settings: ProviderSettings, *, model: str,
                    refuses: Refuses = lambda name: False,
                    opaque_for: OpaqueFor = lambda block: [],
                    betas: str | None = None) -> UpstreamRequest:
    """The Messages request for a validated client request: the client's body with the
    route's `model`, minus what the profile and the learned refusals (`refuses`) leave out.
    `opaque_for` gives a thinking block's opaque items when this provider, model and key
    minted it; `betas` is the client's `anthropic-beta` header."""
    profile = profile_of(settings)
    strip = profile.strip | {name for name in NESTED if refuses(name)}
    body = {name: value for name, value in request.items()
            if (profile.fields is None or name in profile.fields) and not refuses(name)}
    body["model"] = model
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        # Claude Code's user_id names a device, an account and a session: hashed, as for
        # every upstream.
        body["metadata"] = {**metadata, "user_id": anonymous_user(metadata["user_id"])}
    if BILLING in strip and isinstance(body.get("system"), list):
        body["system"] = [block for block in body["system"] if not is_billing_header(block)]
    foreign: ForeignThinking = "drop" if refuses(FOREIGN_THINKING) else profile.foreign_thinking
    body["messages"] = [_message(message, opaque_for, foreign, strip)
                        for message in body.get("messages") or []]
    if "tools" in body:
        _sanitise_tools(body, request, strip)
    _sanitise_settings(body, profile, strip)
    _clamp_output(body, settings.provider_max_output_tokens)
    if refuses(CACHE) or settings.prompt_cache == "off":
        _strip_markers(body, whole=True)
    elif SCOPE in strip:
        _strip_markers(body, whole=False)
    headers = {}
    sent = _betas(betas, profile, refuses)
    if sent:
        headers["anthropic-beta"] = sent
    thinking = body.get("thinking")
    wanted = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    return UpstreamRequest(body, thinking=wanted, api="messages", headers=headers)


def _betas(header: str | None, profile: MessagesProfile, refuses: Refuses) -> str:
    if not header or refuses(BETAS):
        return ""
    values = [value.strip() for value in header.split(",") if value.strip()]
    return ",".join(value for value in values
                    if (profile.betas is None or value in profile.betas)
                    and not refuses(BETA + value))


def _message(message: dict[str, Any], opaque_for: OpaqueFor, foreign: ForeignThinking,
             strip: frozenset[str]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks: list[Block] = []
    for block in content:
        if not isinstance(block, dict):
            blocks.append(block)
        elif block.get("type") in ("thinking", "redacted_thinking"):
            blocks.extend(_thinking(block, opaque_for, foreign))
        elif block.get("type") == "tool_result" and REFERENCE in strip:
            blocks.append(_without_references(block))
        elif SERVER_TOOLS in strip and _is_server_block(block):
            blocks.extend(_server_block_text(block))
        else:
            blocks.append(block)
    if not blocks:
        blocks = [{"type": "text", "text": "(thinking left out)"}]
    return {**message, "content": blocks}


def _is_server_block(block: Block) -> bool:
    """A server tool's call or result (`server_tool_use`, `advisor_tool_result`, ...): an
    endpoint that runs no server tools knows neither."""
    kind = str(block.get("type", ""))
    return kind == "server_tool_use" or (kind.endswith("_tool_result") and kind != "tool_result")


def _server_block_text(block: Block) -> list[Block]:
    """What a server tool's result said, as text (the advisor's plan, which the answer after
    it follows); its call, and results without text, are left out."""
    content = block.get("content")
    text = content.get("text") if isinstance(content, dict) else None
    return [{"type": "text", "text": text}] if isinstance(text, str) and text else []


def _thinking(block: Block, opaque_for: OpaqueFor, foreign: ForeignThinking) -> list[Block]:
    """A thinking block as this endpoint takes it: with its own signature when it minted it,
    else per the profile (`foreign`)."""
    items = opaque_for(block) if block.get("type") == "thinking" else []
    own: list[Block] = []
    for item in items:  # in the order the upstream sent them (one block of ours may hold
        # a thinking block and the redacted ones after it)
        if item.get("type") == REDACTED:
            own.append({"type": "redacted_thinking", "data": item.get("data", "")})
        elif item.get("type") == SIGNATURE and not any(b["type"] == "thinking" for b in own):
            own.append({**block, "signature": item.get("signature", "")})
    if own:
        return own
    text = block.get("thinking")
    if block.get("type") != "thinking" or not isinstance(text, str) or not text:
        return []
    if foreign == "empty_signature":
        return [{"type": "thinking", "thinking": text, "signature": ""}]
    if foreign == "text":
        return [{"type": "text", "text": text}]
    return []


def _without_references(block: Block) -> Block:
    inner = block.get("content")
    if not isinstance(inner, list) or not any(
            isinstance(item, dict) and item.get("type") == "tool_reference" for item in inner):
        return block
    return {**block, "content": [
        {"type": "text", "text": tool_reference_text(item)}
        if isinstance(item, dict) and item.get("type") == "tool_reference" else item
        for item in inner]}


def _sanitise_tools(body: dict[str, Any], request: dict[str, Any],
                    strip: frozenset[str]) -> None:
    """Server tools, deferred tools no `tool_reference` loaded, and `input_examples` left
    out as the profile says (an endpoint without tool search sees the loaded tools only)."""
    loaded = referenced_tool_names(request.get("messages") or []) if DEFER in strip else set()
    tools = []
    for tool in body["tools"] or []:
        if not isinstance(tool, dict):
            continue
        if SERVER_TOOLS in strip and is_server_tool(tool):
            continue
        if DEFER in strip and "defer_loading" in tool:
            if tool["defer_loading"] and tool.get("name") not in loaded:
                continue
            tool = {k: v for k, v in tool.items() if k != "defer_loading"}
        if EXAMPLES in strip and "input_examples" in tool:
            tool = {k: v for k, v in tool.items() if k != "input_examples"}
        tools.append(tool)
    if tools:
        body["tools"] = tools
    else:
        body.pop("tools")
        body.pop("tool_choice", None)


def _sanitise_settings(body: dict[str, Any], profile: MessagesProfile,
                       strip: frozenset[str]) -> None:
    """`thinking` and `output_config` in the forms the endpoint takes."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        if DISPLAY in strip and "display" in thinking:
            thinking = {k: v for k, v in thinking.items() if k != "display"}
        if thinking.get("type") == "adaptive" and not profile.adaptive:
            budget = max(1024, int(body.get("max_tokens") or 0) // 2)
            thinking = {"type": "enabled", "budget_tokens": budget}
        body["thinking"] = thinking
    elif thinking is None and profile.thinks_unasked:
        body["thinking"] = {"type": "disabled"}
    config = body.get("output_config")
    if TASK_BUDGET in strip and isinstance(config, dict) and "task_budget" in config:
        config = {k: v for k, v in config.items() if k != "task_budget"}
        if config:
            body["output_config"] = config
        else:
            body.pop("output_config")


def _clamp_output(body: dict[str, Any], limit: int | None) -> None:
    """`max_tokens` down to PROVIDER_MAX_OUTPUT_TOKENS when that is set, a thinking budget
    kept below it (the Messages API refuses a budget that is not)."""
    requested = body.get("max_tokens")
    if not limit or not isinstance(requested, int) or requested <= limit:
        return
    body["max_tokens"] = limit
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int) and (
            thinking["budget_tokens"] >= limit):
        body["thinking"] = {**thinking, "budget_tokens": max(1024, limit // 2)}


def _strip_markers(body: dict[str, Any], *, whole: bool) -> None:
    """`cache_control.scope` (Claude Code's global cache scope) out of every breakpoint, or
    (`whole`) every breakpoint, in copies: the client's body is left as it was. Breakpoints
    sit on system blocks, tools, content blocks and the blocks of a tool result."""
    for key in ("system", "tools"):
        if isinstance(body.get(key), list) and _has_marker(body[key], whole):
            body[key] = [_unmarked(block, whole) for block in body[key]]
    messages = body.get("messages") or []
    if any(_has_marker(message.get("content"), whole) for message in messages):
        body["messages"] = [{**message, "content": [_unmarked(block, whole)
                                                    for block in message["content"]]}
                            if isinstance(message.get("content"), list) else message
                            for message in messages]


def _marked(block: Any, whole: bool) -> bool:
    marker = block.get("cache_control") if isinstance(block, dict) else None
    return isinstance(marker, dict) and (whole or "scope" in marker)


def _has_marker(blocks: Any, whole: bool = False) -> bool:
    """Whether a list of blocks (system, tools, a message's content) has a breakpoint with a
    scope (`whole`: any breakpoint), a tool result's own blocks included."""
    if not isinstance(blocks, list):
        return False
    return any(_marked(block, whole) or (isinstance(block, dict) and isinstance(
        block.get("content"), list) and any(_marked(inner, whole) for inner in block["content"]))
        for block in blocks)


def _unmarked(block: Any, whole: bool) -> Any:
    if not isinstance(block, dict):
        return block
    copy = {key: value for key, value in block.items() if key != "cache_control"}
    marker = block.get("cache_control")
    if isinstance(marker, dict) and not whole:
        copy["cache_control"] = {k: v for k, v in marker.items() if k != "scope"}
    if isinstance(block.get("content"), list):
        copy["content"] = [_unmarked(inner, whole) for inner in block["content"]]
    return copy


# ---------------------------------------------------------------- refusals

_SIGNATURE = re.compile(r"signature", re.IGNORECASE)
_BETA_VALUE = re.compile(r"[a-z][a-z0-9-]*-20\d\d-\d\d-\d\d")
_GENERIC = re.compile(r"^\s*invalid request( error)?\.?\s*$", re.IGNORECASE)
_ABOUT_A_FIELD = re.compile(r"argument|parameter|field|propert|not permitted|unrecognized|"
                            r"unknown|extra|unsupported|not support|invalid|unexpected",
                            re.IGNORECASE)


_CORE = frozenset({"model", "messages", "max_tokens", "system", "tools", "stream"})
"""Fields a refusal never takes away: without them there is no request."""


def refused_fields(message: str, upstream: UpstreamRequest) -> list[str]:
    """What a 400 refuses of what was sent: foreign thinking (a signature error), beta values
    or the header, a newer nested field it names, a top-level field it names; for Kimi's bare
    "Invalid request Error" (MoonshotAI/Kimi-K2.5#5, farion1231/cc-switch#2941) every newer
    feature the request carried, which is what such a 400 was seen to mean."""
    body = upstream.body
    if _SIGNATURE.search(message) and "thinking" in message.lower() and _has_thinking(body):
        return [FOREIGN_THINKING]
    betas = upstream.headers.get("anthropic-beta", "")
    named = [BETA + value for value in _BETA_VALUE.findall(message) if value in betas]
    if named:
        return named
    if betas and "anthropic-beta" in message.lower():
        return [BETAS]
    present = _newer_features(body, betas)
    if _GENERIC.match(message):
        return present
    if not _ABOUT_A_FIELD.search(message):
        return []
    nested = [name for name in present if name != BETAS
              and re.search(rf"\b{re.escape(name.rsplit('.', 1)[-1])}\b", message)]
    if nested:
        return nested
    return [name for name in body if name not in _CORE
            and re.search(rf"\b{re.escape(name)}\b", message)]


def _has_thinking(body: dict[str, Any]) -> bool:
    return any(isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")
               for message in body.get("messages") or []
               if isinstance(message.get("content"), list) for block in message["content"])


def _newer_features(body: dict[str, Any], betas: str) -> list[str]:
    """The newer things in a request an endpoint may not know."""
    found = [BETAS] if betas else []
    tools = [tool for tool in body.get("tools") or [] if isinstance(tool, dict)]
    if any("defer_loading" in tool for tool in tools):
        found.append(DEFER)
    if any("input_examples" in tool for tool in tools):
        found.append(EXAMPLES)
    if any(is_server_tool(tool) for tool in tools):
        found.append(SERVER_TOOLS)
    if referenced_tool_names(body.get("messages") or []):
        found.append(REFERENCE)
    if _has_marker(body.get("system")) or any(
            _has_marker(message.get("content")) for message in body.get("messages") or []):
        found.append(SCOPE)
    thinking, config = body.get("thinking"), body.get("output_config")
    if isinstance(thinking, dict) and "display" in thinking:
        found.append(DISPLAY)
    if isinstance(config, dict) and "task_budget" in config:
        found.append(TASK_BUDGET)
    return found


# ---------------------------------------------------------------- response

_STATUS_BY_TYPE = {"invalid_request_error": 400, "authentication_error": 401,
                   "billing_error": 402, "permission_error": 403, "not_found_error": 404,
                   "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                   "timeout_error": 504, "overloaded_error": 529}


def error_of(event: Event) -> dict[str, Any] | None:
    """An `error` event's error, with its HTTP status as `code` (errors.error_from_payload)."""
    if event.get("type") != "error":
        return None
    error = event.get("error")
    if not isinstance(error, dict):
        return {"message": str(error or "upstream stream failed"), "code": 502}
    status = _STATUS_BY_TYPE.get(str(error.get("type")), 502)
    return {"message": str(error.get("message") or "upstream stream failed"), "code": status}


def _is_preamble(event: Event) -> bool:
    return event.get("type") in ("message_start", "ping")


def _ends(event: Event) -> bool:
    return event.get("type") == "message_stop"


def chat_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Messages usage in Chat Completions' names (what conversion/usage.py reads): the
    prompt counts cache reads and writes, as OpenAI's does. An endpoint that reports no
    input (0 at `message_start`: SGLang before #25876, MiniMax) leaves `prompt_tokens` out,
    so the proxy's estimate stands."""
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    converted: dict[str, Any] = {"completion_tokens": _int(usage.get("output_tokens")),
                                 "cache_read_input_tokens": read,
                                 "cache_creation_input_tokens": written}
    prompt = _int(usage.get("input_tokens")) + read + written
    if prompt:
        converted["prompt_tokens"] = prompt
    return converted


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class MessagesParser:
    """One Messages stream's events → deltas. Usage is merged across `message_start` and
    `message_delta` (whose counts are cumulative); `model` is the model the endpoint says
    answered (doctor compares it with the one asked for)."""

    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    _unsigned: int | None = None
    """The index of a thinking block that has had no signature yet."""
    _tool_blocks: set[int] = field(default_factory=set)
    """The indices of the tool_use blocks not yet stopped."""

    def parse(self, event: Event) -> list[Delta]:
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "content_block_stop":
            return self._stop(event)
        if kind == "message_delta":
            return self._message_delta(event)
        if kind == "message_start":
            message = event.get("message") or {}
            self.model = message.get("model")
            return self._usage(message.get("usage"))
        if kind == "error":
            return [UpstreamFailure(error_of(event))]
        return []

    def flush(self) -> list[Delta]:
        return []

    def _start(self, event: Event) -> list[Delta]:
        index = event.get("index", 0)
        block = event.get("content_block") or {}
        kind = block.get("type")
        if kind == "text":
            return [Text(block["text"])] if block.get("text") else []
        if kind == "thinking":
            deltas: list[Delta] = []
            if block.get("thinking"):
                deltas.append(ReasoningText(block["thinking"]))
            if block.get("signature"):
                deltas.append(OpaqueReasoning({"type": SIGNATURE,
                                               "signature": block["signature"]}))
            else:
                self._unsigned = index
            return deltas
        if kind == "redacted_thinking":
            return [OpaqueReasoning({"type": REDACTED, "data": block.get("data", "")})]
        if kind == "tool_use":
            self._tool_blocks.add(index)
            return [ToolCall(index, id=block.get("id") or "", name=block.get("name") or "")]
        return []

    def _delta(self, event: Event) -> list[Delta]:
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            return [Text(delta["text"])] if delta.get("text") else []
        if kind == "input_json_delta":
            partial = delta.get("partial_json")
            return [ToolCall(event.get("index", 0), arguments=partial)] if partial else []
        if kind == "thinking_delta":
            return [ReasoningText(delta["thinking"])] if delta.get("thinking") else []
        if kind == "signature_delta":
            self._unsigned = None
            return [OpaqueReasoning({"type": SIGNATURE, "signature": delta.get("signature")})]
        return []

    def _stop(self, event: Event) -> list[Delta]:
        """A tool call's block stopped: the call is complete. A thinking block that ended
        unsigned (DeepSeek's streams, QuantumNous/new-api#4762) is still this endpoint's own:
        it goes back to it with `signature: ""`."""
        index = event.get("index", 0)
        if index in self._tool_blocks:
            self._tool_blocks.discard(index)
            return [ToolCall(index, last=True)]
        if self._unsigned is None or index != self._unsigned:
            return []
        self._unsigned = None
        return [OpaqueReasoning({"type": SIGNATURE, "signature": ""})]

    def _message_delta(self, event: Event) -> list[Delta]:
        deltas = self._usage(event.get("usage"))
        delta = event.get("delta") or {}
        reason = delta.get("stop_reason")
        if reason:
            deltas.append(Finish(str(reason), delta.get("stop_sequence")))
        return deltas

    def _usage(self, usage: Any) -> list[Delta]:
        if not isinstance(usage, dict):
            return []
        self.usage.update({key: value for key, value in usage.items() if value is not None
                           and not (key == "input_tokens" and value == 0)})
        return [Usage(chat_usage(self.usage))]


def message_events(message: dict[str, Any]) -> Iterator[Event]:
    """A whole (non-streamed) Message as the events its stream would have had, so one parser
    serves both."""
    if message.get("type") == "error":
        yield message
        return
    yield {"type": "message_start", "message": {**message, "content": []}}
    for index, block in enumerate(message.get("content") or []):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use":
            yield {"type": "content_block_start", "index": index,
                   "content_block": {**block, "input": {}}}
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta",
                             "partial_json": _json(block.get("input"))}}
        else:
            yield {"type": "content_block_start", "index": index, "content_block": block}
        yield {"type": "content_block_stop", "index": index}
    yield {"type": "message_delta", "usage": message.get("usage"),
           "delta": {"stop_reason": message.get("stop_reason"),
                     "stop_sequence": message.get("stop_sequence")}}
    yield {"type": "message_stop"}


def _json(value: Any) -> str:
    return orjson.dumps(value if value is not None else {}).decode()


WIRE = Wire(_is_preamble, error_of, message_events, _ends)
