"""Tool groups: whole families of Claude Code tools removed before the request goes upstream.

`TOOL_GROUPS_DISABLED_<NAME>=tasking,search` names groups to remove, where NAME is the provider
(`KIMI`) or a prefix of the upstream model (`DEEPSEEK_CHAT` for deepseek-chat…), upper-cased,
with every other character as `_`; the most specific (longest) matching NAME wins.
`TOOL_GROUP_<NAME>=pattern,…` adds name patterns (fnmatch) to a group, or defines a new one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "tasking": ("Task", "Agent", "TodoWrite", "TodoRead", "TaskCreate", "TaskGet", "TaskUpdate",
                "TaskList", "TaskOutput", "TaskStop", "KillShell", "ListAgents", "SendMessage",
                "Workflow", "ScheduleWakeup", "ExitPlanMode", "EnterPlanMode"),
    "playwright_mcp": ("mcp__playwright__*",),
    "filesystem": ("Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "NotebookEdit", "LS"),
    "search": ("WebSearch", "WebFetch"),
    "productivity": ("Skill", "SlashCommand", "ToolSearch", "AskUserQuestion", "ReportFindings",
                     "BashOutput", "ListMcpResourcesTool", "ReadMcpResourceTool", "LSP",
                     "Monitor"),
}


def env_name(text: str) -> str:
    """`deepseek-chat` → `DEEPSEEK_CHAT`, as the variable names spell it."""
    return re.sub(r"[^A-Z0-9]", "_", text.upper())


def groups_with_extensions(extensions: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    groups = dict(DEFAULT_GROUPS)
    for name, patterns in extensions.items():
        key = name.lower()
        groups[key] = groups.get(key, ()) + tuple(patterns)
    return groups


def disabled_groups(disabled: Mapping[str, tuple[str, ...]], provider: str,
                    model: str) -> tuple[str, tuple[str, ...]] | None:
    """(the variable suffix that applies, its groups), the most specific match winning."""
    names = {env_name(model), env_name(model.rsplit("/", 1)[-1])}
    best: tuple[int, str] | None = None
    for suffix in disabled:
        if any(name.startswith(suffix) for name in names):
            rank = len(suffix)
        elif suffix == env_name(provider):
            rank = 0
        else:
            continue
        if best is None or rank > best[0]:
            best = (rank, suffix)
    return (best[1], disabled[best[1]]) if best else None


def remove_tool_groups(tools: list[dict[str, Any]], groups: tuple[str, ...],
                       patterns_by_group: Mapping[str, tuple[str, ...]]) -> tuple[
                           list[dict[str, Any]], list[str]]:
    """The tools left, and the names removed."""
    patterns = [pattern for group in groups for pattern in patterns_by_group.get(group, ())]
    kept, removed = [], []
    for tool in tools:
        name = tool["function"]["name"]
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            removed.append(name)
        else:
            kept.append(tool)
    return kept, removed
