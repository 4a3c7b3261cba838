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


def estimate_request_tokens(request: dict[str, Any], model: str | None = None) -> int:
    """The request's input tokens for `model` (the upstream model id; None: unknown)."""
    name = encoding_name(model)
    if name is not None:
        return _exact(request, _encoder(name))
    return plain_estimate(request)


def plain_estimate(request: dict[str, Any]) -> int:
    """About four bytes of the prompt's JSON a token, images and documents a fixed amount.

    Made at C speed, because every request pays for it and Claude Code sends the whole
    conversation each time (hundreds of KB late in a session): the system prompt and the
    messages are serialized by orjson and their length taken, less the base64 payloads
    (image and PDF data, thinking signatures), which are not prompt text; no Python loop
    visits the blocks. The JSON's own keys and quotes count too (a tool call's id and name
    are in the upstream's prompt as well); the session's calibration corrects the rest."""
    system, messages = request.get("system"), request.get("messages")
    tools, schema = request.get("tools"), requested_schema(request)
    size = len(orjson.dumps(tools)) if tools else 0
    if schema is not None:
        size += len(schema_instruction(schema).encode())
    if isinstance(system, str):
        size += len(system.encode())
    elif system:
        size += _prompt_bytes(_serialized(system))
    if not isinstance(messages, list):
        return estimate_tokens(size)
    data = _serialized(messages)
    size += _prompt_bytes(data)
    if b'"source":{' not in data:  # every image and document has one
        media = 0
    elif b'"type":"document"' in data:  # a document may be text, counted as text
        media = media_blocks(request)
    else:
        media = data.count(b'"type":"image"')
    return estimate_tokens(size) + media * TOKENS_PER_MEDIA_BLOCK


def _serialized(value: Any) -> bytes:
    """`value` as orjson writes it; nested deeper than orjson goes (254 levels, which only a
    hostile body reaches), its repr."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return repr(value).encode()


_PAYLOAD_KEYS = (b'"data":"', b'"signature":"')
"""Strings that hold base64 (image and PDF data, redacted thinking, thinking signatures): not
prompt text. Serialized JSON escapes every quote inside a string, so a key written in a text
never matches."""
_BASE64 = re.compile(rb"[A-Za-z0-9+/=_-]*")


def _prompt_bytes(data: bytes) -> int:
    """The JSON's length less its base64 payloads. A `find` for each key runs in C over the
    whole JSON; Python only visits the payloads found (a text document's `data` is text)."""
    size = len(data)
    for key in _PAYLOAD_KEYS:
        start = data.find(key)
        while start >= 0:
            start += len(key)
            end = data.find(b'"', start)
            if _BASE64.fullmatch(data, start, end):
                size -= end - start
            start = data.find(key, end)
    return size


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
