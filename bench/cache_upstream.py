"""A scripted upstream that caches prompts like the real ones and reports it like them.

`--mode prefix`: automatic prefix caching, usage as OpenAI reports it
(`prompt_tokens_details.cached_tokens`). `--mode breakpoints`: explicit breakpoints, usage as
OpenRouter reports it for `anthropic/*` (`cached_tokens` and `cache_write_tokens`). The same
cache model also answers `POST /v1/messages` (Anthropic format, Anthropic usage): the direct
connection the proxy is compared with. Each route has its own cache.

Run as `python -m bench.cache_upstream --mode prefix`; it prints `READY <port>`.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.prompt_cache import (
    BreakpointCache,
    CacheUse,
    PrefixCache,
    anthropic_blocks,
    openai_blocks,
)

ANSWER = "Done."
OUTPUT_TOKENS = 3


def openai_usage(use: CacheUse) -> dict[str, Any]:
    details: dict[str, int] = {"cached_tokens": use.read}
    if use.written:
        details["cache_write_tokens"] = use.written
    return {"prompt_tokens": use.prompt, "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": use.prompt + OUTPUT_TOKENS, "prompt_tokens_details": details}


def chat_reply(body: dict[str, Any], use: CacheUse) -> Response:
    """A short answer with the cache usage, streamed (usage in a last chunk) or not."""
    base = {"id": "chatcmpl-cache", "created": 1, "model": body["model"]}
    if not body.get("stream"):
        return Response(orjson.dumps({
            **base, "object": "chat.completion", "usage": openai_usage(use),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": ANSWER}}]}),
            media_type="application/json")
    chunks = [{**base, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
              for delta, finish in (({"role": "assistant", "content": ANSWER}, None),
                                    ({}, "stop"))]
    chunks.append({**base, "object": "chat.completion.chunk", "choices": [],
                   "usage": openai_usage(use)})
    events = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)
    return Response(events + b"data: [DONE]\n\n", media_type="text/event-stream")


def message_reply(body: dict[str, Any], use: CacheUse) -> Response:
    return Response(orjson.dumps({
        "id": "msg_cache", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": ANSWER}], "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": use.uncached, "output_tokens": OUTPUT_TOKENS,
                  "cache_read_input_tokens": use.read,
                  "cache_creation_input_tokens": use.written}}),
        media_type="application/json")


def build_app(mode: str) -> Starlette:
    new_cache: Callable[[], PrefixCache | BreakpointCache] = (
        PrefixCache if mode == "prefix" else BreakpointCache)
    chat_cache, messages_cache = new_cache(), new_cache()

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return chat_reply(body, chat_cache.use(openai_blocks(body)))

    async def messages(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return message_reply(body, messages_cache.use(anthropic_blocks(body)))

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/messages", messages, methods=["POST"])])


def bind_loopback() -> socket.socket:
    """Bound before the server runs, so READY can name the port; early clients wait in the
    backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("prefix", "breakpoints"), default="prefix")
    args = parser.parse_args()
    sock = bind_loopback()
    print(f"READY {sock.getsockname()[1]}", flush=True)
    sys.stdout.flush()
    config = uvicorn.Config(build_app(args.mode), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
