"""`claude-proxy doctor` against a slow local server: a stand-in for llama-server running a
small base model (Gemma 3 270M) at about 20 tokens a second, which rambles to whatever limit
it is given, whose chat template drops tools and whose context is 32768 tokens.

What is asserted is what was read, not how long it took: each probe asks for few tokens, the
streamed ones are closed once their verdict is known (the server counts the tokens it sent
before the client went away), each line is on stdout as its check completes (the server holds
the tools probe until the test has read the reasoning line), and a small `--time-limit` gives
its line.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import clean_env
from tests.scripted_upstream import LoopbackServer, chunk

TOKEN_SECONDS = 0.05  # 20 tokens a second
PROMPT_TOKENS = 41  # the same with a tool or without: the template drops tools
WORD = "lorem "
PROPS = {"default_generation_settings": {"n_ctx": 32768}, "build_info": "b1-slow",
         "chat_template": "{{ messages }}", "total_slots": 1}


@dataclass
class Probe:
    """One request as the server saw it: what it was for, what it asked, what it got."""

    kind: str
    max_tokens: int
    sent: int = 0
    closed_early: bool = False


def kind_of(body: dict[str, Any]) -> str:
    """Which probe a request is (the template measure asks for one token)."""
    if "17 * 23" in json.dumps(body["messages"]):
        return "reasoning"
    measure = (body.get("max_tokens") or body.get("max_completion_tokens")) == 1
    if body.get("tools"):
        return "template with a tool" if measure else "tools"
    return "template" if measure else "basic"


class SlowLlamaServer(LoopbackServer):
    """Generates a token every TOKEN_SECONDS up to max_tokens, streamed or not. `hold_tools`:
    the tools probe waits for this event (set by the test) before it answers."""

    def __init__(self) -> None:
        self.probes: list[Probe] = []
        self.hold_tools: threading.Event | None = None
        self.held_until_released: bool | None = None
        self.app = Starlette(routes=[
            Route("/props", lambda _: JSONResponse(PROPS, headers={"Server": "llama.cpp"})),
            Route("/v1/chat/completions", self._complete, methods=["POST"])])

    async def _complete(self, request: Request) -> Response:
        body = json.loads(await request.body())
        probe = Probe(kind_of(body), int(body.get("max_tokens") or
                                         body.get("max_completion_tokens") or 0))
        self.probes.append(probe)
        if probe.kind == "tools" and self.hold_tools is not None:
            released = await asyncio.to_thread(self.hold_tools.wait, 30)
            self.held_until_released = released
        if body.get("stream"):
            return StreamingResponse(self._tokens(probe), media_type="text/event-stream",
                                     headers={"Server": "llama.cpp"})
        await asyncio.sleep(probe.max_tokens * TOKEN_SECONDS)
        probe.sent = probe.max_tokens
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": probe.max_tokens,
                 "total_tokens": PROMPT_TOKENS + probe.max_tokens}
        return JSONResponse({
            "id": "chatcmpl-slow", "object": "chat.completion", "created": 1, "model": "gemma",
            "choices": [{"index": 0, "finish_reason": "length", "message": {
                "role": "assistant", "content": WORD * probe.max_tokens}}],
            "usage": usage}, headers={"Server": "llama.cpp"})

    async def _tokens(self, probe: Probe) -> AsyncIterator[bytes]:
        def event(data: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(data)}\n\n".encode()

        try:
            yield event(chunk({"role": "assistant", "content": None}))
            for _ in range(probe.max_tokens):
                await asyncio.sleep(TOKEN_SECONDS)
                yield event(chunk({"content": WORD}))
                probe.sent += 1
            yield event(chunk({}, "length"))
            yield b"data: [DONE]\n\n"
        except BaseException:
            probe.closed_early = True  # the client went away
            raise


@pytest.fixture
def slow_server() -> Any:
    server = SlowLlamaServer().start()
    yield server
    server.stop()


def doctor(tmp_path: Path, server: SlowLlamaServer, *args: str) -> subprocess.Popen[str]:
    env = clean_env(tmp_path, OPENAI_API_KEY="k", PROVIDER="llamacpp",
                    OPENAI_BASE_URL=f"http://127.0.0.1:{server.port}/v1",
                    BIG_MODEL="gemma", MIDDLE_MODEL="gemma", SMALL_MODEL="gemma")
    return subprocess.Popen([sys.executable, "-m", "claude_proxy", "doctor", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


EXPECTED = [
    "    configuration  ok    key set, dialect chat_template_kwargs, passback "
    "reasoning_content, reasoning with tools on",
    "  gemma (opus, sonnet, haiku)",
    "    reachable      ok",
    "    auth           ok",
    "    model exists   ok",
    "    reasoning      warn  sent {'chat_template_kwargs': {'enable_thinking': True, "
    "'thinking': True}}; no reasoning text came back",
    "    tools          ok    accepted (the model answered without calling the tool)",
    f"    template       FAIL  the chat template drops tools ({PROMPT_TOKENS} prompt tokens "
    "with and without one): give llama-server a template that renders them "
    "(--chat-template-file)",
    "    context        warn  n_ctx 32768: sessions will compact early; start llama-server "
    "with -c 65536 (or more)",
]


def test_doctor_reads_little_and_prints_each_line_as_it_completes(
        tmp_path: Path, slow_server: SlowLlamaServer) -> None:
    slow_server.hold_tools = threading.Event()
    process = doctor(tmp_path, slow_server)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("    reasoning"):
            slow_server.hold_tools.set()  # read while the tools probe was still held
    assert process.wait(timeout=60) == 1, (lines, process.stderr.read())  # type: ignore
    assert slow_server.held_until_released is True
    assert lines[0].startswith("claude-proxy doctor: 1 provider")
    assert lines[1].endswith("(profile llamacpp, llama-server b1-slow)")
    assert lines[2:2 + len(EXPECTED)] == EXPECTED
    assert lines[-1] == "Claude Code will NOT work yet: fix the FAIL lines above."
    probes = {probe.kind: probe for probe in slow_server.probes}
    assert list(probes) == ["basic", "reasoning", "tools", "template", "template with a tool"]
    basic, reasoning, tools = probes["basic"], probes["reasoning"], probes["tools"]
    # Few tokens asked; the reasoning stream closed at its verdict (64 characters of answer:
    # 11 words of 256 asked).
    assert basic.max_tokens == 8 and tools.max_tokens == 64
    assert reasoning.closed_early and reasoning.sent <= 12 and reasoning.max_tokens == 256
    assert probes["template"].max_tokens == probes["template with a tool"].max_tokens == 1


def test_the_time_limit_says_what_it_cut_how_fast_the_server_was_and_gives_no_verdict(
        tmp_path: Path, slow_server: SlowLlamaServer) -> None:
    """The tools probe alone takes 64 tokens at 20 a second: a 1 s limit cuts the checks.
    The report says which were not run, the speed of the probes that finished (the basic
    request's 8 tokens), and the --time-limit that would let them all finish at that speed
    (its 330 tokens at most, half as long again, rounded up to ten seconds); it judges
    nothing it did not check."""
    process = doctor(tmp_path, slow_server, "--time-limit", "1")
    out, _ = process.communicate(timeout=60)
    lines = out.splitlines()
    assert process.returncode == 3, out
    cut = next(line for line in lines if line.startswith("    time limit"))
    found = re.fullmatch(
        r"    time limit     warn  1 s reached for provider llamacpp \(--time-limit\): not "
        r"checked: gemma \(after its (model exists|reasoning) check\); the server answered at "
        r"([0-9.]+) tokens/s; --time-limit (\d+) should let them finish \(330 tokens at most\)",
        cut)
    assert found is not None, cut
    rate, limit = float(found.group(2)), int(found.group(3))
    assert limit == max(1, math.ceil(330 / rate * 1.5 / 10) * 10)
    assert "    tools" not in out and "    template" not in out  # cut, never judged
    assert "FAIL" not in out and "NOT work" not in out
    assert lines[-1] == ("No verdict: the time limit cut the checks of llamacpp (see its time "
                         "limit line); nothing failed before it.")
