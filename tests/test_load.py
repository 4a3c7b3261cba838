"""A bounded load test: 500 concurrent streaming requests through the proxy (a real
`claude-proxy` process) against the scripted upstream, each checked for exact content and
stream grammar. The proxy's memory after the run is reported (not asserted: speed and size
targets belong to the benchmark in bench/)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import UPSTREAM_KEY, free_port
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk
from tests.sse_grammar import accumulate, check_grammar, parse_sse

STREAMS = 500
CHUNKS = 20


def pieces_for(tag: str) -> list[str]:
    return [f"{tag}:{index} " for index in range(CHUNKS)]


def respond(body: dict[str, Any]) -> Reply:
    tag = body["messages"][-1]["content"]
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces_for(tag)]
    events += [chunk({}, "stop"), chunk(None, None, {"prompt_tokens": 5,
                                                      "completion_tokens": CHUNKS,
                                                      "total_tokens": 5 + CHUNKS})]
    return Reply(events=events)


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


@pytest.fixture
def proxy_process(upstream: ScriptedUpstream, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {**os.environ, "OPENAI_API_KEY": UPSTREAM_KEY, "OPENAI_BASE_URL": upstream.base_url,
           "PROVIDER": "openai", "LOG_FILE": str(tmp_path / "load.log"), "LOG_LEVEL": "INFO",
           # A Chat Completions model (the openai profile's default takes the Responses API).
           "BIG_MODEL": "gpt-4o", "MIDDLE_MODEL": "gpt-4o", "SMALL_MODEL": "gpt-4o-mini"}
    process = subprocess.Popen([sys.executable, "-m", "claude_proxy", "--host", "127.0.0.1",
                                "--port", str(port)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "Uvicorn running on" in line:
            break
    # Keep draining its output (one access line per request), or the pipe fills and blocks it.
    threading.Thread(target=process.stdout.read, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_500_concurrent_streams(proxy_process: tuple[str, int], upstream: ScriptedUpstream,
                                capsys: pytest.CaptureFixture[str]) -> None:
    url, pid = proxy_process
    upstream.responder = respond
    idle = memory_kib(pid)

    async def one(client: httpx.AsyncClient, number: int) -> None:
        tag = f"stream-{number}"
        response = await client.post(f"{url}/v1/messages", json={
            "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": tag}]})
        assert response.status_code == 200
        events = parse_sse(response.content)
        check_grammar(events)
        message = accumulate(events)
        assert message["content"] == [{"type": "text", "text": "".join(pieces_for(tag))}]
        assert message["usage"]["output_tokens"] == CHUNKS

    async def run_all() -> list[BaseException | None]:
        limits = httpx.Limits(max_connections=STREAMS + 10)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            return await asyncio.gather(*(one(client, n) for n in range(STREAMS)),
                                        return_exceptions=True)

    outcomes = asyncio.run(run_all())
    errors = [outcome for outcome in outcomes if outcome is not None]
    after = memory_kib(pid)
    with capsys.disabled():
        print(f"\nload: {STREAMS} concurrent streams x {CHUNKS} chunks, {len(errors)} errors; "
              f"proxy RSS idle {idle['VmRSS'] / 1024:.1f} MiB, after {after['VmRSS'] / 1024:.1f} "
              f"MiB, peak {after['VmHWM'] / 1024:.1f} MiB")
    assert errors == [], errors[:3]
    assert len(upstream.requests) == STREAMS
