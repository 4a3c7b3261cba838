"""The OpenAI Responses API (`POST /responses`): request builder and event parser.

OpenAI's reasoning models return their reasoning only here: summaries (shown as thinking) and
an encrypted reasoning item that must come back on the next request for the model to keep its
chain of thought across a tool loop (`store: false`, `include: ["reasoning.encrypted_content"]`).
The request is built from the Anthropic request; the events are parsed into the same internal
deltas as Chat Completions chunks, so the Anthropic side does not know which API answered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from claude_proxy.config.settings import ProviderSettings, matches_prefix
from claude_proxy.conversion.caching import cache_mode, takes_cache_key
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
from claude_proxy.conversion.ids import to_upstream_id
from claude_proxy.conversion.messages import (
    convert_system,
    convert_system_turn,
    convert_user_turn,
    tool_call,
)
from claude_proxy.conversion.reasoning import effective_reasoning
from claude_proxy.conversion.request_converter import (
    UpstreamRequest,
    chat_tool_fields,
    clamp_max_tokens,
    map_model,
    without_media,
)
from claude_proxy.conversion.tools import expand_tool_references
from claude_proxy.upstream.capabilities import REASONING, SUMMARY
from claude_proxy.upstream.wire import Wire

Event = dict[str, Any]
Block = dict[str, Any]

MIN_OUTPUT_TOKENS = 16
"""`max_output_tokens` counts reasoning and must be at least 16 (Claude Code probes with 1)."""
SUMMARY_SEPARATOR = "\n\n"
_PREAMBLE = ("response.created", "response.in_progress", "response.queued")
_STOP_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}
_STATUS_BY_CODE = {"rate_limit_exceeded": 429, "insufficient_quota": 429, "server_error": 500,
                   "invalid_prompt": 400, "context_length_exceeded": 400,
                   "invalid_request_error": 400, "invalid_api_key": 401,
                   "model_not_found": 404, "vector_store_timeout": 504}


def uses_responses(model: str, settings: ProviderSettings) -> bool:
    """REASONING_MODEL_PREFIXES models go to /responses, unless RESPONSES_API=false."""
    return settings.responses_api and matches_prefix(model, settings.model_prefixes)


@dataclass(frozen=True)
class Endpoint:
    url: str
    deployment: str | None
    """Azure: the deployment named in the base URL, which is the `model` of /responses."""


_DEPLOYMENT = re.compile(r"/openai/deployments/([^/]+)")


def endpoint(settings: ProviderSettings) -> Endpoint:
    """`{base}/responses`; on Azure `/openai/v1/responses` of the same host, with the
    deployment of a `/openai/deployments/NAME` base URL as the model."""
    base = settings.openai_base_url
    if settings.is_azure:
        parts = urlsplit(base)
        match = _DEPLOYMENT.search(parts.path)
        if match:
            return Endpoint(f"{parts.scheme}://{parts.netloc}/openai/v1/responses",
                            match.group(1))
    return Endpoint(f"{base}/responses", None)


# ---------------------------------------------------------------- request


OpaqueFor = Callable[[Block], list[dict[str, Any]]]


def convert_request(request: dict[str, Any], settings: ProviderSettings, *,
                    model: str | None = None,
                    opaque_for: OpaqueFor = lambda block: [],
                    without_reasoning: bool = False,
                    without_summary: bool = False,
                    cache_key: str | None = None) -> UpstreamRequest:
    """The /responses body for a validated Anthropic request.

    `model` is the upstream model the router chose (default: the tier mapping; on Azure the
    deployment of the base URL); `opaque_for` gives a thinking block's verified opaque items
    (only those this provider, model and key produced); `without_reasoning` leaves the
    `reasoning` field out and `without_summary` its `summary` (an organisation that may not
    get summaries); `cache_key` is the session's `prompt_cache_key` (no breakpoints here: the
    Responses API caches prefixes on its own).
    """
    model = endpoint(settings).deployment or model or map_model(request["model"], settings)
    request = expand_tool_references(request)  # ToolSearch's results, as it promises them
    body: dict[str, Any] = {"model": model}
    instructions = convert_system(request.get("system"))
    if instructions is not None:
        body["instructions"] = instructions
    source = request["messages"] if settings.vision else without_media(request["messages"])
    body["input"] = input_items(source, opaque_for)
    tools = chat_tool_fields(request, model, settings)
    if "tools" in tools:
        body["tools"] = [_flat_tool(tool) for tool in tools["tools"]]
        if "tool_choice" in tools:
            body["tool_choice"] = _flat_tool_choice(tools["tool_choice"])
        if "parallel_tool_calls" in tools:
            body["parallel_tool_calls"] = tools["parallel_tool_calls"]
    wanted = effective_reasoning(request, settings, "tools" in body)
    on = wanted.level is not None
    limit = settings.reasoning_max_output_tokens if on else settings.max_output_tokens
    body["max_output_tokens"] = max(MIN_OUTPUT_TOKENS,
                                    clamp_max_tokens(int(request["max_tokens"]), limit))
    extras: dict[str, Any] = {}
    if on and not without_reasoning:
        reasoning: dict[str, Any] = {"effort": wanted.level}
        if not without_summary:
            reasoning["summary"] = "auto"
        body["reasoning"] = extras["reasoning"] = reasoning
    if settings.reasoning_verbosity and not without_reasoning:
        # Named in full in `extras`: a refusal must name `text.verbosity`, not any "text".
        body["text"] = {"verbosity": settings.reasoning_verbosity}
        extras["text.verbosity"] = settings.reasoning_verbosity
    if cache_key and cache_mode(settings, model) != "off" and takes_cache_key(settings):
        body["prompt_cache_key"] = cache_key
    body["store"] = False
    if on:
        # Thinking blocks (and the state they carry) only for a client that wants thinking.
        body["include"] = ["reasoning.encrypted_content"]
    if request.get("stream"):
        body["stream"] = True
    return UpstreamRequest(body, extras=extras, thinking=on, api="responses")


def _flat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    flat = {"type": "function", "name": function["name"]}
    if function.get("description"):
        flat["description"] = function["description"]
    flat["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    return flat


def _flat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name", "")}
    return choice


def input_items(messages: list[dict[str, Any]], opaque_for: OpaqueFor) -> list[dict[str, Any]]:
    """The conversation as `input` items, earlier reasoning restored in its place."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "assistant":
            items.extend(assistant_items(content, opaque_for))
        elif role == "system":
            system = convert_system_turn(content)
            if system is not None:
                items.append(system)
        else:
            items.extend(_user_item(chat) for chat in convert_user_turn(content))
    return items


def _user_item(chat: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions user or tool message (from the shared converter) as an item."""
    if chat["role"] == "tool":
        return {"type": "function_call_output", "call_id": chat["tool_call_id"],
                "output": chat["content"]}
    content = chat["content"]
    if isinstance(content, str):
        return {"role": "user", "content": content}
    return {"role": "user", "content": [_input_part(part) for part in content]}


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "image_url":
        return {"type": "input_image", "image_url": part["image_url"]["url"]}
    if part["type"] == "file":
        return {"type": "input_file", **part["file"]}
    return {"type": "input_text", "text": part["text"]}


def assistant_items(content: Any, opaque_for: OpaqueFor) -> list[dict[str, Any]]:
    """One assistant turn in its original order: restored reasoning items where their
    thinking blocks were, text as assistant messages, tool calls as `function_call`s (with
    the `fc_` id the reasoning before them is paired with)."""
    if isinstance(content, str):
        return [{"role": "assistant", "content": content}] if content else []
    items: list[dict[str, Any]] = []
    texts: list[str] = []
    paired: dict[str, str] = {}

    def flush_text() -> None:
        if texts:
            items.append({"role": "assistant", "content": "\n\n".join(texts)})
            texts.clear()

    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "thinking":
            flush_text()
            items.extend(_restored(block, opaque_for, paired))
        elif kind == "text" and isinstance(block.get("text"), str) and block["text"]:
            texts.append(block["text"])
        elif kind == "tool_use":
            flush_text()
            call = tool_call(block)
            item = {"type": "function_call", "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"]}
            if call["id"] in paired:
                item["id"] = paired[call["id"]]
            items.append(item)
    flush_text()
    return items


def _restored(block: Block, opaque_for: OpaqueFor,
              paired: dict[str, str]) -> list[dict[str, Any]]:
    """The reasoning items a thinking block carried; a `function_call` link names the call
    that followed one, whose item id is then sent only beside that reasoning."""
    opaque = opaque_for(block)
    reasoning = [{"type": "reasoning", "id": item["id"],
                  "encrypted_content": item["encrypted_content"], "summary": []}
                 for item in opaque if item.get("type") == "reasoning"
                 and isinstance(item.get("id"), str)
                 and isinstance(item.get("encrypted_content"), str)]
    if reasoning:
        for item in opaque:
            if item.get("type") == "function_call" and isinstance(item.get("id"), str):
                paired[to_upstream_id(str(item.get("call_id", "")))] = item["id"]
    return reasoning


def refused_summary(message: str) -> bool:
    """A 400 that refuses reasoning summaries (an unverified organisation)."""
    return re.search(r"reasoning[ ._]summar", message, re.IGNORECASE) is not None


_REFUSED_REASONING = re.compile(r"reasoning\.effort|text\.verbosity|parameter:? *'?reasoning\b",
                                re.IGNORECASE)


def refused_fields(message: str, extras: dict[str, Any]) -> list[str]:
    """What a 400 refuses of the fields the proxy added: the summary, or the reasoning fields
    (a parameter error naming them; errors about `reasoning` input items are not that)."""
    reasoning = extras.get("reasoning")
    if isinstance(reasoning, dict) and "summary" in reasoning and refused_summary(message):
        return [SUMMARY]
    if extras and _REFUSED_REASONING.search(message):
        return [REASONING]
    return []


# ---------------------------------------------------------------- response


def _usage(usage: Any) -> dict[str, Any] | None:
    """Responses usage in Chat Completions' names (what conversion/usage.py reads)."""
    if not isinstance(usage, dict):
        return None
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return {"prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": input_details.get("cached_tokens", 0)},
            "completion_tokens_details": {
                "reasoning_tokens": output_details.get("reasoning_tokens", 0)}}


def _error_payload(error: Any) -> dict[str, Any]:
    """An error object (`error` event, nested or flat; a failed response's `error`) with an
    HTTP status as its `code`, for errors.error_from_payload."""
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]
    if not isinstance(error, dict):
        return {"message": str(error or "upstream response failed"), "code": 502}
    message = error.get("message") or "upstream response failed"
    status = (_STATUS_BY_CODE.get(str(error.get("code")))
              or _STATUS_BY_CODE.get(str(error.get("type"))) or 502)
    return {"message": str(message), "code": status}


def error_of(event: Event) -> dict[str, Any] | None:
    """The error an event (or a whole non-streamed response) carries, or None."""
    kind = event.get("type")
    if kind == "error":
        return _error_payload(event)
    if kind == "response.failed":
        response = event.get("response") or {}
        return _error_payload(response.get("error") if isinstance(response, dict) else None)
    if event.get("object") == "response" and event.get("status") == "failed":
        return _error_payload(event.get("error"))
    return None


def _is_preamble(event: Event) -> bool:
    return event.get("type") in _PREAMBLE


class ResponsesParser:
    """One response's events → deltas.

    Summary parts are joined by a blank line; the reasoning item's `encrypted_content` is
    taken from `output_item.done` (the copy in `.added` is partial); argument deltas carry the
    item id (`fc_…`), not the call id. A function call straight after a reasoning item is
    linked to it, since OpenAI pairs the two when they come back.
    """

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self._with_arguments: set[str] = set()
        self._in_reasoning = False
        self._last_reasoning: str | None = None

    def parse(self, event: Event) -> list[Delta]:
        kind = event.get("type")
        handler = self._HANDLERS.get(str(kind))
        if handler is not None:
            return handler(self, event)
        error = error_of(event)
        return [UpstreamFailure(error)] if error else []

    def flush(self) -> list[Delta]:
        return []

    def _item_added(self, event: Event) -> list[Delta]:
        item = event.get("item") or {}
        deltas: list[Delta] = []
        linked, self._last_reasoning = self._last_reasoning, None
        if item.get("type") != "reasoning":
            self._in_reasoning = False
        if item.get("type") == "function_call":
            if linked is not None:
                deltas.append(OpaqueReasoning({"type": "function_call", "id": item.get("id"),
                                               "call_id": item.get("call_id")}))
            key = self._keys.setdefault(str(item.get("id")), len(self._keys))
            deltas.append(ToolCall(key, id=str(item.get("call_id") or ""),
                                   name=str(item.get("name") or "")))
        return deltas

    def _item_done(self, event: Event) -> list[Delta]:
        item = event.get("item") or {}
        kind = item.get("type")
        if kind == "reasoning" and isinstance(item.get("encrypted_content"), str):
            self._last_reasoning = str(item.get("id"))
            return [OpaqueReasoning({"type": "reasoning", "id": item.get("id"),
                                     "encrypted_content": item["encrypted_content"]})]
        item_id = str(item.get("id"))
        if kind != "function_call":
            return []
        key = self._keys.setdefault(item_id, len(self._keys))
        arguments = item.get("arguments")
        if item_id in self._with_arguments or not isinstance(arguments, str):
            arguments = ""
        self._with_arguments.add(item_id)
        return [ToolCall(key, arguments=arguments, last=True)]

    def _summary_part(self, event: Event) -> list[Delta]:
        separator = [ReasoningText(SUMMARY_SEPARATOR)] if self._in_reasoning else []
        self._in_reasoning = True
        return list(separator)

    def _reasoning_delta(self, event: Event) -> list[Delta]:
        delta = event.get("delta")
        self._in_reasoning = True
        return [ReasoningText(delta)] if isinstance(delta, str) and delta else []

    def _text_delta(self, event: Event) -> list[Delta]:
        delta = event.get("delta")
        return [Text(delta)] if isinstance(delta, str) and delta else []

    def _arguments_done(self, event: Event) -> list[Delta]:
        """The whole arguments, which some servers send only here (LM Studio: no `.delta`
        before, BerriAI/litellm#25321): taken when no delta came."""
        item_id = str(event.get("item_id"))
        arguments = event.get("arguments")
        if item_id in self._with_arguments or not isinstance(arguments, str) or not arguments:
            return []
        self._with_arguments.add(item_id)
        return [ToolCall(self._keys.setdefault(item_id, len(self._keys)), arguments=arguments)]

    def _arguments_delta(self, event: Event) -> list[Delta]:
        delta = event.get("delta")
        item_id = str(event.get("item_id"))
        self._with_arguments.add(item_id)
        key = self._keys.setdefault(item_id, len(self._keys))
        return [ToolCall(key, arguments=delta)] if isinstance(delta, str) and delta else []

    def _finished(self, event: Event) -> list[Delta]:
        response = event.get("response") or {}
        deltas: list[Delta] = []
        usage = _usage(response.get("usage"))
        if usage is not None:
            deltas.append(Usage(usage))
        details = response.get("incomplete_details") or {}
        reason = details.get("reason") if isinstance(details, dict) else None
        deltas.append(Finish(_STOP_REASONS.get(str(reason), "end_turn")
                             if event.get("type") == "response.incomplete" else "end_turn"))
        return deltas

    _HANDLERS: ClassVar[dict[str, Callable[[ResponsesParser, Event], list[Delta]]]] = {
        "response.output_item.added": _item_added,
        "response.output_item.done": _item_done,
        "response.reasoning_summary_part.added": _summary_part,
        "response.reasoning_summary_text.delta": _reasoning_delta,
        "response.reasoning_text.delta": _reasoning_delta,
        "response.output_text.delta": _text_delta,
        "response.refusal.delta": _text_delta,
        "response.function_call_arguments.delta": _arguments_delta,
        "response.function_call_arguments.done": _arguments_done,
        "response.completed": _finished,
        "response.incomplete": _finished,
    }


def response_events(response: dict[str, Any]) -> Iterator[Event]:
    """A whole (non-streamed) response as the events its stream would have had, so one
    parser serves both."""
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            yield {"type": "response.output_item.added", "item": {**item, "arguments": ""}}
            yield {"type": "response.function_call_arguments.delta", "item_id": item.get("id"),
                   "delta": item.get("arguments") or ""}
        else:
            yield {"type": "response.output_item.added", "item": item}
        if kind == "reasoning":
            for index, part in enumerate(item.get("summary") or []):
                yield {"type": "response.reasoning_summary_part.added", "summary_index": index}
                yield {"type": "response.reasoning_summary_text.delta",
                       "delta": part.get("text", "") if isinstance(part, dict) else ""}
        elif kind == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") in ("output_text", "refusal"):
                    yield {"type": "response.output_text.delta",
                           "delta": part.get("text") or part.get("refusal") or ""}
        yield {"type": "response.output_item.done", "item": item}
    status = response.get("status")
    if status == "failed":
        yield {"type": "response.failed", "response": response}
    else:
        yield {"type": "response.incomplete" if status == "incomplete" else "response.completed",
               "response": response}


WIRE = Wire(_is_preamble, error_of, response_events)

