"""Every top-level Messages API request field, and every `anthropic-beta` value clients send,
with what the proxy does with it: translated, ignored because harmless, or refused.

The rule: a field the proxy does not carry out is never swallowed when it changes what the
client gets back; such a field is refused with a 400 the client can act on. The field
table of docs/api.md is rendered from `REQUEST_FIELDS` and `BETA_VALUES` (`markdown_tables()`), and
`tests/test_fields.py` has one test per row.

Fields and beta values missing from the tables are let through and logged once per name at
INFO, so a new client feature shows up in the log instead of going unnoticed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from claude_proxy.conversion import context_edits, safeguards
from claude_proxy.errors import ProxyError

logger = logging.getLogger("claude_proxy.fields")


class Treatment(StrEnum):
    TRANSLATED = "translated"
    IGNORED = "ignored (harmless)"
    REFUSED = "refused"


@dataclass(frozen=True)
class Rule:
    treatment: Treatment
    how: str
    """What the proxy does with it, in one line (the last column of docs/api.md)."""


T, IGN, REF = Treatment.TRANSLATED, Treatment.IGNORED, Treatment.REFUSED

# The body of POST /v1/messages (and, minus max_tokens/stream, of count_tokens): the fields of
# the Python SDK 2.12 `MessageCreateParams` and its beta twin, plus the sampling fields older
# clients (and Claude Code) still send. `output_config` is listed per member.
REQUEST_FIELDS: dict[str, Rule] = {
    "model": Rule(T, "→ the provider and upstream model the router picks (by default "
                     "opus/sonnet/haiku → BIG/MIDDLE/SMALL_MODEL, other names unchanged); "
                     "answers echo the requested name"),
    "messages": Rule(T, "→ `messages` (tool results as `tool` messages, images as `image_url`, "
                        "thinking passed back per the reasoning dialect)"),
    "max_tokens": Rule(T, "→ `max_tokens` / `max_completion_tokens`, clamped to the provider's "
                          "output limit"),
    "system": Rule(T, "→ a leading `system` message (Claude Code's billing header block "
                      "removed)"),
    "stream": Rule(T, "→ `stream` + `stream_options.include_usage` (or a buffered replay)"),
    "stop_sequences": Rule(T, "→ `stop`"),
    "temperature": Rule(T, "→ `temperature` (left out for OpenAI reasoning models)"),
    "top_p": Rule(T, "→ `top_p` (left out for OpenAI reasoning models)"),
    "top_k": Rule(T, "→ `top_k` for the vllm (also SGLang) and ollama profiles; other "
                     "upstreams have no such field, so it is left out there"),
    "metadata": Rule(T, "`metadata.user_id` hashed → `user` (never the raw value; dropped "
                        "for a model that refuses it), and → `prompt_cache_key` where the "
                        "provider takes one"),
    "tools": Rule(T, "custom tools → `tools` functions (schemas cleaned); server tools and "
                     "unloaded `defer_loading` tools left out; `web_search_*` and "
                     "`tool_search_tool_regex_*` / `_bm25_*` run by the proxy"),
    "tool_choice": Rule(T, "→ `tool_choice`; `disable_parallel_tool_use` → "
                           "`parallel_tool_calls: false`"),
    "thinking": Rule(T, "→ the provider's reasoning fields; reasoning comes back as "
                        "`thinking` blocks"),
    "output_config.effort": Rule(T, "→ the reasoning effort in the provider's dialect"),
    "output_config.format": Rule(T, "`json_schema` → `response_format: json_schema` (strict); "
                                    "a provider that refuses it gets `json_object` plus the "
                                    "schema in the system prompt; on the Responses API → "
                                    "`text.format`; the JSON comes back as text; any other "
                                    "format is refused (400)"),
    "output_config.task_budget": Rule(IGN, "a token budget hint for agent loops; the answer's "
                                           "shape does not depend on it"),
    "output_format": Rule(T, "the older beta spelling of `output_config.format`, translated "
                             "the same way"),
    "safeguards": Rule(T, "Claude Code's Auto-mode classifier: `safeguard_results` answer "
                          "`unsupported`, or with a judge route (`[router] safeguards`, "
                          "SAFEGUARDS_ROUTE) each tool call's verdict from that route, or "
                          "`unavailable`; never a verdict nobody made"),
    "context_management": Rule(T, "`clear_tool_uses_20250919` (every knob) applied to the "
                                  "history; `clear_thinking_20251015` where the upstream needs "
                                  "no reasoning back; `applied_edits` answered (on "
                                  "`message_delta` when streamed), `[]` when nothing was "
                                  "done; other edits: 400"),
    "cache_control": Rule(IGN, "the top-level marker: automatic-caching upstreams cache the "
                               "prefix anyway (block markers follow PROMPT_CACHE)"),
    "service_tier": Rule(IGN, "capacity choice; the upstream has one tier"),
    "speed": Rule(IGN, "fast mode is a latency choice, not a different answer"),
    "inference_geo": Rule(IGN, "the upstream's region is its configuration"),
    "diagnostics": Rule(IGN, "asks for cache-miss diagnostics; answers simply carry none"),
    "container": Rule(IGN, "a code-execution container id; server tools do not run upstream"),
    "fallbacks": Rule(IGN, "server-side fallback models on a policy refusal; the requested "
                           "model answers"),
    "fallback_credit_token": Rule(IGN, "billing of a retried refusal"),
    "billing_policy": Rule(IGN, "who is billed; the upstream key pays"),
    "user_profile_id": Rule(IGN, "attribution (the SDKs send it as a header)"),
    "workspace_id": Rule(IGN, "workspace selection (the SDKs send it as a header)"),
    "thread": Rule(REF, "400 `invalid_request_error`, `details.error_code: "
                        "thread_unsupported_request`, `unsupported: [\"thread\"]`; the SDKs "
                        "then resend the whole history without `thread`"),
    "mcp_servers": Rule(REF, "400: the proxy cannot connect the model to MCP servers, and "
                             "answering without their tools would change the answer"),
    "compaction": Rule(REF, "400: a compaction request expects a `compaction` block, which "
                            "the proxy cannot produce"),
}

# `anthropic-beta` values seen from Claude Code 2.1.328, the Python and TypeScript SDKs and the
# Vercel AI SDK. The header itself is always accepted; the treatment is that of the feature the
# value switches on (its fields are in REQUEST_FIELDS).
BETA_VALUES: dict[str, Rule] = {
    "claude-code-20250219": Rule(IGN, "marks Claude Code's requests"),
    "interleaved-thinking-2025-05-14": Rule(IGN, "thinking between tool calls follows "
                                                 "REASONING_WITH_TOOLS"),
    "context-management-2025-06-27": Rule(T, "see `context_management`"),
    "effort-2025-11-24": Rule(T, "see `output_config.effort`"),
    "per-turn-control-2026-07-01": Rule(IGN, "the proxy sends each request as given"),
    "mid-conversation-tool-changes-2026-07-01": Rule(IGN, "tools are sent with every "
                                                          "request anyway"),
    "thinking-token-count-2026-05-13": Rule(IGN, "reasoning tokens are counted in "
                                                 "`output_tokens`"),
    "dangerous-tool-use-2026-09-03": Rule(T, "see `safeguards`"),
    "afk-mode-2026-01-31": Rule(IGN, "marks Claude Code's Auto-mode requests (see "
                                     "`safeguards`)"),
    "advanced-tool-use-2025-11-20": Rule(T, "`defer_loading` tools, `tool_reference` "
                                            "blocks and the tool search server tool are "
                                            "honoured"),
    "thinking-display-updates-2026-08-18": Rule(IGN, "thinking is shown as the upstream "
                                                     "reasons"),
    "context-1m-2025-08-07": Rule(IGN, "the upstream model's own context window applies"),
    "redact-thinking-2026-02-12": Rule(IGN, "thinking text comes from the upstream as is"),
    "structured-outputs-2025-11-13": Rule(T, "see `output_config.format`"),
    "structured-outputs-2025-12-15": Rule(T, "see `output_config.format`"),
    "fast-mode-2026-02-01": Rule(IGN, "see `speed`"),
    "token-counting-2024-11-01": Rule(T, "`/v1/messages/count_tokens` estimates locally (a "
                                         "Messages upstream that counts is asked)"),
    "prompt-caching-2024-07-31": Rule(IGN, "see `cache_control`"),
    "extended-cache-ttl-2025-04-11": Rule(IGN, "see `cache_control`"),
    "output-128k-2025-02-19": Rule(IGN, "`max_tokens` is clamped to the provider's limit"),
    "task-budgets-2026-03-13": Rule(IGN, "see `output_config.task_budget`"),
    "server-side-fallback-2026-06-01": Rule(IGN, "see `fallbacks`"),
    "server-side-fallback-2026-07-01": Rule(IGN, "see `fallbacks`"),
    "message-threads-2026-08-12": Rule(REF, "see `thread`"),
    "mcp-client-2025-04-04": Rule(REF, "see `mcp_servers`"),
    "mcp-client-2025-11-20": Rule(REF, "see `mcp_servers`"),
    "compact-2026-01-12": Rule(REF, "see `compaction`"),
    "compact-2026-09-04": Rule(REF, "see `compaction`"),
}

# Below the top level: members of the fields above that Claude Code 2.1.33x sends (recorded in
# tests/data/fixtures/claude-code-2.1.332-*.json, or present in its client code), and its own
# request headers. `tests/test_fields_members.py` has one test per row.
MEMBER_FIELDS: dict[str, Rule] = {
    "messages[].role: system": Rule(T, "a system message in the middle of the conversation "
                                       "(Claude Code's environment and reminders) → a `system` "
                                       "message in place; a model whose template takes one "
                                       "system message only gets it as a `user` message "
                                       "(learned from its 400)"),
    "cache_control.scope": Rule(IGN, "who may share a cached prefix; the upstream marker is "
                                     "`{\"type\": \"ephemeral\"}` (plus a known `ttl` on "
                                     "OpenRouter's Anthropic models), never a scope"),
    "tools[].defer_loading": Rule(T, "the tool is left out until a `tool_reference` block "
                                     "in the conversation loads it; the reference then "
                                     "reads as the `<functions>` block ToolSearch promises"),
    "tools[].input_examples": Rule(IGN, "example inputs for a tool; a Chat Completions "
                                        "function has no such field, so its name, "
                                        "description and schema go up"),
    "thinking.display": Rule(T, "`omitted` (what Claude Code's subagents send): thinking "
                                "blocks come without their text, which travels in the "
                                "signature and goes back upstream as usual; `updates` and "
                                "`summarized`: the upstream's reasoning streams as it "
                                "arrives"),
}
HEADERS: dict[str, Rule] = {
    "x-claude-code-session-id": Rule(T, "keys the session's `prompt_cache_key` and the "
                                        "router's memory of the session's size"),
    "x-claude-code-agent-id": Rule(IGN, "names the subagent a request comes from; each "
                                        "request is translated on its own"),
    "x-claude-code-parent-agent-id": Rule(IGN, "the subagent's parent; see "
                                               "`x-claude-code-agent-id`"),
}

_NESTED = "output_config"


def request_field_names(body: Mapping[str, Any]) -> list[str]:
    """The table names a body uses: top-level keys, and `output_config.X` per member."""
    names: list[str] = []
    for key, value in body.items():
        if key == _NESTED and isinstance(value, dict):
            names.extend(f"{_NESTED}.{member}" for member in value)
        else:
            names.append(key)
    return names


def refuse_unsupported(body: Mapping[str, Any]) -> None:
    """Raise the 400 for the first refused field present (not null) in a Messages request.

    `thread` comes first: its refusal is the documented one the SDKs recover from by sending
    the whole history, which they can only do if no other refusal hides it."""
    refused = [name for name, rule in REQUEST_FIELDS.items()
               if rule.treatment is REF and body.get(name) is not None]
    if not refused:
        return
    if "thread" in refused:
        raise ProxyError(400, "thread: server-held threads are not supported by this proxy; "
                              "send the whole conversation without `thread`",
                         details={"error_code": "thread_unsupported_request",
                                  "unsupported": ["thread"]})
    name = refused[0]
    raise ProxyError(400, f"{name}: not supported by this proxy ({REQUEST_FIELDS[name].how})")


def refuse_unknown_format(body: Mapping[str, Any]) -> None:
    """An `output_config.format` (or `output_format`) other than a `json_schema` with a schema
    object would otherwise be dropped, and the client would get free text it cannot parse."""
    config = body.get("output_config")
    for name, value in (("output_config.format",
                         config.get("format") if isinstance(config, dict) else None),
                        ("output_format", body.get("output_format"))):
        if value is None:
            continue
        if not (isinstance(value, dict) and value.get("type") == "json_schema"
                and isinstance(value.get("schema"), dict)):
            raise ProxyError(400, f"{name}: only {{\"type\": \"json_schema\", \"schema\": "
                                  f"{{…}}}} is supported")


class FirstSight:
    """Names already logged, so each unknown name is logged once. Per process: with several
    workers, each worker logs a new name once."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first(self, name: str) -> bool:
        with self._lock:
            if name in self._seen:
                return False
            self._seen.add(name)
            return True


_UNKNOWN = FirstSight()


def log_unknown(body: Mapping[str, Any], beta_header: str | None,
                seen: FirstSight = _UNKNOWN) -> None:
    """Log, once per name, request fields and beta values the tables do not list."""
    for name in request_field_names(body):
        if name not in REQUEST_FIELDS and seen.first(f"field:{name}"):
            logger.info("request field %r is not in the field table; ignored (let us know "
                        "what it should do)", name)
    for value in beta_values(beta_header):
        if value not in BETA_VALUES and seen.first(f"beta:{value}"):
            logger.info("anthropic-beta value %r is not in the field table; accepted, its "
                        "fields follow the table", value)


def beta_values(header: str | None) -> list[str]:
    """`a,b, c` → [a, b, c] (clients join with commas, some add spaces)."""
    return [item.strip() for item in (header or "").split(",") if item.strip()]


def screen_request(body: Mapping[str, Any], beta_header: str | None, *,
                   refuse: bool = True) -> None:
    """The one check the HTTP layer makes: log what is unknown, refuse what must be refused
    (only for `/v1/messages`; count_tokens just counts)."""
    log_unknown(body, beta_header)
    if refuse:
        refuse_unsupported(body)
        refuse_unknown_format(body)
        safeguards.check(body)
        context_edits.check(body)


def markdown_tables() -> str:
    """The field tables of docs/api.md, rendered from the code's."""
    return "\n".join([*_table("request field", REQUEST_FIELDS.items()), "",
                      *_table("`anthropic-beta` value", BETA_VALUES.items())])


def _table(title: str, rows: Iterable[tuple[str, Rule]]) -> list[str]:
    lines = [f"| {title} | treatment | what the proxy does |", "|---|---|---|"]
    lines += [f"| `{name}` | {rule.treatment} | {rule.how} |" for name, rule in rows]
    return lines


def member_tables() -> str:
    """The tables of members and headers (MEMBER_FIELDS, HEADERS)."""
    return "\n".join([*_table("member", MEMBER_FIELDS.items()), "",
                      *_table("header", HEADERS.items())])


if __name__ == "__main__":  # `python -m claude_proxy.conversion.fields`: the tables of docs/api.md
    print(markdown_tables())
    print()
    print(member_tables())
