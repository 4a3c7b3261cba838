"""A deliberately minimal OpenAI-compatible upstream for the benchmark, which also answers
the Anthropic Messages API (`POST /v1/messages`, for the proxy's Messages column) with the
same content in that API's events.

It must never be the bottleneck, so it is a raw `asyncio.Protocol` HTTP/1.1 server: no
framework, keep-alive, responses built once per shape and cached as ready-to-write bytes
(chunked SSE, one HTTP chunk per event, exactly as real providers frame them).

What to answer is read from the last user message, which carries `BENCH n=<N> iv=<S>`:
N content chunks (or N words in a non-streaming answer), S seconds between chunks (0 = write
everything at once; > 0 = a slow, idle-ish stream). `stream` in the body selects SSE or JSON.

Run as `python -m bench.upstream [--port P]`; it prints `READY <port>` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import orjson

TOKEN = "tok "
MODEL = "gpt-4o"
CREATED = 1_700_000_000

_SPEC = re.compile(rb"BENCH n=(\d+) iv=([0-9.]+)")
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_CONNECTION_CLOSE = re.compile(rb"\r\nconnection:\s*close", re.IGNORECASE)

SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
LAST_CHUNK = b"0\r\n\r\n"


# ---------------------------------------------------------------- pre-encoded bodies


def http_chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (size in hex, CRLF, payload, CRLF)."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse_event(chunk: dict[str, object] | str) -> bytes:
    """One SSE `data:` event as its own HTTP chunk, the way providers write them."""
    data = chunk.encode() if isinstance(chunk, str) else orjson.dumps(chunk)
    return http_chunk(b"data: " + data + b"\n\n")


def completion_chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED,
            "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}


ROLE_EVENT = sse_event(completion_chunk({"role": "assistant", "content": ""}))
TOKEN_EVENT = sse_event(completion_chunk({"content": TOKEN}))


@lru_cache(maxsize=16)
def stream_tail(n: int) -> bytes:
    """What follows the last content chunk: finish reason, usage, [DONE], end of body."""
    usage_chunk = {**completion_chunk({}), "choices": [], "usage": usage(n)}
    return (sse_event(completion_chunk({}, "stop")) + sse_event(usage_chunk)
            + sse_event("[DONE]") + LAST_CHUNK)


@lru_cache(maxsize=64)
def stream_response(n: int) -> bytes:
    """A whole fast streaming response (head and body), built once per chunk count."""
    return SSE_HEAD + ROLE_EVENT + TOKEN_EVENT * n + stream_tail(n)


@lru_cache(maxsize=64)
def json_response(n: int) -> bytes:
    """A whole non-streaming response with `n` words of content."""
    body = orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": CREATED, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TOKEN * n},
                     "finish_reason": "stop"}],
        "usage": usage(n)})
    return json_answer(body)


def json_answer(body: bytes) -> bytes:
    """A 200 answer with this JSON body."""
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(body))
    return head + body


# ---------------------------------------------------------------- the Messages API


def named_event(event: dict[str, object]) -> bytes:
    """One Messages API event (`event:` and `data:` lines) as its own HTTP chunk."""
    return http_chunk(b"event: %s\ndata: %s\n\n" % (str(event["type"]).encode(),
                                                   orjson.dumps(event)))


def message_usage(n: int) -> dict[str, int]:
    return {"input_tokens": 8, "output_tokens": n, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


MESSAGE_START = (named_event({"type": "message_start", "message": {
    "id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL, "content": [],
    "stop_reason": None, "stop_sequence": None, "usage": {**message_usage(1)}}})
    + named_event({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}))
MESSAGE_TOKEN = named_event({"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": TOKEN}})


@lru_cache(maxsize=16)
def message_tail(n: int) -> bytes:
    return (named_event({"type": "content_block_stop", "index": 0})
            + named_event({"type": "message_delta", "usage": message_usage(n),
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None}})
            + named_event({"type": "message_stop"}) + LAST_CHUNK)


@lru_cache(maxsize=64)
def message_stream(n: int) -> bytes:
    return SSE_HEAD + MESSAGE_START + MESSAGE_TOKEN * n + message_tail(n)


@lru_cache(maxsize=64)
def message_json(n: int) -> bytes:
    body = orjson.dumps({
        "id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "text", "text": TOKEN * n}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": message_usage(n)})
    return json_answer(body)


@dataclass(frozen=True)
class Shape:
    """One API's answers: a whole one, a fast stream, and a slow stream's pieces."""

    whole: Callable[[int], bytes]
    stream: Callable[[int], bytes]
    start: bytes
    token: bytes
    tail: Callable[[int], bytes]


CHAT = Shape(json_response, stream_response, SSE_HEAD + ROLE_EVENT, TOKEN_EVENT, stream_tail)
MESSAGES = Shape(message_json, message_stream, SSE_HEAD + MESSAGE_START, MESSAGE_TOKEN,
                 message_tail)


def simple_response(status: str, body: bytes) -> bytes:
    return (b"HTTP/1.1 %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
            % (status.encode(), len(body), body))


# ---------------------------------------------------------------- protocol


class UpstreamProtocol(asyncio.Protocol):
    """One client connection. Requests are handled one at a time (clients do not pipeline);
    a slow stream runs as a task that respects the transport's flow control."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.close_after = False
        self.task: asyncio.Task[None] | None = None
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.task is not None:
            self.task.cancel()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self.handle_buffered()

    def handle_buffered(self) -> None:
        """Answer every complete request in the buffer until one needs a slow stream."""
        while not self.busy and self.transport is not None:
            request = self.take_request()
            if request is None:
                return
            head, body = request
            self.close_after = _CONNECTION_CLOSE.search(head) is not None
            self.respond(head, body)

    def take_request(self) -> tuple[bytes, bytes] | None:
        """The next complete request (head, body), removed from the buffer, or None."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buffer[:end])
        match = _CONTENT_LENGTH.search(head)
        length = int(match.group(1)) if match else 0
        if len(self.buffer) < end + 4 + length:
            return None
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        return head, body

    def respond(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        line = head[:200]
        shape = (CHAT if b"/chat/completions " in line else
                 MESSAGES if b"/v1/messages " in line else None)
        if not head.startswith(b"POST ") or shape is None:
            self.finish(simple_response("404 Not Found", b"not found"))
            return
        spec = _SPEC.search(body)
        if spec is None:
            self.finish(simple_response("400 Bad Request", b"no BENCH spec in the messages"))
            return
        n, interval = int(spec.group(1)), float(spec.group(2))
        if _STREAM_TRUE.search(body) is None:
            self.finish(shape.whole(n))
        elif interval <= 0:
            self.finish(shape.stream(n))
        else:
            self.busy = True
            self.task = asyncio.ensure_future(self.slow_stream(n, interval, shape))

    def finish(self, payload: bytes) -> None:
        """Write a complete response; close the connection if the client asked to."""
        if self.transport is None:
            return
        self.transport.write(payload)
        if self.close_after:
            self.transport.close()

    async def slow_stream(self, n: int, interval: float, shape: Shape = CHAT) -> None:
        """Role and first token at once, then one token every `interval` seconds."""
        try:
            await self.write(shape.start + shape.token)
            for _ in range(n - 1):
                await asyncio.sleep(interval)
                await self.write(shape.token)
            self.finish(shape.tail(n))
        except ConnectionError:
            return
        finally:
            self.busy = False
            self.task = None
        self.handle_buffered()

    async def write(self, payload: bytes) -> None:
        await self.writable.wait()
        if self.transport is None:
            raise ConnectionResetError("client went away")
        self.transport.write(payload)


# ---------------------------------------------------------------- entry point


def install_fast_loop() -> None:
    """uvloop when available: the upstream (and the client) should be as cheap as possible."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=4096,
                                      reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(f"READY {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fast scripted OpenAI-compatible upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    install_fast_loop()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
