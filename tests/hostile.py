"""What a hostile client sends, as hypothesis strategies, and what the proxy must answer.

Requests are real Claude Code requests (tests/data/fixtures, the copies of
../shared/fixtures and newer recordings) and a hand-made one holding every block type the
proxy knows, each mutated in one to three places: a value swapped for one of every other
JSON type, a field removed, a value wrapped in a list, nested deep, made huge, given control
characters or lone surrogates; a key renamed to one with control characters; headers and the
path given the same. The answer must be an Anthropic-shaped 4xx or a valid answer (never a
5xx), and the log must hold only well-formed lines: no line begun by a client's value, no
control character, no traceback, one access line per request.

tests/test_bad_input.py runs the properties for a bounded number of examples in `make test`;
`make fuzz` runs them for FUZZ_SECONDS.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from hypothesis import assume
from hypothesis import strategies as st

from claude_proxy.logs import LOG_FORMAT, OnceFormatter, RedactingFilter
from tests.sse_grammar import check_grammar, parse_sse

FIXTURES = Path(__file__).parent / "data" / "fixtures"
SIGNATURE = "EqQBCgIYAhIM"

EVERY_BLOCK: dict[str, Any] = {
    "model": "claude-sonnet-4-6", "max_tokens": 64, "stream": False,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "look", "citations": None},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "document", "title": "notes", "context": "ctx",
             "citations": {"enabled": True},
             "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                            "data": "JVBERi0="}},
            {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
            {"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": "inner"}]}},
            {"type": "search_result", "source": "https://example.com", "title": "t",
             "content": [{"type": "text", "text": "found"}], "citations": {"enabled": True}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": "EmwKAhgB"},
            {"type": "text", "text": "calling", "citations": [
                {"type": "char_location", "cited_text": "plain", "document_index": 3,
                 "document_title": "notes", "start_char_index": 0, "end_char_index": 5}]},
            {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
             "input": {"query": "weather"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
                {"type": "web_search_result", "url": "https://example.com", "title": "Ex",
                 "encrypted_content": "abc", "page_age": "1 day"}]},
            {"type": "server_tool_use", "id": "srvtoolu_02", "name": "web_fetch",
             "input": {"url": "https://example.com"}},
            {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_02", "content": {
                "type": "web_fetch_result", "url": "https://example.com", "content": {
                    "type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                   "data": "page"}}}},
            {"type": "server_tool_use", "id": "srvtoolu_03", "name": "code_execution",
             "input": {"code": "print(1)"}},
            {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_03", "content": {
                "type": "code_execution_result", "stdout": "1\n", "stderr": "",
                "return_code": 0, "content": []}},
            {"type": "server_tool_use", "id": "srvtoolu_04", "name": "tool_search_tool_regex",
             "input": {"pattern": "db"}},
            {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_04", "content": {
                "type": "tool_search_tool_search_result", "tool_references": [
                    {"type": "tool_reference", "tool_name": "query_db"}]}},
            {"type": "mcp_tool_use", "id": "mcptoolu_01", "name": "lookup",
             "server_name": "kb", "input": {"q": "x"}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_01", "is_error": False,
             "content": [{"type": "text", "text": "kb says"}]},
            {"type": "tool_use", "id": "toolu_01", "name": "Bash",
             "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": False, "content": [
                {"type": "text", "text": "a.txt"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}},
                {"type": "search_result", "source": "s", "title": "t",
                 "content": [{"type": "text", "text": "r"}]},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                "data": "d"}},
                {"type": "tool_reference", "tool_name": "query_db"}],
             "cache_control": {"type": "ephemeral", "ttl": "5m"}},
            {"type": "container_upload", "file_id": "file_01"},
            {"type": "text", "text": "go on"}]},
        {"role": "system", "content": "Mid-conversation note."},
    ],
    "tools": [
        {"name": "Bash", "description": "run", "input_schema": {
            "type": "object", "properties": {"command": {"type": "string"}},
            "required": ["command"]}, "cache_control": {"type": "ephemeral"}},
        {"name": "query_db", "description": "q", "defer_loading": True,
         "input_schema": {"type": "object", "properties": {}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
    "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
    "metadata": {"user_id": "user-1"},
    "output_config": {"effort": "medium"},
    "context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens",
                                                         "value": 100000},
         "keep": {"type": "tool_uses", "value": 3},
         "clear_at_least": {"type": "input_tokens", "value": 1000},
         "exclude_tools": ["Read"], "clear_tool_inputs": False}]},
    "stop_sequences": ["STOP"], "temperature": 1, "top_p": 0.9, "top_k": 5,
}
"""A request holding every block type the proxy knows, each as the Messages API takes it."""

WEB_SEARCH = {**EVERY_BLOCK, "tools": [
    *EVERY_BLOCK["tools"],
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2,
     "allowed_domains": ["example.com"], "user_location": {"type": "approximate",
                                                           "city": "Paris"}}]}
TOOL_SEARCH = {**EVERY_BLOCK, "tools": [
    *EVERY_BLOCK["tools"],
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}]}


def recorded_requests() -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Each recorded Claude Code request's body and headers (those that are one request)."""
    found = []
    for path in sorted(FIXTURES.glob("claude-code-*.json")):
        recording = json.loads(path.read_text(encoding="utf-8"))
        if "body" in recording:
            found.append((recording["body"], recording.get("headers", {})))
    return found


SEEDS: list[tuple[dict[str, Any], dict[str, str]]] = [
    *recorded_requests(), (EVERY_BLOCK, {}), (WEB_SEARCH, {}), (TOOL_SEARCH, {})]
KEPT_HEADERS = ("anthropic-beta", "anthropic-version", "x-claude-code-session-id",
                "x-claude-code-agent-id", "user-agent")

FREE_FORM = ("input_schema", "input", "properties")
"""JSON the Messages API takes as anything (a tool's schema, a call's input): mutated at its
first level only, so that the examples spend their time on the fields the proxy reads."""


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `value` (as key and index steps), free-form JSON only near its top."""
    found = [prefix] if prefix else []
    if prefix and prefix[-1] in FREE_FORM and len(prefix) > 1:
        return found + [(*prefix, key) for key in (value if isinstance(value, dict) else ())]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


SEED_PATHS = [paths(body) for body, _ in SEEDS]

MAX_BODY = 2_000_000
"""Bytes of the largest example (huge changes of huge values stop here)."""
NASTY = ["\r\n", "\n", "\r", "\x00", "\x1b[31m", "\u2028", "\u2029", "\x85", "\ud800",
         "\udfff", "\t", "\x7f", "\u202e", " status=200 ", "\"", "\\", "%0d%0a", "é", "😀"]
"""What a log line or a parser must survive: line breaks, NUL, terminal escapes, Unicode line
separators, lone surrogates, a bidirectional override, a forged field."""

nasty_text = st.lists(st.sampled_from(NASTY) | st.text(max_size=6), min_size=1,
                      max_size=6).map("".join)
scalars = (st.none() | st.booleans() | st.sampled_from([0, -1, 1, 2**63, -(2**64), 10**40])
           | st.integers(-5, 100_000) | st.sampled_from([1.5, -0.0, 1e308, 0.1])
           | st.text(max_size=12) | nasty_text
           | st.sampled_from(["text", "image", "tool_use", "tool_result", "ephemeral",
                              "enabled", "auto", "base64", "url", "user", "assistant"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "text", "content", "source", "id", "name", "input", "data",
                         "tool_use_id", "value", "keep", "url", "title"]) | nasty_text,
        inner, max_size=3), max_leaves=8)
KINDS = (type(None), bool, int, float, str, list, dict)


def of_other_type(value: Any) -> st.SearchStrategy[Any]:
    """A value of any JSON type but `value`'s."""
    kind = type(value)
    return json_values.filter(lambda new: type(new) is not kind)


DEEP = "\x00deep\x00"
"""Stands for a value nested deeper than `json.dumps` can write; `written` puts it in."""


def written(body: dict[str, Any], deep: list[tuple[Any, int, bool]], ascii_only: bool) -> bytes:
    """`body` as JSON (lone surrogates as they are), each `DEEP` replaced by its value
    nested `depth` times in lists or objects."""
    text = json.dumps(body, ensure_ascii=ascii_only)
    marker = json.dumps(DEEP)
    for value, depth, as_list in deep:
        opening, closing = ("[", "]") if as_list else ('{"content":', "}")
        text = text.replace(marker, opening * depth + json.dumps(value, ensure_ascii=ascii_only)
                            + closing * depth, 1)
    return text.encode("utf-8", "surrogatepass")


def huge(value: Any, size: int) -> Any:
    """`value` made big: a long string, a long list, a number past any limit."""
    if isinstance(value, str):
        return (value or "x") * (size // max(1, len(value or "x")))
    if isinstance(value, list):
        item = value[0] if value and len(repr(value[0])) < 100 else None
        return [*value, *[item] * (size // 8)]
    if isinstance(value, dict):
        return {**value, **{f"k{index}": index for index in range(size // 16)}}
    if isinstance(value, bool) or value is None:
        return "y" * size
    return 10**400 if isinstance(value, int) else 1e309 if size % 2 else -1e309


def _place(body: dict[str, Any], path: tuple[Any, ...]) -> tuple[Any, Any]:
    """The container holding `path`'s value and its key there; (None, None) when an earlier
    change took the place away."""
    parent: Any = body
    for depth, step in enumerate(path):
        holds = (step in parent if isinstance(parent, dict)
                 else isinstance(parent, list) and isinstance(step, int) and step < len(parent))
        if not holds:
            return None, None
        if depth == len(path) - 1:
            return parent, step
        parent = parent[step]
    return None, None


@st.composite
def mutation(draw: st.DrawFn, body: dict[str, Any], places: list[tuple[Any, ...]],
             deep: list[tuple[Any, int, bool]]) -> None:
    """One change to `body`, in place (a deep nesting goes to `deep`)."""
    parent, key = _place(body, draw(st.sampled_from(places)))
    if parent is None:
        return  # an earlier change moved it
    current = parent[key]
    action = draw(st.sampled_from(["type", "type", "type", "delete", "wrap", "deep", "huge",
                                   "nasty", "rename"]))
    if action == "delete":
        del parent[key]
    elif action == "rename" and isinstance(parent, dict):
        parent[draw(nasty_text)] = parent.pop(key)
    elif action == "nasty":
        parent[key] = draw(nasty_text)
    elif action == "wrap":
        parent[key] = [current]
    elif action == "deep":
        deep.append((current, draw(st.sampled_from([40, 200, 300, 1100])),
                     draw(st.booleans())))
        parent[key] = DEEP
    elif action == "huge":
        parent[key] = huge(current, draw(st.sampled_from([1000, 70_000])))
    else:
        parent[key] = draw(of_other_type(current))


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str | bytes]]:
    """(path, body, headers) of one hostile request built on a seed."""
    index = draw(st.integers(0, len(SEEDS) - 1))
    seed, recorded = SEEDS[index]
    body = copy.deepcopy(seed)
    body["stream"] = draw(st.booleans())
    deep: list[tuple[Any, int, bool]] = []
    for _ in range(draw(st.integers(1, 3))):
        draw(mutation(body, SEED_PATHS[index], deep))
    headers: dict[str, str | bytes] = {"content-type": "application/json",
               **{name: value for name, value in recorded.items() if name in KEPT_HEADERS}}
    if draw(st.integers(0, 5)) == 0:
        name = draw(st.sampled_from((*KEPT_HEADERS, "x-claude-code-request-class",
                                     "x-claude-code-prompt-id")))
        value = bytes(byte for byte in draw(nasty_text).encode("utf-8", "surrogatepass")
                      if byte >= 0x20 and byte != 0x7F).strip()  # what HTTP/1.1 can carry
        headers[name] = value or b"-"
    path = draw(st.sampled_from(["/v1/messages", "/v1/messages?beta=true",
                                 "/v1/messages/count_tokens?beta=true", "/v1/messages",
                                 "/v1/messages%0d%0aX%20status=200", "/v1/models/a%0Ab",
                                 "/v1/messages?x=%0d%0aX"]))
    raw = written(body, deep, draw(st.booleans()))
    assume(len(raw) < MAX_BODY)
    return path, raw, headers


# ---------------------------------------------------------------- what the proxy must answer


def check_answer(response: httpx.Response, path: str) -> None:
    """An Anthropic-shaped 4xx, or a valid answer (a stream that keeps the grammar)."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers.get("content-type", "").startswith(
        ("application/json", "text/event-stream")), (response.status_code, response.text[:300])
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        check_grammar(parse_sse(response.content))
        return
    body = response.json()
    if response.status_code == 200 and "/count_tokens" in path:
        assert set(body) == {"input_tokens"} and isinstance(body["input_tokens"], int)
    elif response.status_code == 200 and path.startswith("/v1/models"):
        assert body["type"] == "model"
    elif response.status_code == 200:
        assert body["type"] == "message" and isinstance(body["content"], list)
        assert isinstance(body["usage"]["output_tokens"], int)
    else:
        assert 400 <= response.status_code < 500
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert isinstance(body["error"]["type"], str)
        assert isinstance(body["error"]["message"], str)


LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING) \[\d+\] "
                  r"[a-z_.]+: \S")
"""A log line as the proxy writes it (LOG_FORMAT): no client value can begin one."""
SERVER_LOGGERS = ("claude_proxy", "uvicorn", "fastapi", "starlette", "sse_starlette")
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class LogLines(logging.Handler):
    """Every log record, rendered as the production handlers render it (redacting and
    escaping filter, LOG_FORMAT), kept until taken."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(OnceFormatter(LOG_FORMAT))
        self.addFilter(RedactingFilter([]))
        self.lines: list[str] = []
        self.arrived = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(SERVER_LOGGERS):
            return  # the test's own client
        with self.arrived:
            self.lines.append(self.format(record))
            self.arrived.notify_all()

    def take(self, request_id: str, timeout: float = 10) -> list[str]:
        """The lines so far, once the access line of `request_id` is among them (it is
        written when the response has ended, which the client may see a moment before)."""
        marker = f"request_id={request_id} "
        give_up = time.monotonic() + timeout
        with self.arrived:
            while not any(marker in line for line in self.lines):
                if not self.arrived.wait(max(0.0, give_up - time.monotonic())):
                    break
            lines, self.lines = self.lines, []
        return lines


@contextmanager
def captured_log() -> Iterator[LogLines]:
    """The server's log lines, from now to the end of the block."""
    handler = LogLines()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


EXPECTED_WARNINGS = re.compile(
    r" WARNING \[\d+\] (claude_proxy\.websearch: web search requested but WEB_SEARCH=off"
    r"|claude_proxy\.app: context window unknown for )")
"""The warnings a hostile request may cause (a web search tool where none is configured;
the test proxy's start-up)."""


def check_log(lines: list[str], request_id: str) -> None:
    """Each record one well-formed line without control characters, no ERROR and no
    traceback, no warning but those expected, and the request's access line once."""
    for line in lines:
        assert "\n" not in line and LINE.match(line), f"unexpected log line: {line!r}"
        assert not CONTROL.search(line), f"control character in the log: {line!r}"
        assert " WARNING " not in line[:40] or EXPECTED_WARNINGS.search(line), line
    access = [line for line in lines if f"request_id={request_id} " in line]
    assert len(access) == 1, (request_id, lines[-5:])
