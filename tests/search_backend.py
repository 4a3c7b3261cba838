"""A scripted search backend on loopback, speaking SearXNG's JSON API and the Brave, Tavily and
Exa shapes (as documented; see shared/reference/web-search.md §3).

It records every request and answers with canned hits, no hits, 429, 500, a hang (the caller's
timeout ends it) or SearXNG's 403 when JSON output is off.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.scripted_upstream import LoopbackServer


@dataclass(frozen=True)
class CannedHit:
    url: str
    title: str
    snippet: str
    date: str | None = None


HITS = [
    CannedHit("https://blog.rust-lang.org/2026/10/30/Rust-1.91.0/", "Announcing Rust 1.91.0",
              "The Rust team is happy to announce a new version of Rust, 1.91.0.", "2026-10-30"),
    CannedHit("https://doc.rust-lang.org/releases.html", "Rust Release Notes",
              "Version 1.91.0 (2026-10-30) Language: stabilize …"),
    CannedHit("https://github.com/rust-lang/rust/releases", "Releases · rust-lang/rust",
              "Empowering everyone to build reliable and efficient software. ünïcode ✓"),
    CannedHit("https://www.reddit.com/r/rust/comments/x/rust_191/", "Rust 1.91 is out",
              "Discussion thread."),
]


@dataclass
class Seen:
    method: str
    path: str
    params: dict[str, str]
    body: Any
    headers: dict[str, str]

    @property
    def query(self) -> str:
        if self.params.get("q") is not None:
            return self.params["q"]
        return str((self.body or {}).get("query", ""))


@dataclass
class SearchBackendServer(LoopbackServer):
    """Set `mode` to hits | empty | 429 | 500 | hang | json_off; `hits` to change the canned
    results."""

    mode: str = "hits"
    hits: list[CannedHit] = field(default_factory=lambda: list(HITS))
    requests: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.app = Starlette(routes=[
            Route("/search", self._searxng, methods=["GET"]),
            Route("/web/search", self._brave, methods=["GET"]),
            Route("/search", self._posted, methods=["POST"]),
        ])
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.mode = "hits"
        self.hits = list(HITS)
        self.requests.clear()

    # ------------------------------------------------------------ shapes

    async def _record(self, request: Request) -> Response | None:
        raw = await request.body()
        with self._lock:
            self.requests.append(Seen(request.method, request.url.path,
                                      dict(request.query_params),
                                      json.loads(raw) if raw else None,
                                      dict(request.headers)))
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode in ("429", "500"):
            return JSONResponse({"error": "scripted failure"}, status_code=int(self.mode))
        return None

    def _selected(self) -> list[CannedHit]:
        return [] if self.mode == "empty" else self.hits

    async def _searxng(self, request: Request) -> Response:
        failure = await self._record(request)
        if failure is not None:
            return failure
        if self.mode == "json_off" or request.query_params.get("format") != "json":
            return Response("403 Forbidden", status_code=403, media_type="text/html")
        results = [{"url": h.url, "title": h.title, "content": h.snippet, "engine": "scripted",
                    "publishedDate": h.date} for h in self._selected()]
        return JSONResponse({"query": request.query_params.get("q"),
                             "number_of_results": len(results), "results": results,
                             "answers": [], "suggestions": []})

    async def _brave(self, request: Request) -> Response:
        failure = await self._record(request)
        if failure is not None:
            return failure
        results = [{"type": "search_result", "title": h.title, "url": h.url,
                    "description": h.snippet, "page_age": h.date}
                   for h in self._selected()]
        return JSONResponse({"type": "search", "query": {"original": request.query_params.get(
            "q")}, "web": {"type": "search", "results": results}})

    async def _posted(self, request: Request) -> Response:
        failure = await self._record(request)
        if failure is not None:
            return failure
        if "x-api-key" in request.headers:  # Exa
            return JSONResponse({"results": [
                {"title": h.title, "url": h.url, "text": h.snippet, "publishedDate": h.date}
                for h in self._selected()]})
        return JSONResponse({"query": self.requests[-1].query, "answer": None, "results": [
            {"url": h.url, "title": h.title, "content": h.snippet, "score": 0.9,
             "raw_content": None} for h in self._selected()],
            "response_time": 0.1, "request_id": "scripted"})
