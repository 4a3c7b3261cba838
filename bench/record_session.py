"""Record a 10-turn Claude Code session for the prompt-caching figure of the benchmark.

Runs the real Claude Code (`$CLAUDE_BIN`, installed by `make test`) against the proxy, itself
in front of a scripted upstream that asks for nine `echo` tool calls and then answers. Every
`POST /v1/messages` Claude Code sends is kept as it arrived (the session header and the body)
in `tests/data/fixtures/claude-code-2.1.328-session-10-turns.json`, which `bench/session.py`
replays.

Run: `.venv/bin/python -m bench.record_session` (needs Claude Code; loopback only).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.claude_code_pin import default_claude_bin
from tests.record_claude_code_requests import RequestRecorder
from tests.scripted_upstream import (
    ScriptedUpstream,
    bind_loopback,
    echo_loop,
    serve_in_thread,
    stop_server,
)

from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app

ROOT = Path(__file__).resolve().parent.parent
SESSION_FILE = ROOT / "tests/data/fixtures/claude-code-2.1.328-session-10-turns.json"
CLAUDE_BIN = default_claude_bin()
TURNS = 10
PROMPT = ("Run `echo step-1` with Bash, then keep going: each time run echo with the next "
          "step number, until step 9, then tell me you are done.")


def record() -> list[dict[str, Any]]:
    upstream = ScriptedUpstream().start()
    upstream.responder = echo_loop(TURNS, "All 9 steps ran; the last one printed step-9.")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(openai_base_url=upstream.base_url, openai_api_key="sk-record",
                            provider="openai", log_file=str(Path(tmp) / "proxy.log"))
        recorder = RequestRecorder(create_app(settings))
        sock = bind_loopback()
        server, thread = serve_in_thread(recorder, sock)
        try:
            run_claude(f"http://127.0.0.1:{sock.getsockname()[1]}", Path(tmp))
        finally:
            stop_server(server, thread)
            upstream.stop()
    return [{"session_id": request["headers"].get("x-claude-code-session-id"),
             "body": request["body"]} for request in recorder.requests]


def run_claude(url: str, tmp: Path) -> None:
    for folder in ("home", "work", "tmp"):
        (tmp / folder).mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp / "home"),
           "TMPDIR": str(tmp / "tmp"), "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": "sk-claude-code-record",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
    subprocess.run([str(CLAUDE_BIN), "-p", PROMPT, "--output-format", "stream-json",
                    "--verbose", "--no-session-persistence", "--allowedTools", "Bash(echo:*)"],
                   env=env, cwd=tmp / "work", stdin=subprocess.DEVNULL, capture_output=True,
                   text=True, timeout=300, check=True)


def main() -> None:
    requests = record()
    turns = [request for request in requests if request["body"].get("tools")]
    if len(turns) != TURNS:
        raise SystemExit(f"expected {TURNS} turns with tools, got {len(turns)} "
                         f"({len(requests)} requests)")
    SESSION_FILE.parent.mkdir(parents=True, exist_ok=True)
    SESSION_FILE.write_text(json.dumps({"claude_code": "2.1.328", "prompt": PROMPT,
                                        "turns": turns}, ensure_ascii=False, indent=1) + "\n",
                            encoding="utf-8")
    print(f"{len(turns)} turns written to {SESSION_FILE}")


if __name__ == "__main__":
    main()
