"""The proxy's request path in one process, for profiles and instruction counts that do not
move with the machine's load (`python -m bench.request_path --size 800 --repeat 50`).

The real application (`create_app`, its middleware, endpoint, service and conversion) serves
a grown Claude Code request (bench/conversation.py) through httpx's ASGI transport; the
upstream is an httpx mock transport answering a short chat completion. With `--profile` it
prints cProfile's top functions; with `--callgrind` it runs once warmed and then `--repeat`
times with nothing else, for `valgrind --tool=callgrind --collect-atstart=no
--toggle-collect=...`-free use: the whole process is counted, so compare two runs with
different `--repeat` to take the warm-up out.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import time
from typing import Any

import httpx
import orjson

from bench.conversation import grown
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app

SESSION = "4c37c699-8b25-47d8-9a6b-65679940a1ec"
ANSWER = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "model": "gpt-4o",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "tok tok tok tok"}}],
    "usage": {"prompt_tokens": 1000, "completion_tokens": 4, "total_tokens": 1004}})


def upstream(request: httpx.Request) -> httpx.Response:
    """A short answer whose prompt tokens are a quarter of the request's bytes."""
    answer = orjson.loads(ANSWER)
    answer["usage"]["prompt_tokens"] = len(request.content) // 4
    return httpx.Response(200, content=orjson.dumps(answer),
                          headers={"content-type": "application/json"})


async def run(size_kb: float, repeat: int, profile: bool, session: bool) -> dict[str, Any]:
    settings = Settings(openai_api_key="sk-bench", provider="openai",
                        openai_base_url="http://upstream.invalid/v1", _env_file=None,
                        big_model="gpt-4.1", middle_model="gpt-4.1", small_model="gpt-4.1")
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    content = orjson.dumps(grown(size_kb))
    headers = {"content-type": "application/json"}
    if session:
        headers["x-claude-code-session-id"] = SESSION
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            async def once() -> None:
                response = await client.post("/v1/messages", content=content, headers=headers)
                assert response.status_code == 200, response.text
            for _ in range(3):
                await once()
            profiler = cProfile.Profile() if profile else None
            started = time.process_time()
            if profiler:
                profiler.enable()
            for _ in range(repeat):
                await once()
            if profiler:
                profiler.disable()
                shown = os.environ.get("PROFILE_FILTER", "")  # e.g. claude_proxy
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(shown, 60)
            spent = time.process_time() - started
    return {"size_kb": round(len(content) / 1000, 1), "repeat": repeat,
            "cpu_ms_per_request": round(spent / max(repeat, 1) * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=800, help="conversation size in KB")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-session", action="store_true",
                        help="send no x-claude-code-session-id")
    args = parser.parse_args()
    print(orjson.dumps(asyncio.run(run(args.size, args.repeat, args.profile,
                                       not args.no_session))).decode())


if __name__ == "__main__":
    main()
