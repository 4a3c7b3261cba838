"""The team-key commands: `claude-proxy keys new NAME`, `claude-proxy usage`, and
`claude-proxy statusline` (one line for Claude Code's `statusLine` setting).

`usage` and `statusline` ask a running proxy (`--url`, else ANTHROPIC_BASE_URL, else
http://127.0.0.1:PORT) with the key in ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN): the
administrator's key shows every key, a person's key only itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from claude_proxy.config.key_specs import key_table, new_key
from claude_proxy.keys.usage_api import GROUPS

COMMANDS = ("keys", "usage", "statusline")
STATUSLINE_TIMEOUT = 2.0
"""Claude Code refreshes the status line at most every 300 ms; a slow proxy must not hang it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="claude-proxy")
    commands = parser.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("keys", help="manage team keys")
    keys.add_argument("action", choices=("new",))
    keys.add_argument("name", help="the key's name (shown in logs, usage and the dashboard)")
    usage = commands.add_parser("usage", help="spend and tokens, as a table")
    usage.add_argument("--group-by", choices=GROUPS, default="key")
    usage.add_argument("--from", dest="since", help="a date (2026-11-01) or ISO time")
    usage.add_argument("--to", dest="until", help="a date (counted whole) or ISO time")
    usage.add_argument("--url", help="the proxy (default ANTHROPIC_BASE_URL or 127.0.0.1:PORT)")
    line = commands.add_parser("statusline", help="one line for Claude Code's statusLine")
    line.add_argument("--url", help="the proxy (default ANTHROPIC_BASE_URL or 127.0.0.1:PORT)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "keys":
        return keys_new(args.name)
    if args.command == "usage":
        return usage_table(args)
    return statusline(args)


def keys_new(name: str) -> int:
    """A fresh key for the person (shown once) and the table to paste (its hash only)."""
    key = new_key()
    print(f"# Give this key to {name} (it is shown only now; the proxy keeps its hash):")
    print(f"#   {key}")
    print("# and add this table to the config file:")
    print(key_table(name, key))
    return 0


def proxy_url(explicit: str | None) -> str:
    url = explicit or os.environ.get("ANTHROPIC_BASE_URL")
    if not url:
        url = f"http://127.0.0.1:{os.environ.get('PORT', '8082')}"
    return url.rstrip("/")


def client_headers() -> dict[str, str]:
    key = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN") or ""
    return {"x-api-key": key} if key else {}


def fetch(url: str, path: str, params: dict[str, str], timeout: float) -> dict[str, Any]:
    response = httpx.get(f"{url}{path}", params=params, headers=client_headers(),
                         timeout=timeout)
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise RuntimeError(f"{response.status_code} {message}")
    answer: dict[str, Any] = response.json()
    return answer


def usage_table(args: argparse.Namespace) -> int:
    params = {"group_by": args.group_by}
    if args.since:
        params["from"] = args.since
    if args.until:
        params["to"] = args.until
    try:
        answer = fetch(proxy_url(args.url), "/v1/usage", params, 30.0)
    except (httpx.HTTPError, RuntimeError) as exc:
        print(f"claude-proxy usage: {exc}", file=sys.stderr)
        return 1
    print(render_table(answer))
    return 0


def render_table(answer: dict[str, Any]) -> str:
    group = str(answer["group_by"])
    header = [group, "requests", "input", "output", "cache read", "cache write", "cost USD"]
    rows = [_row(str(row[group]), row) for row in answer["data"]]
    rows.append(_row("total", answer["total"]))
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def render(line: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(line, widths, strict=True)))

    title = f"usage from {answer['from']} to {answer['to']}"
    return "\n".join([title, render(header), *map(render, rows)])


def _row(name: str, row: dict[str, Any]) -> list[str]:
    return [name, str(row["requests"]), str(row["input_tokens"]), str(row["output_tokens"]),
            str(row["cache_read_input_tokens"]), str(row["cache_creation_input_tokens"]),
            f"{row['cost_usd']:.4f}"]


def statusline(args: argparse.Namespace) -> int:
    """Claude Code passes the session as JSON on stdin and shows our first line of stdout."""
    model = session_model(sys.stdin.read() if not sys.stdin.isatty() else "")
    try:
        me = fetch(proxy_url(args.url), "/v1/usage/me", {}, STATUSLINE_TIMEOUT)
    except (httpx.HTTPError, RuntimeError) as exc:
        print(f"{model} · proxy: {str(exc)[:60]}")
        return 0
    print(status_text(model, me))
    return 0


def session_model(stdin: str) -> str:
    try:
        session = json.loads(stdin) if stdin.strip() else {}
        name = session.get("model", {}).get("display_name")
    except (ValueError, AttributeError):
        name = None
    return str(name) if name else "claude-proxy"


def status_text(model: str, me: dict[str, Any]) -> str:
    parts = [model, f"{me['key']}: today ${me['today_usd']:.2f}"]
    if me.get("budget_usd") is not None:
        parts.append(f"${me['remaining_usd']:.2f} of ${me['budget_usd']:.2f} left this "
                     f"{me['period']}")
    return " · ".join(parts)
