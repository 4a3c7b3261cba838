"""FLOOR: the least an Anthropic → OpenAI translator costs on claude-proxy's own stack.

A FastAPI route behind uvicorn (same options as the proxy: httptools, uvloop), one
`httpx.AsyncClient`, orjson, httpx-sse's decoders and sse-starlette's `EventSourceResponse`,
and no conversion beyond the text: each message becomes one OpenAI message of its text (text
blocks, tool results' text, tool calls' input as JSON; a conversation is sent whole, as Claude
Code sends it on every turn; until issue 35 only the last message was sent, which made a long
conversation cost FLOOR nothing but its parsing), the answer's text becomes Anthropic text
events (a whole Message when not streaming). No auth, validation, routing, retries, logging
or metrics. Like the proxy, it writes everything one upstream read brought in as one SSE
write. The benchmark runs it from the production venv
through the same phases as the proxy, so every proxy figure is also a ratio to this one.

Run as a script (`python bench/floor.py --port P --upstream URL`): it imports nothing from
the benchmark, only the installed packages.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from httpx_sse._decoders import SSEDecoder, SSELineDecoder
from sse_starlette import EventSourceResponse

MODEL = "claude-sonnet-4-6"
UPSTREAM_MODEL = "gpt-4o"


def event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **payload}))


def block_text(block: Any) -> str:
    """A content block's text: text, a tool result's text, a tool call's input as JSON."""
    if not isinstance(block, dict):
        return str(block)
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_result":
        return content_text(block.get("content"))
    if kind == "tool_use":
        return orjson.dumps(block.get("input")).decode()
    return ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block_text(block) for block in content or ())


def upstream_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Every message as one OpenAI message of its text (a translator has to send the whole
    conversation: Claude Code sends it on every turn)."""
    messages = [{"role": message["role"], "content": content_text(message["content"])}
                for message in body["messages"]]
    request: dict[str, Any] = {"model": UPSTREAM_MODEL, "max_tokens": body["max_tokens"],
                               "stream": stream, "messages": messages}
    if stream:
        request["stream_options"] = {"include_usage": True}
    return request


def message(text: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": "msg_floor", "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0)}}


def chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or ()
    return str((choices[0].get("delta") or {}).get("content") or "") if choices else ""


async def text_events(response: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's SSE as Anthropic events, one write per network read."""
    start = {"id": "msg_floor", "type": "message", "role": "assistant", "model": MODEL,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": 0, "output_tokens": 0}}
    yield (event("message_start", {"message": start})
           + event("content_block_start", {"index": 0,
                                           "content_block": {"type": "text", "text": ""}}))
    lines, decoder = SSELineDecoder(), SSEDecoder()
    output_tokens = 0
    try:
        async for piece in response.aiter_text():
            out = []
            for line in lines.decode(piece):
                sse = decoder.decode(line)
                if sse is None or not sse.data or sse.data == "[DONE]":
                    continue
                chunk = orjson.loads(sse.data)
                output_tokens = (chunk.get("usage") or {}).get("completion_tokens",
                                                               output_tokens)
                text = chunk_text(chunk)
                if text:
                    out.append(event("content_block_delta", {
                        "index": 0, "delta": {"type": "text_delta", "text": text}}))
            if out:
                yield b"".join(out)
    finally:
        await response.aclose()
    yield (event("content_block_stop", {"index": 0})
           + event("message_delta", {"delta": {"stop_reason": "end_turn",
                                               "stop_sequence": None},
                                     "usage": {"output_tokens": output_tokens}})
           + event("message_stop", {}))


def create_app(upstream: str) -> FastAPI:
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                               limits=httpx.Limits(max_connections=None,
                                                   max_keepalive_connections=200))
    url = f"{upstream}/chat/completions"
    headers = {"content-type": "application/json", "authorization": "Bearer sk-floor"}
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if not body.get("stream"):
            answer = await client.post(url, content=orjson.dumps(upstream_body(body, False)),
                                       headers=headers)
            data = orjson.loads(answer.content)
            text = str(data["choices"][0]["message"]["content"] or "")
            return Response(orjson.dumps(message(text, data.get("usage") or {})),
                            media_type="application/json")
        sent = client.build_request("POST", url, headers=headers,
                                    content=orjson.dumps(upstream_body(body, True)))
        response = await client.send(sent, stream=True)
        return EventSourceResponse(text_events(response), sep="\n")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="OpenAI base URL (…/v1)")
    args = parser.parse_args()
    uvicorn.run(create_app(args.upstream), host=args.host, port=args.port, log_config=None,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
