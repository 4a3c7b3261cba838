"""Record what a Claude Code release sends: its first request and the second request of a Bash
tool loop, and a subagent's request (the one that carries `x-claude-code-agent-id`), whole
(method, path, headers, body), as `tests/data/fixtures/claude-code-<version>-
{first-request,tool-loop-second-request,subagent-request}.json` with their provenance.

Claude Code (`$CLAUDE_BIN`, default the Makefile's pin) runs in an isolated HOME against the
proxy, itself in front of the scripted upstream (one `echo` tool call, then an answer); a
recorder in front of the proxy keeps each `POST /v1/messages` as it arrived. The key is a
dummy and is written as `sk-recorded`. Loopback only.

Run: `PYTHONPATH=src .venv/bin/python -m tests.record_claude_code_requests`.

With `--hint-headers`: the subagent run again with `CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`, kept
as `claude-code-<version>-hint-headers.json`: each request's `x-claude-*` headers and model, in
the order they arrived (the request classes the router reads).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app
from tests.claude_code_pin import default_claude_bin, environment
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    chunk,
    echo_loop,
    serve_in_thread,
    stop_server,
    text_stream,
)

FIXTURES = Path(__file__).parent / "data" / "fixtures"
PROMPT = "Run `echo recorded-step` with Bash, then tell me what it printed."
ANSWER = "It printed recorded-step."
AGENT_PROMPT = "Ask a general-purpose agent to say hello, then tell me what it said."
AGENT_ANSWER = "The agent said hello."


class RequestRecorder:
    """ASGI wrapper keeping every Messages request whole, then passing it on unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/messages":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        headers = {key.decode(): value.decode() for key, value in scope["headers"]}
        if "x-api-key" in headers:
            headers["x-api-key"] = "sk-recorded"
        query = scope.get("query_string", b"").decode()
        self.requests.append({"method": scope["method"],
                              "path": scope["path"] + (f"?{query}" if query else ""),
                              "headers": headers, "body": json.loads(raw)})
        delivered = False

        async def replay() -> dict[str, Any]:
            nonlocal delivered
            if delivered:
                message: dict[str, Any] = await receive()
                return message
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)


def agent_loop(body: dict[str, Any]) -> Reply:
    """The main loop calls the Agent tool once, then answers; the subagent (no Agent tool of
    its own) says hello."""
    if "Agent" not in {tool.get("function", {}).get("name") for tool in body.get("tools", [])}:
        return text_stream(["hello"])
    if any(message["role"] == "tool" for message in body["messages"]):
        return text_stream([AGENT_ANSWER])
    arguments = json.dumps({"description": "Say hello", "prompt": "Say hello.",
                            "subagent_type": "general-purpose", "run_in_background": False})
    return Reply(events=[
        chunk({"tool_calls": [{"index": 0, "id": "call_agent_1", "type": "function",
                               "function": {"name": "Agent", "arguments": arguments}}]}),
        chunk({}, "tool_calls")])


def record(claude_bin: Path, prompt: str = PROMPT, allowed: str = "Bash(echo:*)",
           respond: Any = None, extra_env: dict[str, str] | None = None,
           runs: list[list[str]] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Claude Code's version and the Messages requests of one run of `prompt` (`extra_env`:
    more variables for Claude Code; `runs`: other command lines, one after the other in the
    same HOME and folder)."""
    version = subprocess.run([str(claude_bin), "--version"], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()[0]
    upstream = ScriptedUpstream().start()
    upstream.responder = respond or echo_loop(2, ANSWER)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        settings = Settings(openai_base_url=upstream.base_url, openai_api_key="sk-record",
                            provider="openai", responses_api=False,  # scripts: Chat
                            log_file=str(tmp / "proxy.log"))
        recorder = RequestRecorder(create_app(settings))
        sock = bind_loopback()
        server, thread = serve_in_thread(recorder, sock)
        try:
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            work = tmp / "work"
            for name in ("home", "work", "tmp"):
                (tmp / name).mkdir()
            for args in runs or [["-p", prompt, "--output-format", "stream-json", "--verbose",
                                  "--no-session-persistence", "--allowedTools", allowed]]:
                subprocess.run([str(claude_bin), *args],
                               env={**environment(url, tmp / "home", tmp / "tmp"),
                                    **(extra_env or {})}, cwd=work,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=300, check=True)
        finally:
            stop_server(server, thread)
            upstream.stop()
    return version, recorder.requests


HINT_PROMPT = AGENT_PROMPT
COMPACT_ANSWER = "<summary>The user said hello.</summary>"


def record_hint_headers(claude_bin: Path) -> Path:
    """The hint headers of a main loop that calls a subagent, then of a manual `/compact` of
    a session, as Claude Code sent them."""
    hints = {"CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1"}
    version, requests = record(claude_bin, HINT_PROMPT, "Agent", agent_loop, hints)
    _, compacted = record(claude_bin, respond=lambda _body: text_stream([COMPACT_ANSWER]),
                          extra_env=hints, runs=[["-p", "hello"],
                                                 ["-p", "--continue", "/compact"]])
    requests += compacted
    path = FIXTURES / f"claude-code-{version}-hint-headers.json"
    provenance = {
        "claude_code": version, "recorded": datetime.date.today().isoformat(),
        "how": "tests/record_claude_code_requests.py --hint-headers: the real binary (-p, "
               "stream-json, --allowedTools Agent, isolated HOME, CLAUDE_CODE_GATEWAY_HINT_"
               "HEADERS=1) against the proxy and the scripted upstream on loopback, then "
               "`-p hello` and `-p --continue /compact` in one HOME; each request's x-claude-* "
               "headers and model as they arrived",
        "prompt": HINT_PROMPT}
    kept = [{"model": request["body"].get("model"),
             "headers": {name: value for name, value in request["headers"].items()
                         if name.startswith("x-claude")}} for request in requests]
    path.write_text(json.dumps({"provenance": provenance, "requests": kept}, indent=1) + "\n",
                    encoding="utf-8")
    return path


def main() -> None:
    claude_bin = default_claude_bin()
    if "--hint-headers" in sys.argv[1:]:
        print(f"written {record_hint_headers(claude_bin)}")
        return
    version, requests = record(claude_bin)
    loop = [request for request in requests if request["body"].get("tools")]
    if len(loop) < 2:
        raise SystemExit(f"expected two tool-loop requests, got {len(loop)} of {len(requests)}")
    provenance = {
        "claude_code": version,
        "recorded": datetime.date.today().isoformat(),
        "how": "tests/record_claude_code_requests.py: the real binary (-p, stream-json, "
               "--allowedTools Bash(echo:*), isolated HOME, CLAUDE_CODE_DISABLE_NONESSENTIAL_"
               "TRAFFIC=1) against the proxy and the scripted upstream on loopback; request "
               "kept as it arrived, the dummy key replaced",
        "prompt": PROMPT,
    }
    _, agent_run = record(claude_bin, AGENT_PROMPT, "Agent", agent_loop)
    subagent = [request for request in agent_run
                if "x-claude-code-agent-id" in request["headers"]]
    if not subagent:
        raise SystemExit(f"no request with x-claude-code-agent-id in {len(agent_run)}")
    for name, request, prompt in (("first-request", loop[0], PROMPT),
                                  ("tool-loop-second-request", loop[1], PROMPT),
                                  ("subagent-request", subagent[0], AGENT_PROMPT)):
        path = FIXTURES / f"claude-code-{version}-{name}.json"
        path.write_text(json.dumps({"provenance": {**provenance, "prompt": prompt}, **request},
                                   ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"written {path}")


if __name__ == "__main__":
    main()
