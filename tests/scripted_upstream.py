"""A scripted OpenAI-compatible upstream for the tests: it replays provider wire formats.

It records every request it gets and answers each with the next scripted `Reply`, or, when a
request's messages carry `SCENARIO:replay:<stem>`, with the recorded transcript of that stem
(`tests/data/transcripts/<stem>.json`, served byte for byte). Replies can also fail: an HTTP
error with headers, or a stream that is cut after N events.

It also speaks the Anthropic Messages API (`/v1/messages`, below the root URL `root_url`, as
DeepSeek's `/anthropic` or vLLM's root): scripted Messages streams (`message_stream`, named
events, no `[DONE]`) and whole Messages (`message_reply`); unscripted, a short text message.

It also speaks the Responses API (`/v1/responses`, Azure's `/openai/v1/responses`): scripted
event lists (`event:` + `data:` framing, no `[DONE]`), and the recordings in
`tests/data/opaque-reasoning/` when the input names `SCENARIO:replay:<stem>`; a recording of
several turns serves the turn after as many `function_call_output` items as the input has.

Run alone (for manual checks): `python tests/scripted_upstream.py --port 9000`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

TRANSCRIPTS = Path(__file__).parent / "data" / "transcripts"
OPAQUE = Path(__file__).parent / "data" / "opaque-reasoning"
RECORDINGS = Path(__file__).parent / "data" / "llamacpp"
"""Raw HTTP answers of a real llama-server (status line, headers, body; README.md there)."""
_SCENARIO = re.compile(r"SCENARIO:replay:([A-Za-z0-9._-]+)")


class CutStream(Exception):
    """Raised inside a streaming body to drop the connection mid-stream."""


@dataclass
class Reply:
    """One scripted answer. `events` are SSE data payloads (str sent as is, dict as JSON)."""

    status: int = 200
    events: list[str | dict[str, Any]] | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    comments: list[tuple[int, str]] = field(default_factory=list)
    cut_after: int | None = None
    done: bool = True
    raw_body: bytes | None = None
    raw_pieces: list[bytes] | None = None
    """Sent exactly as given, one write each (split UTF-8, odd SSE framing)."""
    stall_at: int | None = None
    """Stop after this many pieces and wait until the connection is closed."""
    keepalive_forever: bool = False
    """After the events, send an SSE comment every 50 ms until the connection is closed."""
    named: bool = False
    """Responses API framing: each event gets an `event: <type>` line; no `[DONE]`."""

    def render_events(self) -> list[bytes]:
        """The SSE byte pieces: comments placed before the N-th data event, then [DONE]."""
        if self.raw_pieces is not None:
            return list(self.raw_pieces)
        pieces: list[bytes] = []
        events = list(self.events or [])
        for position, payload in enumerate(events):
            pieces.extend(f"{text}\n\n".encode() for at, text in self.comments if at == position)
            data = payload if isinstance(payload, str) else json.dumps(payload)
            name = f"event: {json.loads(data)['type']}\n" if self.named else ""
            pieces.append(f"{name}data: {data}\n\n".encode())
        pieces.extend(f"{text}\n\n".encode() for at, text in self.comments if at >= len(events))
        if self.done and not self.keepalive_forever and not (events and events[-1] == "[DONE]"):
            pieces.append(b"data: [DONE]\n\n")
        return pieces


def http_recording(name: str) -> Reply:
    """A recorded raw HTTP answer (`tests/data/llamacpp/<name>.http`) replayed exactly: its
    status, its headers (and no others: the scripted upstream adds neither `server` nor
    `date`), its body bytes; a chunked body goes out one SSE event per write."""
    head, body = (RECORDINGS / f"{name}.http").read_bytes().split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(":", 1) for line in header_lines)
    headers = {name: value.removeprefix(" ") for name, value in headers.items()}
    if headers.get("Transfer-Encoding") == "chunked":
        events = [piece + b"\n\n" for piece in body.split(b"\n\n") if piece]
        assert b"".join(events) == body
        return Reply(status=int(status_line.split()[1]), raw_pieces=events, headers=headers)
    return Reply(status=int(status_line.split()[1]), raw_body=body, headers=headers)


def recorded_body(name: str) -> bytes:
    """The body bytes of a recorded answer."""
    return (RECORDINGS / f"{name}.http").read_bytes().split(b"\r\n\r\n", 1)[1]


def load_transcript(stem: str) -> dict[str, Any]:
    return json.loads((TRANSCRIPTS / f"{stem}.json").read_text(encoding="utf-8"))


def transcript_reply(stem: str) -> Reply:
    """The recorded reply of one transcript, exactly as the provider sent it."""
    record = load_transcript(stem)
    if not record.get("stream", True):
        return Reply(status=record.get("status", 200), body=record["body"],
                     content_type=record.get("content_type", "application/json"))
    chunks = list(record["chunks"])
    if record.get("append_done") and chunks[-1:] != ["[DONE]"]:
        chunks.append("[DONE]")
    return Reply(status=record.get("status", 200), events=chunks, done=False,
                 content_type=record.get("content_type", "text/event-stream"),
                 comments=[(int(at), text) for at, text in record.get("comments") or []])


def transcript_chunks(stem: str) -> list[dict[str, Any]]:
    """The parsed data chunks of a transcript (without [DONE]), for computing expectations."""
    record = load_transcript(stem)
    return [json.loads(chunk) for chunk in record["chunks"] if chunk != "[DONE]"]


def scenario_of(body: dict[str, Any]) -> str | None:
    match = _SCENARIO.search(json.dumps(body.get("messages", body.get("input", []))))
    return match.group(1) if match else None


def recorded_turns(stem: str) -> list[list[str]]:
    """The turns of a vercel `*.chunks.txt` recording: its lines, exactly, split at each
    `response.created`."""
    turns: list[list[str]] = []
    for line in (OPAQUE / f"{stem}.chunks.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if json.loads(line)["type"] == "response.created" or not turns:
            turns.append([])
        turns[-1].append(line)
    return turns


def responses_replay(stem: str, body: dict[str, Any]) -> Reply:
    """A recorded /responses answer: a stream recording's next turn, or a JSON body."""
    if body.get("stream"):
        done = sum(1 for item in body.get("input", []) if item.get("type") ==
                   "function_call_output")
        return Reply(events=list(recorded_turns(stem)[done]), named=True, done=False)
    return Reply(raw_body=(OPAQUE / f"{stem}.json").read_bytes())


def responses_stream(*events: dict[str, Any], status: int = 200) -> Reply:
    """A scripted /responses stream."""
    return Reply(status=status, events=list(events), named=True, done=False)


# ------------------------------------------------------------------ helpers for scripts


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          usage: dict[str, Any] | None = None, model: str = "scripted") -> dict[str, Any]:
    """One OpenAI chat.completion.chunk."""
    choices = [] if delta is None and finish is None else [
        {"index": 0, "delta": delta or {}, "finish_reason": finish}]
    data: dict[str, Any] = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
                            "created": 1, "model": model, "choices": choices}
    if usage is not None:
        data["usage"] = usage
    return data


def text_stream(pieces: list[str], finish: str = "stop",
                usage: dict[str, Any] | None = None) -> Reply:
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    events.append(chunk({}, finish))
    if usage is not None:
        events.append(chunk(None, None, usage))
    return Reply(events=events)


def completion(message: dict[str, Any], finish: str = "stop",
               usage: dict[str, Any] | None = None) -> Reply:
    body = {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 1,
            "model": "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return Reply(body=body)


def echo_loop(steps: int, answer: str) -> Callable[[dict[str, Any]], Reply]:
    """A responder for Claude Code's tool loop: `steps - 1` Bash `echo step-N` calls, each
    after a line of text, then `answer`."""
    def respond(body: dict[str, Any]) -> Reply:
        done = sum(1 for message in body["messages"] if message["role"] == "tool")
        if done >= steps - 1:
            return text_stream([answer])
        step = done + 1
        arguments = json.dumps({"command": f"echo step-{step}",
                                "description": f"Print step {step}"})
        return Reply(events=[
            chunk({"role": "assistant", "content": f"Running step {step} of {steps - 1}."}),
            chunk({"tool_calls": [{"index": 0, "id": f"call_step_{step}", "type": "function",
                                   "function": {"name": "Bash", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
            chunk({}, "tool_calls")])
    return respond


MESSAGE_USAGE = {"input_tokens": 12, "output_tokens": 5, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}


def message_events(blocks: list[dict[str, Any]], *, model: str = "scripted",
                   stop_reason: str = "end_turn", usage: dict[str, Any] | None = None,
                   start_usage: dict[str, Any] | None = None, message_id: str = "msg_up",
                   pieces: int = 2, stop_sequence: str | None = None,
                   ) -> list[str | dict[str, Any]]:
    """The events of a Messages stream with these content blocks, as Anthropic's API sends
    them: `message_start` (usage with the input), each block as start, deltas (text and
    JSON cut in `pieces`, a thinking block's `signature_delta` last) and stop, then
    `message_delta` (stop reason, cumulative usage) and `message_stop`."""
    usage = dict(MESSAGE_USAGE if usage is None else usage)
    start = start_usage if start_usage is not None else {**usage, "output_tokens": 1}
    events: list[str | dict[str, Any]] = [{"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None, "usage": start}},
        {"type": "ping"}]
    for index, block in enumerate(blocks):
        kind = block["type"]
        empty = {"text": {"type": "text", "text": ""},
                 "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "tool_use": {**block, "input": {}}}.get(kind, block)
        events.append({"type": "content_block_start", "index": index, "content_block": empty})
        if kind == "text":
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece}}
                       for piece in _cut(block["text"], pieces)]
        elif kind == "thinking":
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "thinking_delta", "thinking": piece}}
                       for piece in _cut(block["thinking"], pieces)]
            if block.get("signature") is not None:
                events.append({"type": "content_block_delta", "index": index,
                               "delta": {"type": "signature_delta",
                                         "signature": block["signature"]}})
        elif kind == "tool_use":
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}
                       for piece in _cut(json.dumps(block["input"]), pieces)]
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": usage})
    events.append({"type": "message_stop"})
    return events


def _cut(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[at:at + size] for at in range(0, len(text), size)] or [""]


def message_stream(blocks: list[dict[str, Any]], **fields: Any) -> Reply:
    """A scripted Messages stream (see `message_events`)."""
    return Reply(events=message_events(blocks, **fields), named=True, done=False)


def message_reply(blocks: list[dict[str, Any]], *, model: str | None = "scripted",
                  stop_reason: str = "end_turn",
                  usage: dict[str, Any] | None = None) -> Reply:
    """A whole Message, as a non-streamed answer."""
    return Reply(body={"id": "msg_up", "type": "message", "role": "assistant",
                       "model": model or "scripted", "content": blocks,
                       "stop_reason": stop_reason, "stop_sequence": None,
                       "usage": dict(MESSAGE_USAGE if usage is None else usage)})


def anthropic_error(status: int, message: str, error_type: str = "invalid_request_error",
                    body: Any = None) -> Reply:
    """An Anthropic-shaped error answer (or `body` exactly, for an endpoint's own shape)."""
    return Reply(status=status, body=body if body is not None else {
        "type": "error", "error": {"type": error_type, "message": message}})


def error_reply(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "upstream_error"}},
                 headers=headers or {})


def example_for(schema: Any) -> Any:
    """A value that fits a JSON schema: its first example, const or enum value, else a
    placeholder of its type ("example", 1, true, one array item, every object property)."""
    if not isinstance(schema, dict):
        return None
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object" or "properties" in schema:
        return {name: example_for(sub) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [example_for(schema.get("items"))]
    return {"string": "example", "number": 1, "integer": 1, "boolean": True}.get(str(kind))


_PROMPTED_SCHEMA = re.compile(r"JSON schema: (\{.*\})\s*$", re.DOTALL)


def structured_answer(body: dict[str, Any]) -> str | None:
    """Like a model held to `response_format`: JSON fitting the schema when the request asks
    for `json_schema`, or for `json_object` with a schema in its system prompt; None (free
    text) otherwise."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        return json.dumps(example_for(response_format["json_schema"]["schema"]))
    system = next((m.get("content") for m in body.get("messages", [])
                   if m.get("role") == "system" and isinstance(m.get("content"), str)), "")
    match = _PROMPTED_SCHEMA.search(system or "")
    return json.dumps(example_for(json.loads(match.group(1))) if match else {})


# ------------------------------------------------------------------ the server


class LoopbackServer:
    """A Starlette app (`self.app`) served by uvicorn in a thread on 127.0.0.1."""

    app: Starlette
    port: int = 0
    own_headers_only = False
    """Send only the app's headers (no uvicorn `server`/`date`): replays stay exact."""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def start(self, port: int = 0) -> Self:
        sock = bind_loopback(port)
        self.port = sock.getsockname()[1]
        self._server, self._thread = serve_in_thread(self.app, sock,
                                                     own_headers_only=self.own_headers_only)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            stop_server(self._server, self._thread)


class ScriptedUpstream(LoopbackServer):
    """The upstream server. Thread-safe enough for tests: scripts are queued before requests.
    `props` is what `GET /props` answers (llama-server's; 404 while None)."""

    own_headers_only = True

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        """Each request's body as it came (`requests` holds them parsed)."""
        self.headers: list[dict[str, str]] = []
        self._replies: deque[Reply] = deque()
        self.responder: Callable[[dict[str, Any]], Reply | None] | None = None
        self.open_streams = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self.props: dict[str, Any] | None = None
        self.app = Starlette(routes=[
            Route("/props", self._props, methods=["GET"]),
            Route("/v1/chat/completions", self._handle, methods=["POST"]),
            Route("/openai/deployments/{name}/chat/completions", self._handle,
                  methods=["POST"]),
            Route("/v1/responses", self._handle, methods=["POST"]),
            Route("/openai/v1/responses", self._handle, methods=["POST"]),
            Route("/v1/messages", self._handle, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._handle, methods=["POST"]),
        ])
        self.paths: list[str] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """The base URL of its Messages API (the proxy appends `/v1/messages`)."""
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    def reset(self) -> None:
        self.paths.clear()
        self.requests.clear()
        self.raw.clear()
        self.headers.clear()
        self._replies.clear()
        self.responder = None
        self.props = None

    def _next_reply(self, body: dict[str, Any], path: str) -> Reply:
        stem = scenario_of(body)
        if stem and path.endswith("/responses"):
            return responses_replay(stem, body)
        if stem:
            return transcript_reply(stem)
        if self.responder is not None:
            reply = self.responder(body)
            if reply is not None:
                return reply
        if self._replies:
            return self._replies.popleft()
        if path.endswith("/messages"):
            blocks = [{"type": "text", "text": "scripted default"}]
            return (message_stream(blocks, model=body.get("model", "scripted"))
                    if body.get("stream") else message_reply(blocks, model=body.get("model")))
        structured = structured_answer(body)
        if structured is not None:
            return text_stream([structured[:5], structured[5:]]) if body.get(
                "stream") else completion({"content": structured})
        return text_stream(["scripted ", "default"]) if body.get("stream") else completion(
            {"content": "scripted default"})

    async def _props(self, request: Request) -> Response:
        if self.props is None:
            return Response(b'{"error":"not found"}', status_code=404,
                            media_type="application/json")
        return Response(json.dumps(self.props).encode(), headers={"Server": "llama.cpp"},
                        media_type="application/json")

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        with self._lock:
            self.requests.append(body)
            self.raw.append(raw)
            self.headers.append(dict(request.headers))
            self.paths.append(request.url.path)
            reply = self._next_reply(body, request.url.path)
        if reply.events is None and reply.raw_pieces is None and reply.stall_at is not None:
            # A JSON answer that never comes (until the caller goes away).
            stalled = Reply(raw_pieces=[], stall_at=0)
            return StreamingResponse(self._stream(stalled), status_code=reply.status,
                                     media_type=reply.content_type or "application/json")
        if reply.events is None and reply.raw_pieces is None:
            content = reply.raw_body if reply.raw_body is not None else json.dumps(
                reply.body).encode()
            return Response(content, status_code=reply.status, headers=reply.headers,
                            media_type=reply.content_type or "application/json")
        return StreamingResponse(self._stream(reply), status_code=reply.status,
                                 headers=reply.headers,
                                 media_type=reply.content_type or "text/event-stream")

    async def _stream(self, reply: Reply) -> AsyncIterator[bytes]:
        with self._idle:
            self.open_streams += 1
        try:
            pieces = reply.render_events()
            for sent, piece in enumerate(pieces):
                if reply.cut_after is not None and sent >= reply.cut_after:
                    raise CutStream("scripted mid-stream drop")
                if reply.stall_at is not None and sent >= reply.stall_at:
                    break
                yield piece
            if reply.stall_at is not None:
                await asyncio.Event().wait()  # until the client goes away
            while reply.keepalive_forever:
                await asyncio.sleep(0.05)  # a slow upstream that is never idle
                yield b": keep-alive\n\n"
        finally:
            with self._idle:
                self.open_streams -= 1
                self._idle.notify_all()

    def wait_until_idle(self, timeout: float = 30) -> bool:
        """Block until no response is streaming (True), or give up after `timeout`."""
        with self._idle:
            return self._idle.wait_for(lambda: self.open_streams == 0, timeout)



def bind_loopback(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1: its port is known before the server runs, and
    connections made early wait in the backlog instead of failing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    return sock


def serve_in_thread(app: Any, sock: socket.socket, *, own_headers_only: bool = False,
                    http: Any = "auto") -> tuple[uvicorn.Server, threading.Thread]:
    """`http`: uvicorn's protocol (the proxy's own, `cli.http_protocol()`, for a proxy)."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=1, server_header=not own_headers_only,
                            date_header=not own_headers_only, http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread


def stop_server(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    upstream = ScriptedUpstream()
    uvicorn.run(upstream.app, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
