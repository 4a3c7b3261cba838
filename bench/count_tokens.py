"""How right `count_tokens` is: its answer before each turn of a recorded Claude Code session,
against the prompt tokens the upstream then reports for that turn.

The recorded 10-turn Claude Code 2.1.328 session (`tests/data/fixtures/`) is replayed through a
real proxy (uvicorn on loopback) to a scripted upstream whose tokenizer is not the proxy's: it
reports `cl100k_base` tokens of the JSON it receives, where the proxy, for a model it has no
tokenizer for, starts from four characters a token. Before each turn the same body (and session
header) goes to `count_tokens`; the error is (counted - reported) / reported. Turn 1 shows the
plain estimate; from turn 2 on, the session's calibration (routing/calibration.py) applies.

Run: `.venv/bin/python -m bench.count_tokens` (loopback only; a second or two).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import toktok
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    serve_in_thread,
    stop_server,
    text_stream,
)

from bench.session import SESSION_HEADER, load_turns
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app

TARGET_ERROR = 0.05
"""count_tokens within 5 % of the upstream's next reported prompt tokens, after turn 1."""
COUNT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking",
                "output_config")


@dataclass(frozen=True)
class Turn:
    number: int
    counted: int
    reported: int

    @property
    def error(self) -> float:
        return (self.counted - self.reported) / self.reported


def upstream_tokens(body: dict[str, Any]) -> int:
    """The scripted upstream's own count of a request it receives (its 'tokenizer')."""
    sent = json.dumps({"messages": body.get("messages"), "tools": body.get("tools")},
                      ensure_ascii=False)
    return int(toktok.batch_count([sent], "cl100k_base", threads=1)[0])


def reporting(body: dict[str, Any]) -> Reply:
    """Answers every request, reporting its prompt tokens as a real upstream does."""
    prompt = upstream_tokens(body)
    return text_stream(["ok"], usage={"prompt_tokens": prompt, "completion_tokens": 1,
                                      "total_tokens": prompt + 1})


def replay(url: str, upstream: ScriptedUpstream, turns: list[dict[str, Any]]) -> list[Turn]:
    """count_tokens, then the turn itself, for each recorded turn in order."""
    results = []
    with httpx.Client(timeout=60) as client:
        for number, turn in enumerate(turns, 1):
            headers = {SESSION_HEADER: turn["session_id"]}
            body = turn["body"]
            counted = client.post(f"{url}/v1/messages/count_tokens", headers=headers, json={
                key: body[key] for key in COUNT_FIELDS if key in body}).json()["input_tokens"]
            with client.stream("POST", f"{url}/v1/messages", json=body,
                               headers=headers) as response:
                response.raise_for_status()
                response.read()
            results.append(Turn(number, counted, upstream_tokens(upstream.requests[-1])))
    return results


def run(log_dir: Path) -> list[Turn]:
    """The whole measurement, with its own upstream and proxy on loopback."""
    upstream = ScriptedUpstream().start()
    upstream.responder = reporting
    settings = Settings(openai_base_url=upstream.base_url, openai_api_key="sk-bench-upstream",
                        provider="openai", big_model="bench-model", middle_model="bench-model",
                        small_model="bench-model", log_file=str(log_dir / "proxy.log"))
    sock = bind_loopback()
    server, thread = serve_in_thread(create_app(settings), sock)
    try:
        return replay(f"http://127.0.0.1:{sock.getsockname()[1]}", upstream, load_turns())
    finally:
        stop_server(server, thread)
        upstream.stop()


def table(turns: list[Turn]) -> str:
    lines = ["turn  count_tokens  upstream reported  error"]
    lines += [f"{t.number:>4}  {t.counted:>12}  {t.reported:>17}  {t.error:+7.2%}" for t in turns]
    worst = max(abs(t.error) for t in turns[1:])
    lines.append(f"worst after turn 1: {worst:.2%} (target {TARGET_ERROR:.0%})")
    return "\n".join(lines)


def results(workdir: Path) -> dict[str, Any]:
    """The figure for `make bench`'s JSON: each turn's error, the worst after turn 1."""
    turns = run(workdir)
    return {"turns": [{"turn": t.number, "count_tokens": t.counted, "reported": t.reported,
                       "error": round(t.error, 4)} for t in turns],
            "worst_after_first": round(max(abs(t.error) for t in turns[1:]), 4),
            "target": TARGET_ERROR}


def report(figure: dict[str, Any]) -> str:
    """The table of a `results` figure (as read back from the JSON)."""
    return table([Turn(t["turn"], t["count_tokens"], t["reported"]) for t in figure["turns"]])


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        turns = run(Path(folder))
    print(table(turns))
    return 0 if max(abs(t.error) for t in turns[1:]) <= TARGET_ERROR else 1


if __name__ == "__main__":
    sys.exit(main())
