"""Two model prompt caches for the session figure, the way real upstreams cache (pure code).

A request is rendered as a list of blocks, the way a chat template sees it: the template knobs
(model, reasoning switches), each tool, then each message's content parts (a string content is
one text part, as every template renders it), tool calls and reasoning passed back. A block's
bytes never include `cache_control` (a marker is not part of the prompt).

- `PrefixCache` (OpenAI, DeepSeek, Kimi, vLLM): what is read from cache is the longest byte
  prefix shared with an earlier request; nothing is "written" in the reported usage.
- `BreakpointCache` (Anthropic behind OpenRouter, DashScope): each breakpoint writes the
  prompt up to its block; a request reads the longest written prefix ending at a block
  boundary at most 20 blocks before one of its breakpoints; writes are reported.

Tokens are bytes / 4, the proxy's own estimate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

BYTES_PER_TOKEN = 4
LOOKBACK_BLOCKS = 20
OPENAI_KNOBS = ("model", "reasoning_effort", "reasoning", "thinking", "enable_thinking",
                "chat_template_kwargs")
ANTHROPIC_KNOBS = ("model", "thinking")
OPENAI_MESSAGE_EXTRAS = ("tool_calls", "tool_call_id", "reasoning_content", "reasoning")


@dataclass(frozen=True)
class Block:
    data: bytes
    breakpoint: bool = False


@dataclass(frozen=True)
class CacheUse:
    prompt: int
    read: int
    written: int

    @property
    def uncached(self) -> int:
        return self.prompt - self.read - self.written


def tokens(size: int) -> int:
    return size // BYTES_PER_TOKEN


def _block(role: str, item: Any) -> Block:
    marked = isinstance(item, dict) and isinstance(item.get("cache_control"), dict)
    if isinstance(item, dict):
        item = {key: value for key, value in item.items() if key != "cache_control"}
    return Block(role.encode() + b":" + orjson.dumps(item), marked)


def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def openai_blocks(body: dict[str, Any]) -> list[Block]:
    """A Chat Completions body as its template renders it."""
    blocks = [_block("knobs", {key: body[key] for key in OPENAI_KNOBS if key in body})]
    blocks += [_block("tool", tool) for tool in body.get("tools") or []]
    for message in body["messages"]:
        role = message["role"]
        blocks += [_block(role, part) for part in _parts(message.get("content"))]
        blocks += [_block(role, {key: message[key]}) for key in OPENAI_MESSAGE_EXTRAS
                   if message.get(key)]
    return blocks


def anthropic_blocks(body: dict[str, Any]) -> list[Block]:
    """A Messages body as Anthropic renders it (the direct connection)."""
    blocks = [_block("knobs", {key: body[key] for key in ANTHROPIC_KNOBS if key in body})]
    blocks += [_block("tool", tool) for tool in body.get("tools") or []]
    blocks += [_block("system", part) for part in _parts(body.get("system"))]
    for message in body["messages"]:
        blocks += [_block(message["role"], part) for part in _parts(message["content"])]
    return blocks


class PrefixCache:
    """Automatic prefix caching: reads the longest byte prefix seen before."""

    def __init__(self) -> None:
        self._seen: list[bytes] = []

    def use(self, blocks: list[Block]) -> CacheUse:
        prompt = b"".join(block.data for block in blocks)
        shared = max((_common_prefix(prompt, earlier) for earlier in self._seen), default=0)
        self._seen.append(prompt)
        return CacheUse(tokens(len(prompt)), tokens(shared), 0)


def _common_prefix(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    low, high = 0, limit
    while low < high:  # binary search on the first differing byte
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class BreakpointCache:
    """Explicit breakpoints, Anthropic's rules (lookback of 20 blocks per breakpoint)."""

    def __init__(self) -> None:
        self._written: set[bytes] = set()

    def use(self, blocks: list[Block]) -> CacheUse:
        ends, hashes, digest, size = [], [], hashlib.sha256(), 0
        for block in blocks:
            digest.update(block.data)
            size += len(block.data)
            ends.append(size)
            hashes.append(digest.copy().digest())
        marks = [index for index, block in enumerate(blocks) if block.breakpoint]
        read = 0
        for mark in marks:
            for index in range(mark, max(mark - LOOKBACK_BLOCKS, -1), -1):
                if hashes[index] in self._written:
                    read = max(read, ends[index])
                    break
        last = ends[marks[-1]] if marks else 0
        for mark in marks:
            self._written.add(hashes[mark])
        return CacheUse(tokens(size), tokens(read), tokens(max(last - read, 0)))
