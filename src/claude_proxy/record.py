"""The record of one request: what the access line, the metrics, the dashboard and the spend
read when it has finished.

The HTTP edge (`server/access_log.py`) opens a record per request and binds it to a context
variable; the layers below fill in what only they know (models, tokens, the timeline) through
`current_record()`, `mark()` and `record_usage()`, without being handed it. Nothing is
measured twice.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson
from starlette.types import Scope

from claude_proxy.sse import decode_frames

SESSION_HEADER = b"x-claude-code-session-id"
AGENT_HEADER = b"x-claude-code-agent-id"
"""Claude Code marks its subagents' requests with this header (the main loop sends none)."""
CLASS_HEADER = b"x-claude-code-request-class"
PROMPT_HEADER = b"x-claude-code-prompt-id"
"""Claude Code's gateway hints (sent with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1, which the
launcher sets): what kind of request this is, and the user turn it belongs to."""
REQUEST_CLASSES = frozenset({"main", "subagent", "workflow", "compaction", "auxiliary",
                             "side_reply"})
_SHOWN_ID = re.compile(r"[A-Za-z0-9._:-]{1,80}")
"""What of a client-chosen id goes into the log and the dashboard: nothing that could forge a
log line or carry markup."""
# The order of the access line; `cached` (= cache_read) is kept for existing dashboards.
TOKEN_KINDS = ("cache_read", "cache_write", "input", "output", "reasoning", "cached")


class Sent(Protocol):
    """A body as it was sent: bytes, or the pieces it was written in, which `bytes()` joins
    (a session's next turn: conversion/reuse.py `Spliced`)."""

    def __len__(self) -> int: ...

    def __bytes__(self) -> bytes: ...


class RequestTrace(Protocol):
    """The request's OpenTelemetry trace (`telemetry/`): told each moment `mark` records, so
    the layers below need no call of their own. None on the record unless OpenTelemetry is
    configured."""

    trace_id: str

    def marked(self, event: str, detail: str, at: float) -> None: ...

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """The current upstream attempt's `traceparent` into its request's headers."""

    def responded(self, model: Any, response_id: Any) -> None:
        """What the upstream's answer says of itself: its model and its id."""

    def tool_call(self, tool: str, source: str, outcome: str, seconds: float) -> None:
        """A tool the proxy ran itself (web search), just finished after `seconds`."""


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    stream: bool = False
    client_model: str = "-"
    upstream_model: str = "-"
    provider: str = "-"
    route: str = "-"
    session: str = "-"
    """Claude Code's session id (`x-claude-code-session-id`), `-` without one."""
    agent: str = "-"
    """The subagent's id (`x-claude-code-agent-id`), `-` for the main loop and other clients."""
    request_class: str = "-"
    """Claude Code's request class (`x-claude-code-request-class`: main, subagent, workflow,
    compaction, auxiliary, side_reply), `-` without one, `?` for any other value."""
    prompt_id: str = "-"
    """The user turn's id (`x-claude-code-prompt-id`), `-` without one."""
    betas: str | None = None
    """The client's `anthropic-beta` header (a Messages upstream gets the values it takes)."""
    failover: list[str] = field(default_factory=list)
    """The providers tried before the one that answered, in order."""
    first_byte: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    key: str = "-"
    """The configured name of the client's key (`admin` for ANTHROPIC_API_KEY); "-" without
    `[keys]`. Never the key."""
    cost: float | None = None
    """USD, from the upstream's usage and the model's prices (keys/spend.py); None when unpriced."""
    charged: bool = False
    """Whether the key's spend and the usage entry were written (once, before the response
    ended, or when it was cut)."""
    charger: Charger | None = None
    """Who charges it: the ledger of the configuration the request started on (set when its
    key is known; a reload meanwhile does not change it); None: nothing to charge."""
    input_estimate: int = 0
    """The proxy's own estimate of the input sent (calibrated against what the upstream
    reports: routing/calibration.py)."""
    thread: str = ""
    """Which conversation of its session the request continues (`calibration.thread`), as
    the pre-flight digested it (a system prompt of tens of KB, digested once a request);
    empty without a session."""

    # What the dashboard's inspector shows. Everything is kept by reference, never copied,
    # so recording costs one list append per client write while a response streams.
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    """(perf_counter, event, detail): upstream sent, retry, failover, first upstream byte."""
    client_body: dict[str, Any] | None = None
    """The validated client request, to the request's end, or until a stream of its answer
    has begun (`release_parsed`)."""
    upstream_body: dict[str, Any] | None = None
    """The request as last sent upstream, for as long as `client_body`."""
    client_json: bytes | None = None
    """The client's request as it was received: what the inspector keeps (`for_keeping`)."""
    upstream_json: Sent | None = None
    """The request as last sent upstream, as it was sent: what the inspector keeps."""
    added: dict[str, Any] = field(default_factory=dict)
    """The reasoning fields the proxy added to the upstream request."""
    events: list[bytes] = field(default_factory=list)
    """The SSE frames streamed to the client, one per write (`sse.decode_frames` reads
    them): the bytes are made for the write anyway, and take a third of the events' dicts,
    which were kept for as long as the stream and then the inspector's ring held them."""
    message: dict[str, Any] | None = None
    """The whole answer of a non-streaming request."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """What the tool-call guard found of each upstream tool call (`ToolGuard`): its outcome,
    and for a call that was not valid its kinds of repair, first error, and its arguments as
    the upstream sent them."""
    error_body: bytes | None = None
    """The start of an error response's body (status >= 400)."""
    trace: RequestTrace | None = None
    """Its OpenTelemetry trace, None unless OpenTelemetry is configured (`telemetry/`)."""

    def tool_outcomes(self) -> dict[str, int]:
        """The answer's tool calls by what the guard found of them (docs/tool-calls.md), in
        the order the outcomes first came."""
        if not self.tool_calls:  # most answers: no Counter built, twice a request
            return {}
        return dict(Counter(call["outcome"] for call in self.tool_calls))

    def release_parsed(self) -> None:
        """Let go of the parsed bodies that have their bytes here, once a stream's answer has
        begun: nothing sends them again, and the stream stays open for seconds to minutes.
        A Claude Code conversation parsed and converted is about 1.5 times its JSON (1.13 MiB
        for 740 KB), held besides the bytes the inspector keeps."""
        if self.client_json is not None:
            self.client_body = None
        if self.upstream_json is not None:
            self.upstream_body = None

    def client_request(self) -> dict[str, Any] | None:
        """The client's request, parsed again from its bytes once released (OpenTelemetry's
        content capture at the end of a stream pays that, when it is on)."""
        if self.client_body is not None or self.client_json is None:
            return self.client_body
        try:
            body = orjson.loads(self.client_json)
        except orjson.JSONDecodeError:  # a request refused for its JSON
            return None
        return body if isinstance(body, dict) else None

    def for_keeping(self) -> RequestRecord:
        """This record as the inspector's ring keeps it once the request is over: its
        bodies as the bytes they came in and went out as, without their parsed dicts. A
        Claude Code conversation parsed is thousands of objects for the collector to walk
        and the allocator to free one by one; as bytes, the ring's 50 requests of 800 KB
        peaked at 239 MiB against 288 MiB as dicts."""
        return replace(self,
                       client_body=None if self.client_json is not None else self.client_body,
                       upstream_body=(None if self.upstream_json is not None
                                      else self.upstream_body))

    def kept_size(self) -> int:
        """The bytes of what `for_keeping` keeps that grow with the conversation: the bodies
        as received and sent, the streamed frames, the error's start (INSPECT_BYTES)."""
        return (len(self.client_json or b"") + len(self.upstream_json or b"")
                + sum(len(frame) for frame in self.events) + len(self.error_body or b""))

    def line(self, finished: float) -> str:
        ttfb = "-" if self.first_byte is None else f"{(self.first_byte - self.started) * 1e3:.1f}"
        tokens = " ".join(f"{kind}={self.tokens.get(kind, 0)}" for kind in TOKEN_KINDS)
        failover = ("failover=" + "->".join([*self.failover, self.provider]) + " "
                    if self.failover else "")
        who = f"key={self.key} " if self.key != "-" else ""
        cost = f" cost_usd={self.cost:.6f}" if self.cost is not None else ""
        if self.request_class != "-" or self.prompt_id != "-":
            cost += f" class={self.request_class} prompt_id={self.prompt_id}"
        return (f"request_id={self.request_id} {self.method} {one_word(self.path)} {who}"
                f"session={self.session} agent={self.agent} "
                f"provider={self.provider} route={self.route} {failover}"
                f"model={one_word(self.client_model)}->{one_word(self.upstream_model)} "
                f"status={self.status} "
                f"stream={str(self.stream).lower()} ttfb_ms={ttfb} "
                f"total_ms={(finished - self.started) * 1e3:.1f} {tokens}{cost}")


_WORD = re.compile(r'[^\s"]+')


def one_word(value: str) -> str:
    """A value a client chose (its path, its model) as one word of the access line: quoted
    when it has a space or a quote, so that a model named `m status=200` adds no field to the
    line. (Control characters are the log's to escape: logs.py.)"""
    if _WORD.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_current: ContextVar[RequestRecord | None] = ContextVar("claude_proxy_request", default=None)


def mark(event: str, detail: str = "") -> None:
    """A moment in the current request's life (the dashboard's timeline, and its trace's
    spans when OpenTelemetry is on)."""
    record = current_record()
    at = time.perf_counter()
    record.timeline.append((at, event, detail))
    if record.trace is not None:
        record.trace.marked(event, detail, at)


def current_trace() -> RequestTrace | None:
    """The trace of the request being handled; None outside a request or with telemetry off
    (one context-variable read: what the upstream client pays per request when it is off)."""
    record = _current.get()
    return record.trace if record is not None else None


class RecordObserver(Protocol):
    """Told when a request starts and when it has finished (the dashboard's recorder)."""

    def started(self, record: RequestRecord) -> None: ...

    def finished(self, record: RequestRecord, finished: float) -> None: ...


def client_ids(scope: Scope) -> tuple[str, str]:
    """The session and agent ids Claude Code sent: `-` when absent, `?` when present but not
    id-shaped (still a subagent's request for the router)."""
    found = shown_headers(scope, SESSION_HEADER, AGENT_HEADER)
    return found[SESSION_HEADER], found[AGENT_HEADER]


def client_hints(scope: Scope) -> tuple[str, str]:
    """Claude Code's request class and prompt id: `-` when absent, `?` when not one of the
    known classes (or, for the prompt id, not id-shaped): never a value that could forge a
    log line or steer the router by a name it does not know."""
    found = shown_headers(scope, CLASS_HEADER, PROMPT_HEADER)
    request_class = found[CLASS_HEADER]
    if request_class not in REQUEST_CLASSES and request_class != "-":
        request_class = "?"
    return request_class, found[PROMPT_HEADER]


def shown_headers(scope: Scope, *names: bytes) -> dict[bytes, str]:
    """Each of these headers as it may be shown: `-` when absent, `?` when not id-shaped."""
    found = dict.fromkeys(names, "-")
    for name, value in scope.get("headers", ()):
        if name in found:
            text = value.decode("latin-1").strip()
            found[name] = text if _SHOWN_ID.fullmatch(text) else "?"
    return found


def current_record() -> RequestRecord:
    """The record of the request being handled (a throwaway one outside a request)."""
    return _current.get() or RequestRecord("req_none", "-", "-")


def bind(record: RequestRecord) -> Token[RequestRecord | None]:
    """Makes `record` the current request's record until `unbind` (the access log's job)."""
    return _current.set(record)


def unbind(token: Token[RequestRecord | None]) -> None:
    _current.reset(token)


def new_request_id() -> str:
    """Unique enough to find a request in the logs; it guards nothing, so no system
    randomness (a syscall) is spent on it."""
    return f"req_{random.getrandbits(96):024x}"


class Charger(Protocol):
    """Told of every request as its response ends, and again (to no effect if it was
    charged then) once it has finished (keys/spend.py's ledger)."""

    async def settle(self, record: RequestRecord) -> None: ...

    def charge(self, record: RequestRecord) -> bool: ...


def stop_reason_of(record: RequestRecord) -> str | None:
    """The answer's stop reason: the whole message's, or a stream's `message_delta`."""
    if record.message is not None:
        return str(record.message.get("stop_reason"))
    # Only the message_delta lines are parsed: this runs for every finished stream.
    for event in reversed(list(decode_frames(record.events[-2:], b'"message_delta"'))):
        if event.get("type") == "message_delta":
            return str(event.get("delta", {}).get("stop_reason"))
    return None


def record_usage(usage: dict[str, Any], reasoning: int) -> None:
    """Anthropic usage of the finished response onto the current record."""
    read = int(usage.get("cache_read_input_tokens", 0))
    current_record().tokens = {
        "cache_read": read,
        "cache_write": int(usage.get("cache_creation_input_tokens", 0)),
        "input": int(usage.get("input_tokens", 0)),
        "output": int(usage.get("output_tokens", 0)),
        "reasoning": reasoning,
        "cached": read,
    }
