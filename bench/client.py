"""The benchmark client: one code path for DIRECT (OpenAI format, straight to the upstream)
and PROXY (Anthropic format, through claude-proxy), so their ratio compares like with like.

A `Target` only knows the URL, the request body and how to find the text in one event; the
transport, the SSE splitting, the JSON parsing of every event and the timing are shared.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from bench.procs import CLIENT_KEY
from bench.upstream import TOKEN

# Text carried by one event (None if it carries none); `True` marks the end of the stream.
EventReader = Callable[[bytes], "str | bool | None"]


@dataclass(frozen=True)
class Target:
    """Where and how to ask for `n` chunks of text."""

    name: str
    url: str
    build: Callable[[int, float, bool], dict[str, Any]]
    read_event: EventReader
    read_message: Callable[[Any], str]
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every request (the proxy's client key)."""


def spec(n: int, interval: float) -> str:
    """The instruction the upstream reads from the last user message."""
    return f"BENCH n={n} iv={interval:g}"


def openai_body(n: int, interval: float, stream: bool) -> dict[str, Any]:
    return {"model": "gpt-4o", "stream": stream, "max_tokens": 4096,
            "messages": [{"role": "user", "content": spec(n, interval)}]}


def anthropic_body(n: int, interval: float, stream: bool) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "stream": stream, "max_tokens": 4096,
            "messages": [{"role": "user", "content": spec(n, interval)}]}


def openai_event(data: bytes) -> str | bool | None:
    if data == b"[DONE]":
        return True
    choices = orjson.loads(data).get("choices") or ()
    for choice in choices:
        content = (choice.get("delta") or {}).get("content")
        if content:
            return str(content)
    return None


def anthropic_event(data: bytes) -> str | bool | None:
    event = orjson.loads(data)
    kind = event.get("type")
    if kind == "content_block_delta":
        delta = event.get("delta") or {}
        return str(delta.get("text") or "") or None
    if kind == "message_stop":
        return True
    if kind == "error":
        raise BenchError(f"error event: {event.get('error')}")
    return None


def openai_message(body: Any) -> str:
    return str(body["choices"][0]["message"]["content"])


def anthropic_message(body: Any) -> str:
    return "".join(block.get("text", "") for block in body["content"]
                   if block.get("type") == "text")


def direct_target(upstream_url: str) -> Target:
    return Target("direct", f"{upstream_url}/chat/completions", openai_body, openai_event,
                  openai_message)


def proxy_target(proxy_url: str) -> Target:
    return Target("proxy", f"{proxy_url}/v1/messages", anthropic_body, anthropic_event,
                  anthropic_message, {"x-api-key": CLIENT_KEY})


def messages_target(proxy_url: str) -> Target:
    """The proxy in front of a Messages API upstream (`UPSTREAM_API=messages`)."""
    return Target("messages", f"{proxy_url}/v1/messages", anthropic_body, anthropic_event,
                  anthropic_message, {"x-api-key": CLIENT_KEY})


def floor_target(floor_url: str) -> Target:
    """The FLOOR translator (bench/floor.py): the proxy's protocol, the stack's least cost."""
    return Target("floor", f"{floor_url}/v1/messages", anthropic_body, anthropic_event,
                  anthropic_message)


def io_floor_target(url: str) -> Target:
    """IO_FLOOR (bench/io_floor.py): the body passed on unchanged, the stack's I/O alone."""
    return Target("io_floor", f"{url}/v1/messages", anthropic_body, anthropic_event,
                  anthropic_message)


class BenchError(Exception):
    """A response that is not what the upstream was scripted to produce."""


# ---------------------------------------------------------------- one request


@dataclass
class StreamTiming:
    """Seconds from sending the request: headers received, first text, last byte."""

    ttfb: float
    ttft: float
    total: float
    deltas: int


_SSL = ssl.create_default_context()  # unused on loopback http, but httpx builds one per client


def new_client() -> httpx.AsyncClient:
    """A client with one connection and no environment proxies."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0), trust_env=False,
                             verify=_SSL)


@asynccontextmanager
async def lanes(count: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """`count` one-connection clients for `count` concurrent requests. One shared pool would
    make the client the bottleneck: httpcore rescans every pooled connection each time a
    request starts or ends (O(connections) per request, seconds at 200–1000 streams)."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(new_client()) for _ in range(count)]


async def request_message(client: httpx.AsyncClient, target: Target, n: int,
                          body: bytes | None = None) -> float:
    """One non-streaming request; returns its latency in seconds, checked for content.
    `body`: a ready-made one asking for `n` tokens (default: the target's own)."""
    body = body or orjson.dumps(target.build(n, 0.0, False))
    started = time.perf_counter()
    response = await client.post(target.url, content=body,
                                 headers={"content-type": "application/json",
                                          **target.headers})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise BenchError(f"{target.name}: HTTP {response.status_code}: {response.text[:200]}")
    text = target.read_message(orjson.loads(response.content))
    if text != TOKEN * n:
        raise BenchError(f"{target.name}: wrong content ({len(text)} chars)")
    return elapsed


async def request_stream(client: httpx.AsyncClient, target: Target, n: int,
                         interval: float = 0.0,
                         on_first_text: Callable[[], None] | None = None,
                         body: bytes | None = None) -> StreamTiming:
    """One streaming request, every event parsed; checked for exact content and a clean end.
    `body`: a ready-made one asking for `n` tokens (default: the target's own)."""
    body = body or orjson.dumps(target.build(n, interval, True))
    started = time.perf_counter()
    headers = {"content-type": "application/json", "accept": "text/event-stream",
               **target.headers}
    async with client.stream("POST", target.url, content=body, headers=headers) as response:
        ttfb = time.perf_counter() - started
        if response.status_code != 200:
            await response.aread()
            raise BenchError(f"{target.name}: HTTP {response.status_code}: "
                             f"{response.text[:200]}")
        reader = SSEReader(target.read_event, on_first_text)
        async for piece in response.aiter_raw():
            reader.feed(piece)
    total = time.perf_counter() - started
    reader.check(n)
    ttft = (reader.first_text_at - started) if reader.first_text_at else total
    return StreamTiming(ttfb=ttfb, ttft=ttft, total=total, deltas=reader.deltas)


class SSEReader:
    """Splits a byte stream into SSE events and hands each event's data to the target."""

    def __init__(self, read_event: EventReader,
                 on_first_text: Callable[[], None] | None = None) -> None:
        self.read_event = read_event
        self.on_first_text = on_first_text
        self.buffer = b""
        self.chars = 0
        self.deltas = 0
        self.ended = False
        self.first_text_at = 0.0

    def feed(self, piece: bytes) -> None:
        buffer = self.buffer + piece if self.buffer else piece
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            self.event(buffer[start:end])
            start = end + 2
        self.buffer = buffer[start:]

    def event(self, raw: bytes) -> None:
        at = raw.find(b"data: ")
        if at < 0:
            return  # a comment or keep-alive
        line_end = raw.find(b"\n", at)
        result = self.read_event(raw[at + 6:] if line_end < 0 else raw[at + 6:line_end])
        if result is True:
            self.ended = True
        elif isinstance(result, str):
            if not self.deltas:
                self.first_text_at = time.perf_counter()
                if self.on_first_text is not None:
                    self.on_first_text()
            self.deltas += 1
            self.chars += len(result)

    def check(self, n: int) -> None:
        if not self.ended:
            raise BenchError("stream ended without its final event")
        if self.chars != len(TOKEN) * n:
            raise BenchError(f"stream text has {self.chars} chars, expected {len(TOKEN) * n}")
