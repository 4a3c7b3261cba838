"""What the tool-call guard costs (docs/tool-calls.md): the server's work per response, from
upstream chunks to the SSE bytes the client gets (the parser, the guard, the blocks, the
encoding), with TOOL_GUARD=off (the arguments streamed as they come, as before the guard)
against `repair`, in this process, with Claude Code 2.1.332's tools offered.

Cases: a valid Bash call streamed in 8 fragments and in one; a call needing repair (Python
literals, a number as a string); two Reads collapsed onto one index; and a text answer with
the tools offered (the guard must add nothing to it: first text unchanged). The target: a
valid call costs less than 30 µs more.

Run: `.venv/bin/python -m bench.tool_calls` (a few seconds; the machine's load shows in the
figures, the ratio and difference are what to read).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from claude_proxy.conversion.response_converter import StreamConverter
from claude_proxy.conversion.tool_guard import ToolGuard
from claude_proxy.conversion.tool_schemas import OfferedTools
from claude_proxy.sse import encode_events
from claude_proxy.upstream.chat_completions import ChatCompletionsParser

FIXTURE = (Path(__file__).resolve().parents[1] / "tests" / "data" / "fixtures"
           / "claude-code-2.1.332-first-request.json")
TARGET_US = 30.0
"""A valid call may cost this much more than with the guard off (issue 43)."""

Chunk = dict[str, Any]


def chunk(delta: Chunk, finish: str | None = None) -> Chunk:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call_chunks(calls: list[tuple[str, str, list[str]]]) -> list[Chunk]:
    """(id, name, fragments) per call, each fragment its own chunk, then the finish."""
    chunks = [chunk({"tool_calls": [{"index": index, **(
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": piece}}
        if at == 0 else {"function": {"arguments": piece}})}]})
        for index, (call_id, name, pieces) in enumerate(calls) for at, piece in enumerate(pieces)]
    return [*chunks, chunk({}, "tool_calls")]


BASH = json.dumps({"command": "git status && git diff --stat",
                   "description": "Show the working tree status"})
CASES: dict[str, list[Chunk]] = {
    "valid, 8 fragments": call_chunks(
        [("call_1", "Bash", ["", *(BASH[at:at + 12] for at in range(0, len(BASH), 12))])]),
    "valid, 1 fragment": call_chunks([("call_1", "Bash", [BASH])]),
    "repair (literals, a number)": call_chunks(
        [("call_1", "Bash", ["{'command': 'git status', 'timeout': '5000'}"])]),
    "two Reads on one index": call_chunks(
        [("call_1", "Read", ['{"file_path": "/srv/app/main.py"}',
                             '{"file_path": "/srv/app/util.py"}'])]),
    "text, tools offered": [chunk({"role": "assistant", "content": ""}),
                            *(chunk({"content": f"word{n} "}) for n in range(20)),
                            chunk({}, "stop")],
}


def respond(body: dict[str, Any], chunks: list[Chunk], guarded: bool) -> bytes:
    """One response as the relay makes it: each chunk's events encoded as they come."""
    guard = ToolGuard(OfferedTools.of_request(body), lambda report: None) if guarded else None
    converter = StreamConverter("claude-sonnet-4-6", input_tokens=1,
                                sign=lambda thinking, opaque=(): "",
                                parser=ChatCompletionsParser(), guard=guard)
    frames = [encode_events(converter.start())]
    for each in chunks:
        events = converter.feed(each)
        if events:
            frames.append(encode_events(events))
    frames.append(encode_events(converter.finish()))
    return b"".join(frames)


def per_response_us(work: Callable[[], object], rounds: int = 9, batch: float = 0.05) -> float:
    """The best of `rounds` timed batches of about `batch` seconds (the least disturbed by
    the machine's load)."""
    number = 1
    while True:
        started = time.perf_counter()
        for _ in range(number):
            work()
        if time.perf_counter() - started > batch:
            break
        number *= 2
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(number):
            work()
        best = min(best, (time.perf_counter() - started) / number * 1e6)
    return best


def results(scale: float = 1.0) -> dict[str, dict[str, float]]:
    """`scale` below 1 (the smoke test's 0.05) times fewer and shorter batches."""
    body = json.loads(FIXTURE.read_text())["body"]
    turns, batch = max(1, round(5 * scale)), max(0.002, 0.05 * scale)
    measured = {}
    for name, chunks in CASES.items():
        respond(body, chunks, True)  # the validators compiled once, as in a running proxy
        off, on = float("inf"), float("inf")
        for _ in range(turns):  # taking turns, so that the machine's load falls on both alike
            off = min(off, per_response_us(lambda chunks=chunks: respond(body, chunks, False),
                                           rounds=3, batch=batch))
            on = min(on, per_response_us(lambda chunks=chunks: respond(body, chunks, True),
                                         rounds=3, batch=batch))
        measured[name] = {"off_us": round(off, 1), "repair_us": round(on, 1),
                          "added_us": round(on - off, 1)}
    return measured


def report(measured: dict[str, dict[str, float]]) -> str:
    lines = ["tool-call guard, server work per response (µs)   off    repair   added",
             *(f"  {name:45s} {row['off_us']:6.1f} {row['repair_us']:8.1f} "
               f"{row['added_us']:+7.1f}" for name, row in measured.items())]
    valid = measured["valid, 8 fragments"]["added_us"]
    verdict = "ok" if valid < TARGET_US else "OVER"
    lines.append(f"  a valid call adds {valid:+.1f} µs (target < {TARGET_US:.0f}): {verdict}")
    return "\n".join(lines)


def main() -> None:
    sys.stdout.write(report(results()) + "\n")


if __name__ == "__main__":
    main()
