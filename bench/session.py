"""The session figure: how much of a Claude Code session's input is read from cache.

A recorded 10-turn Claude Code 2.1.328 session (`tests/data/fixtures/`, made by
`bench/record_session.py`) is replayed turn by turn through a real proxy process to a scripted
upstream that caches like a real one (`bench/cache_upstream.py`), and reported from the usage
Claude Code would see (the final `message_delta`). DIRECT sends the same recorded requests to
the same cache model in Anthropic format: what the session gets from a provider's own API.

The figure is the share of input tokens (input + cache reads + cache writes) read from cache
over turns 2-10 (turn 1 has nothing to read).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.procs import start_proxy, start_upstream

SESSION_FILE = (Path(__file__).resolve().parent.parent / "tests" / "data" / "fixtures"
                / "claude-code-2.1.328-session-10-turns.json")
SESSION_HEADER = "X-Claude-Code-Session-Id"
TARGET_SHARE = 0.9


@dataclass(frozen=True)
class Upstream:
    """One upstream shape: the cache model it runs and the proxy settings that reach it."""

    name: str
    cache: str
    settings: dict[str, str]

    @property
    def label(self) -> str:
        return self.name.replace(":", "-")

    def proxy_env(self) -> dict[str, str]:
        model = self.settings["MODEL"]
        env = {key: value for key, value in self.settings.items() if key != "MODEL"}
        return {**env, "BIG_MODEL": model, "MIDDLE_MODEL": model, "SMALL_MODEL": model}


UPSTREAMS = (
    Upstream("openai", "prefix", {"PROVIDER": "openai", "MODEL": "gpt-4o"}),
    Upstream("deepseek", "prefix", {"PROVIDER": "deepseek", "MODEL": "deepseek-chat"}),
    Upstream("openrouter-anthropic", "breakpoints",
             {"PROVIDER": "openrouter", "MODEL": "anthropic/claude-sonnet-4.6"}),
    Upstream("openrouter-google", "breakpoints",
             {"PROVIDER": "openrouter", "MODEL": "google/gemini-2.5-pro"}),
    Upstream("dashscope", "breakpoints", {"PROVIDER": "dashscope", "MODEL": "qwen3-max"}),
    # The control: breakpoints dropped (as before prompt caching), so the figure can fail.
    Upstream("control:cache-off", "breakpoints",
             {"PROVIDER": "openrouter", "MODEL": "anthropic/claude-sonnet-4.6",
              "PROMPT_CACHE": "off"}),
)
# The upstreams whose share must reach TARGET_SHARE (the two cache kinds).
TARGETED = ("openai", "openrouter-anthropic")


def load_turns() -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = json.loads(SESSION_FILE.read_text(encoding="utf-8"))["turns"]
    return turns


def sse_payloads(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON data of each SSE event (the proxy writes one `data:` line per event)."""
    for line in lines:
        if line.startswith("data:"):
            yield orjson.loads(line[5:].strip())


def streamed_usage(client: httpx.Client, url: str, turn: dict[str, Any]) -> dict[str, int]:
    """Send one recorded turn through the proxy; the usage of its final message_delta."""
    headers = {SESSION_HEADER: turn["session_id"]}
    usage: dict[str, int] = {}
    with client.stream("POST", f"{url}/v1/messages", json=turn["body"],
                       headers=headers) as response:
        response.raise_for_status()
        for event in sse_payloads(response.iter_lines()):
            if event.get("type") == "message_delta":
                usage = event["usage"]
    return usage


def direct_usage(client: httpx.Client, url: str, turn: dict[str, Any]) -> dict[str, int]:
    response = client.post(f"{url}/v1/messages", json=turn["body"])
    response.raise_for_status()
    usage: dict[str, int] = response.json()["usage"]
    return usage


def share(usages: list[dict[str, int]]) -> dict[str, Any]:
    """Cache share over turns 2.. (and per turn), from Anthropic usage objects."""
    def prompt(usage: dict[str, int]) -> int:
        return (usage["input_tokens"] + usage["cache_read_input_tokens"]
                + usage["cache_creation_input_tokens"])

    later = usages[1:]
    total = sum(prompt(usage) for usage in later)
    read = sum(usage["cache_read_input_tokens"] for usage in later)
    return {"share_after_first": round(read / total, 4) if total else 0.0,
            "prompt_tokens_after_first": total, "cache_read_after_first": read,
            "cache_write_total": sum(u["cache_creation_input_tokens"] for u in usages),
            "per_turn": [round(u["cache_read_input_tokens"] / prompt(u), 3) if prompt(u) else 0
                         for u in usages]}


def replay(send: Callable[[dict[str, Any]], dict[str, int]],
           turns: list[dict[str, Any]]) -> dict[str, Any]:
    return share([send(turn) for turn in turns])


def run_session(workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Every upstream shape: PROXY and DIRECT cache shares."""
    turns = load_turns()
    results: dict[str, Any] = {"turns": len(turns)}
    with httpx.Client(trust_env=False, timeout=60) as client:
        for upstream in UPSTREAMS:
            log(f"  session via {upstream.name} ({upstream.cache} cache)")
            with start_upstream(workdir, module="bench.cache_upstream",
                                args=("--mode", upstream.cache),
                                name=f"cache-{upstream.label}") as server:
                with start_proxy(workdir, server.url, env=upstream.proxy_env(),
                                 name=f"session-{upstream.label}") as proxy:
                    proxied = replay(partial(streamed_usage, client, proxy.url), turns)
                direct = replay(partial(direct_usage, client, server.url.removesuffix("/v1")),
                                turns)
            results[upstream.name] = {"cache": upstream.cache,
                                      "model": upstream.settings["MODEL"],
                                      "proxy": proxied, "direct": direct}
    return results


def table(results: dict[str, Any]) -> str:
    lines = [f"Session: {results['turns']} recorded Claude Code turns, share of input tokens "
             "read from cache after turn 1",
             f"{'upstream':<22} {'cache':<12} {'model':<28} {'PROXY':>7} {'DIRECT':>7} "
             f"{'writes':>8}"]
    for name, row in results.items():
        if not isinstance(row, dict):
            continue
        lines.append(f"{name:<22} {row['cache']:<12} {row['model']:<28} "
                     f"{row['proxy']['share_after_first']:>7.1%} "
                     f"{row['direct']['share_after_first']:>7.1%} "
                     f"{row['proxy']['cache_write_total']:>8}")
    return "\n".join(lines)
