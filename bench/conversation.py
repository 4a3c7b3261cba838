"""A recorded Claude Code request grown to a long conversation, as a session grows.

Claude Code sends the whole conversation on every turn: 50 KB at the first and hundreds of KB
later. `grown` takes the recorded tool-loop request (Claude Code 2.1.332) and adds file-read
turns until the body reaches a size: each an assistant `Read` tool call and the user's
~4 KB tool result (source lines, each after its number and a tab, as Claude Code 2.1.332
sends a Read's result: tests/test_claude_code.py checks both), with the
`cache_control` marker moved to the last block as Claude Code moves it. The last message
carries the benchmark upstream's spec (`BENCH n=… iv=…`) as a text block after the result,
so that the fast upstream knows what to answer. Deterministic: the same size gives the same
bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

FIXTURE = (Path(__file__).resolve().parent.parent / "tests" / "data" / "fixtures"
           / "claude-code-2.1.332-tool-loop-second-request.json")
RESULT_BYTES = 4096
SIZES_KB = (100, 850)


def recorded() -> dict[str, Any]:
    """The recorded request's body."""
    body: dict[str, Any] = orjson.loads(FIXTURE.read_bytes())["body"]
    return body


def file_text(turn: int, size: int = RESULT_BYTES) -> str:
    """What a Read returns: numbered lines of a source file (different for each turn)."""
    lines, total, number = [], 0, 1
    while total < size:
        line = (f"{number}\t    value_{turn}_{number} = compute(items[{number}], "
                f"scale={turn * 7 + number % 13}, name=\"row-{turn}-{number}\")")
        lines.append(line)
        total += len(line) + 1
        number += 1
    return "\n".join(lines)


def read_turn(turn: int) -> list[dict[str, Any]]:
    """One file-read turn: the assistant's Read call and the user's tool result."""
    call_id = f"toolu_bench_{turn:05d}"
    return [
        {"role": "assistant", "content": [
            {"type": "text", "text": f"Reading module {turn}."},
            {"type": "tool_use", "id": call_id, "name": "Read",
             "input": {"file_path": f"/home/user/project/src/module_{turn}.py"}}]},
        {"role": "user", "content": [
            {"tool_use_id": call_id, "type": "tool_result", "content": file_text(turn)}]},
    ]


def grown(size_kb: float, spec: str = "", stream: bool = False) -> dict[str, Any]:
    """The recorded request grown by file-read turns to about `size_kb` KB of JSON, ending
    with `spec` as the last user message's text (Claude Code's shape otherwise)."""
    body = recorded()
    body["stream"] = stream
    messages: list[dict[str, Any]] = body["messages"]
    for block in messages[-1]["content"]:
        block.pop("cache_control", None)
    base = len(orjson.dumps(body))
    turn_bytes = len(orjson.dumps(read_turn(1)))
    for turn in range(1, max(0, round((size_kb * 1000 - base) / turn_bytes)) + 1):
        messages.extend(read_turn(turn))
    last = messages[-1]["content"]
    last[-1]["cache_control"] = {"type": "ephemeral"}
    if spec:
        last.append({"type": "text", "text": spec})
    return body


def session_turns(size_kb: float, count: int, spec: str, stream: bool) -> list[bytes]:
    """`count` requests of one session from about `size_kb` KB on, as Claude Code sends them:
    each one file-read turn longer than the last (the marker moved to the new last block),
    serialized, each ending with `spec`."""
    body = grown(size_kb, stream=stream)
    messages: list[dict[str, Any]] = body["messages"]
    requests = []
    for turn in range(count):
        if turn:
            messages[-1]["content"][-1].pop("cache_control", None)
            messages.extend(read_turn(100_000 + turn))
            messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        last = {**messages[-1], "content": [*messages[-1]["content"],
                                            {"type": "text", "text": spec}]}
        requests.append(orjson.dumps({**body, "messages": [*messages[:-1], last]}))
    return requests
