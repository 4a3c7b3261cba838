"""IO_FLOOR: what a proxy costs that only reads a request's body and writes it upstream
unchanged, on claude-proxy's own server and client stack.

A bare ASGI app behind uvicorn (httptools, uvloop, as the proxy runs) reads the body and
sends it, as it came, to the upstream's Messages API (`/v1/messages`) through one
`aiohttp.ClientSession` (the proxy's upstream transport); the answer goes back as it came,
a stream one network read at a time. No parsing, no conversion, no validation. What it costs
per request is the I/O any proxy pays for a body of that size on this stack: the bound under
which the proxy cannot go (the long conversations' phase reports it beside FLOOR).

`--pieces` serves it with the proxy's own HTTP protocol (server/http_protocol.py: a body's
pieces handed on without uvicorn's two copies) and writes the pieces upstream without
joining them; without it, uvicorn's protocol and one join, as any ASGI app reads a body.

Run as a script (`python bench/io_floor.py --port P --upstream URL`): it imports only the
installed packages.
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]


class Pieces(aiohttp.Payload):
    """A body's pieces written to the connection one after the other, without a join."""

    def __init__(self, pieces: list[bytes], size: int) -> None:
        super().__init__(pieces, content_type="application/json")
        self._pieces = pieces
        self._size = size

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._pieces).decode(encoding, errors)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        """The headers alone, then every piece in one `writelines` (one `writev` on uvloop),
        as the proxy writes a session's next turn (upstream/transport.py `_Pieces`)."""
        await writer.write(b"")
        writer.transport.writelines(self._pieces)
        await writer.drain()


class App:
    """The ASGI app: `/health`, and every POST forwarded to `{upstream}/v1/messages`."""

    def __init__(self, upstream: str, pieces: bool) -> None:
        self.url = upstream.removesuffix("/v1") + "/v1/messages"
        self.pieces = pieces
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": f"{kind}.complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
            return
        received, size = [], 0
        while True:
            message = await receive()
            piece = message.get("body", b"")
            received.append(piece)
            size += len(piece)
            if not message.get("more_body"):
                break
        if self.session is None:
            self.session = aiohttp.ClientSession(auto_decompress=False)
        data: Any = Pieces(received, size) if self.pieces else b"".join(received)
        async with self.session.post(self.url, data=data, headers={
                "content-type": "application/json"}) as answer:
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": [(b"content-type",
                                     answer.headers["content-type"].encode())]})
            while chunk := await answer.content.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="OpenAI base URL (…/v1)")
    parser.add_argument("--pieces", action="store_true",
                        help="the proxy's HTTP protocol, and the body's pieces unjoined")
    args = parser.parse_args()
    http: Any = "httptools"
    if args.pieces:
        from claude_proxy.server.http_protocol import HeadHoldingHttpToolsProtocol
        http = HeadHoldingHttpToolsProtocol
    uvicorn.run(App(args.upstream, args.pieces), host=args.host, port=args.port,
                log_config=None, log_level="warning", access_log=False, http=http,
                loop="uvloop")


if __name__ == "__main__":
    main()
