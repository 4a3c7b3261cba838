"""The input tokens of a request, as the upstream will count them (count_tokens, message_start,
the pre-flight check).

For OpenAI-family models the count is exact: OpenAI's own encodings (o200k_base, cl100k_base),
compiled into the `toktok-rs` wheel so nothing is downloaded at run time, with the chat
format's per-message overhead (3 tokens a message, 3 to prime the reply; OpenAI cookbook "How to
count tokens with tiktoken"). For every other model the upstream's tokenizer is unknown: about
four bytes of the prompt's JSON a token (`plain_estimate`, made at C speed), which
routing/calibration.py then corrects per session with the prompt tokens the upstream really
reported.

Every block type counts: system, messages (text, tool use and results, thinking), tools, images
and documents (a fixed amount each; text documents by their text), and a structured-output
schema (sent as `response_format`, or in the system prompt where the upstream refuses that).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import orjson

from claude_proxy.conversion.census import holds
from claude_proxy.conversion.structured import requested_schema, schema_instruction
from claude_proxy.conversion.usage import estimate_tokens

TOKENS_PER_MEDIA_BLOCK = 1600
TOKENS_PER_MESSAGE = 3
"""OpenAI chat format: `<|start|>{role}<|message|>…<|end|>` around each message."""
REPLY_PRIMING = 3
"""OpenAI chat format: every reply is primed with `<|start|>assistant<|message|>`."""
_SKIPPED_KEYS = frozenset({"type", "id", "tool_use_id", "signature", "cache_control", "data",
                           "media_type", "source"})
_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o",
                   "gpt-oss", "codex")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35")

Counter = Callable[[str], int]


def encoding_name(model: str | None) -> str | None:
    """OpenAI's encoding for an OpenAI-family model id (`openai/` and `azure/` prefixes and
    Ollama tags allowed), else None."""
    if not model:
        return None
    name = model.lower().rsplit("/", 1)[-1]
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    if name.startswith(_CL100K_PREFIXES):
        return "cl100k_base"
    return None


@cache
def _encoder(name: str) -> Counter:
    # toktok: tiktoken-identical counts (checked against bpe-openai, 4.3 M characters of
    # fixtures, no difference), ~8x faster, an 8 MB wheel instead of a 75 MB one and 113 MiB
    # for both tables instead of 167; they load once, on first use. One thread: the count
    # runs inside a request, on its own worker.
    import toktok

    toktok.batch_count([""], name, threads=1)  # an unknown name fails here, once

    def count(text: str) -> int:
        return toktok.batch_count([text], name, threads=1)[0] if text else 0
    return count


def estimate_request_tokens(request: dict[str, Any], model: str | None = None,
                            raw: bytes | None = None) -> int:
    """The request's input tokens for `model` (the upstream model id; None: unknown).
    `raw`: the request's JSON as the client sent it, when the request is that JSON parsed."""
    name = encoding_name(model)
    if name is not None:
        return _exact(request, _encoder(name))
    return plain_estimate(request, raw)


def plain_estimate(request: dict[str, Any], raw: bytes | None = None) -> int:
    """About four bytes of the prompt's JSON a token, images and documents a fixed amount.

    Every request pays for it, and Claude Code sends the whole conversation each time
    (hundreds of KB late in a session), so no byte of the conversation is visited in
    Python: the prompt's size is the length of its JSON (the system prompt, the messages
    and the tools as orjson writes them, or read off the client's own compact JSON, `raw`,
    where it is that), less the base64 payloads (image and PDF data, thinking signatures),
    which are not prompt text and are found by a walk over the blocks, not their text. The
    JSON's own keys and quotes count too (a tool call's id and name are in the upstream's
    prompt as well); the session's calibration corrects the rest."""
    messages = request.get("messages")
    size = _raw_prompt_size(request, raw) if raw is not None else None
    if size is None:
        size = _prompt_size(request)
    schema = requested_schema(request)
    if schema is not None:
        size += len(schema_instruction(schema).encode())
    if not isinstance(messages, list):
        return estimate_tokens(size)
    payload, media = _payloads(messages) if holds(messages, *_PAYLOAD_KINDS) else (0, 0)
    return estimate_tokens(size - payload) + media * TOKENS_PER_MEDIA_BLOCK


_PAYLOAD_KINDS = ("thinking", "redacted_thinking", "image", "document")


PROMPT_FIELDS = ("system", "messages", "tools")


def _prompt_size(request: dict[str, Any]) -> int:
    """The prompt's JSON length, serialized: the tools, the system prompt (a string by its
    text) and the messages."""
    system, tools = request.get("system"), request.get("tools")
    size = len(_serialized(tools)) if tools else 0
    if isinstance(system, str):
        size += len(system.encode())
    elif system:
        size += len(_serialized(system))
    messages = request.get("messages")
    if isinstance(messages, list):
        size += len(_serialized(messages))
    return size


def _raw_prompt_size(request: dict[str, Any], raw: bytes) -> int | None:
    """`_prompt_size` read off the client's JSON, without serializing the conversation
    again: the body's length less that of its other fields (a few hundred bytes to
    serialize). Exact when the client writes JSON as orjson does (no spaces, non-ASCII text
    as UTF-8), as Claude Code, the Anthropic SDKs and httpx do; None (serialize instead)
    for JSON with spaces after its separators, or ASCII-only JSON that may hold `\\u`
    escapes, whose length would overstate the text."""
    if not _compact(raw) or (raw.isascii() and b"\\u" in raw):
        return None
    present = [name for name in PROMPT_FIELDS if name in request]
    rest = {key: value for key, value in request.items() if key not in PROMPT_FIELDS}
    # '{' + '"key":value' joined by ',' + '}': the prompt's values are what the other
    # fields (with their braces), the prompt's keys and their commas leave.
    size = (len(raw) - (len(orjson.dumps(rest)) if rest else 1) - len(present)
            - sum(len(name) + 3 for name in present))
    for name in present:  # as `_prompt_size` counts them
        value = request[name]
        if isinstance(value, str):
            size += len(value.encode()) - len(orjson.dumps(value))
        elif not value:
            size -= len(orjson.dumps(value))
    return size


def _compact(raw: bytes) -> bool:
    """Whether the JSON object in `raw` is written without spaces: its first key is followed
    by `:` and a value, not by a space (a writer either spaces its separators or not)."""
    if not raw.startswith(b'{"'):
        return False
    colon = raw.find(b'":', 2, 200)
    return colon > 0 and raw[colon + 2:colon + 3] not in (b" ", b"\n", b"")


def _serialized(value: Any) -> bytes:
    """`value` as orjson writes it; nested deeper than orjson goes (254 levels, which only a
    hostile body reaches), its repr."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return repr(value).encode()


_BASE64 = re.compile(r"[A-Za-z0-9+/=_-]*")


def _payloads(messages: list[Any]) -> tuple[int, int]:
    """(bytes of base64, media blocks) in the messages: image and document data, thinking
    signatures, redacted thinking, wherever they are (tool results included). A walk over
    the blocks, not their text (a text that names a payload key is still text), in one
    flat loop: most blocks are text, tool calls and tool results of text."""
    payload = media = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(kind, str) or kind in _PLAIN:
                continue
            found, count = _block_payloads(block)
            payload, media = payload + found, media + count
    return payload, media


_PLAIN = frozenset({"text", "tool_use"})
"""Block types that hold no payload."""


def _block_payloads(block: dict[str, Any]) -> tuple[int, int]:
    kind = block.get("type")
    if kind == "thinking":
        return _base64_length(block.get("signature")), 0
    if kind == "redacted_thinking":
        return _base64_length(block.get("data")), 0
    if kind in ("image", "document"):
        source = block.get("source")
        if not isinstance(source, dict):
            return 0, 0
        if source.get("type") in ("text", "content"):  # text, counted as text
            return _payloads([{"content": source.get("content")}])
        return _base64_length(source.get("data")), 1
    content = block.get("content")  # a tool result's, or another block's that has some
    return _payloads([{"content": content}]) if isinstance(content, list) else (0, 0)


def _base64_length(data: Any) -> int:
    """The length of a base64 string (a text document's `data` is text, not a payload)."""
    return len(data) if isinstance(data, str) and _BASE64.fullmatch(data) else 0


def _exact(request: dict[str, Any], count: Counter) -> int:
    """OpenAI's chat accounting: each message's role and text plus its framing; tools and the
    schema as the JSON the upstream is sent."""
    total = REPLY_PRIMING + media_blocks(request) * TOKENS_PER_MEDIA_BLOCK
    system = "".join(_strings(request.get("system")))
    if system:
        total += TOKENS_PER_MESSAGE + count("system") + count(system)
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            total += TOKENS_PER_MESSAGE + count(str(message.get("role", "")))
            total += sum(count(text) for text in _strings(message.get("content")))
    total += sum(count(text) for text in _extras(request))
    return total


def _extras(request: dict[str, Any]) -> Iterator[str]:
    tools = request.get("tools")
    if tools:
        yield orjson.dumps(tools).decode()
    schema = requested_schema(request)
    if schema is not None:
        yield schema_instruction(schema)


def _strings(value: Any) -> Iterator[str]:
    """The text of a content value: strings, tool inputs as JSON, thinking, tool results,
    and text documents' own text; not ids, signatures or base64 data."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key == "input":
                yield orjson.dumps(item).decode()
            elif key not in _SKIPPED_KEYS:
                yield from _strings(item)
        yield from _document_text(value)


def _document_text(block: dict[str, Any]) -> Iterator[str]:
    source = block.get("source") if block.get("type") == "document" else None
    if isinstance(source, dict) and source.get("type") == "text":
        yield str(source.get("data", ""))
    elif isinstance(source, dict) and source.get("type") == "content":
        yield from _strings(source.get("content"))


def media_blocks(value: Any) -> int:
    """Images and non-text documents, wherever they are (tool results included)."""
    if isinstance(value, dict) and "messages" in value:
        return sum(media_blocks(m.get("content")) for m in value["messages"] or []
                   if isinstance(m, dict))
    if isinstance(value, list):
        return sum(media_blocks(item) for item in value)
    if isinstance(value, dict):
        source = value.get("source")
        text_document = (value.get("type") == "document" and isinstance(source, dict)
                         and source.get("type") in ("text", "content"))
        own = 1 if value.get("type") in ("image", "document") and not text_document else 0
        return own + media_blocks(value.get("content"))
    return 0
