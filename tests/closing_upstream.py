"""An OpenAI-compatible upstream that closes its connections the way llama.cpp and some
gateways do: without a `Connection: close` header, so a client believes it may reuse them.

Modes (`close`):
- `"after_stream"`: after every streamed reply the connection stays open until the next
  request's first bytes arrive, and is then closed without an answer. This is the worst case of
  llama.cpp's close after a streamed reply (the close lands after the client reused the
  connection), made certain instead of timed.
- `"idle"`: every connection is closed as soon as a reply has ended, as a 1 s idle timeout does
  to a connection left idle longer: the close is driven by the reply's end, not by a timer.

Its replies are llama.cpp's (tests/data ... /work/shared/transcripts/llamacpp): a plain answer, a
streamed answer with `reasoning_content`, and the 500 a server started without `--jinja` sends
for `tools` (with the `Connection: close` it really sends); anything but a chat completion
(discovery's `/props`, `/models`) gets a 404. `answered` counts the completions it answered,
`dropped` those it closed the connection on instead.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Literal, Self

from tests.scripted_upstream import bind_loopback

Close = Literal["after_stream", "idle"]

NO_JINJA = (b"HTTP/1.1 500 Internal Server Error\r\nServer: llama.cpp\r\n"
            b"Access-Control-Allow-Origin: \r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: 90\r\nConnection: close\r\n\r\n"
            b'{"error":{"code":500,"message":"tools param requires --jinja flag",'
            b'"type":"server_error"}}')
NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\nServer: llama.cpp\r\nContent-Type: application/json; "
             b"charset=utf-8\r\nContent-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\n{}")
HEAD = (b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
        b"Keep-Alive: timeout=5, max=100\r\n")


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    data = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": 1795637132, "id": "chatcmpl-closing", "model": "gemma-3-270m",
            "object": "chat.completion.chunk"}
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def streamed_reply(text: str) -> bytes:
    """A chunked SSE reply: reasoning, `text`, finish, [DONE], the chunked terminator."""
    events = [_chunk({"role": "assistant", "content": None}),
              _chunk({"reasoning_content": "17*23 = 391"}), _chunk({"content": text}),
              _chunk({}, "stop"), b"data: [DONE]\n\n"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)
    return (HEAD + b"Content-Type: text/event-stream\r\nX-Accel-Buffering: no\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n")


def plain_reply(text: str) -> bytes:
    body = json.dumps({"choices": [{"finish_reason": "stop", "index": 0, "message": {
        "role": "assistant", "content": text}}], "created": 1795636852, "model": "gemma-3-270m",
        "object": "chat.completion", "id": "chatcmpl-closing",
        "usage": {"completion_tokens": 1, "prompt_tokens": 30, "total_tokens": 31}},
        separators=(",", ":")).encode()
    return (HEAD + b"Content-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


class ClosingUpstream:
    def __init__(self, close: Close) -> None:
        self.close = close
        self.answered = 0
        self.dropped = 0
        self.others = 0
        self.connections = 0
        self.bodies: list[dict[str, Any]] = []
        self._sock = bind_loopback()
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self._sock)

    def stop(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def reply_for(self, body: dict[str, Any]) -> bytes:
        number = len(self.bodies)
        if body.get("tools"):
            return NO_JINJA
        if body.get("stream"):
            return streamed_reply(f"streamed {number}")
        return plain_reply(f"plain {number}")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        streamed = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if streamed and self.close == "after_stream":
                    self.dropped += 1  # the next request arrived: close instead of answering
                    return
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                content = await reader.readexactly(length)
                if not head.startswith(b"POST ") or b"/chat/completions " not in head:
                    writer.write(NOT_FOUND)  # discovery (/props, /models): nothing to say
                    self.others += 1
                    continue
                body = json.loads(content)
                reply = self.reply_for(body)
                self.bodies.append(body)
                writer.write(reply)
                await writer.drain()
                self.answered += 1
                streamed = bool(body.get("stream"))
                if self.close == "idle" or b"Connection: close" in reply:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()
