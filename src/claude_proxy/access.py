"""One access-log line (and the metrics) per request, with a request id.

The id is returned as the `request-id` header, as Anthropic does. The service fills in what
only it knows (models, tokens) on the request's record, found through a context variable.
The dashboard (`ui/recorder.py`) observes the same record: nothing is measured twice.
"""

from __future__ import annotations

import logging
import random
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from claude_proxy.metrics import Metrics

logger = logging.getLogger("claude_proxy.access")

QUIET_PATHS = frozenset({"/", "/health", "/metrics"})
SESSION_HEADER = b"x-claude-code-session-id"
AGENT_HEADER = b"x-claude-code-agent-id"
"""Claude Code marks its subagents' requests with this header (the main loop sends none)."""
_SHOWN_ID = re.compile(r"[A-Za-z0-9._:-]{1,80}")
"""What of a client-chosen id goes into the log and the dashboard: nothing that could forge a
log line or carry markup."""
# The order of the access line; `cached` (= cache_read) is kept for existing dashboards.
TOKEN_KINDS = ("cache_read", "cache_write", "input", "output", "reasoning", "cached")


@dataclass
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
    failover: list[str] = field(default_factory=list)
    """The providers tried before the one that answered, in order."""
    first_byte: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    key: str = "-"
    """The configured name of the client's key (`admin` for ANTHROPIC_API_KEY); "-" without
    `[keys]`. Never the key."""
    cost: float | None = None
    """USD, from the upstream's usage and the model's prices (spend.py); None when unpriced."""
    input_estimate: int = 0
    """The proxy's own estimate of the input sent (calibrated against what the upstream
    reports: routing/calibration.py)."""

    # What the dashboard's inspector shows. Everything is kept by reference, never copied,
    # so recording costs one list append per client write while a response streams.
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    """(perf_counter, event, detail): upstream sent, retry, failover, first upstream byte."""
    client_body: dict[str, Any] | None = None
    """The validated client request."""
    upstream_body: dict[str, Any] | None = None
    """The request as last sent upstream."""
    added: dict[str, Any] = field(default_factory=dict)
    """The reasoning fields the proxy added to the upstream request."""
    events: list[bytes] = field(default_factory=list)
    """The SSE frames streamed to the client, one per write (`sse.decode_frames` reads
    them): the bytes are made for the write anyway, and take a third of the events' dicts,
    which were kept for as long as the stream and then the inspector's ring held them."""
    message: dict[str, Any] | None = None
    """The whole answer of a non-streaming request."""
    error_body: bytes | None = None
    """The start of an error response's body (status >= 400)."""

    def line(self, finished: float) -> str:
        ttfb = "-" if self.first_byte is None else f"{(self.first_byte - self.started) * 1e3:.1f}"
        tokens = " ".join(f"{kind}={self.tokens.get(kind, 0)}" for kind in TOKEN_KINDS)
        failover = ("failover=" + "->".join([*self.failover, self.provider]) + " "
                    if self.failover else "")
        who = f"key={self.key} " if self.key != "-" else ""
        cost = f" cost_usd={self.cost:.6f}" if self.cost is not None else ""
        return (f"request_id={self.request_id} {self.method} {self.path} {who}"
                f"session={self.session} agent={self.agent} "
                f"provider={self.provider} route={self.route} {failover}"
                f"model={self.client_model}->{self.upstream_model} status={self.status} "
                f"stream={str(self.stream).lower()} ttfb_ms={ttfb} "
                f"total_ms={(finished - self.started) * 1e3:.1f} {tokens}{cost}")


_current: ContextVar[RequestRecord | None] = ContextVar("claude_proxy_request", default=None)


def mark(event: str, detail: str = "") -> None:
    """A moment in the current request's life (the dashboard's timeline)."""
    current_record().timeline.append((time.perf_counter(), event, detail))


class RecordObserver(Protocol):
    """Told when a request starts and when it has finished (the dashboard's recorder)."""

    def started(self, record: RequestRecord) -> None: ...

    def finished(self, record: RequestRecord, finished: float) -> None: ...


def client_ids(scope: Scope) -> tuple[str, str]:
    """The session and agent ids Claude Code sent: `-` when absent, `?` when present but not
    id-shaped (still a subagent's request for the router)."""
    found = {SESSION_HEADER: "-", AGENT_HEADER: "-"}
    for name, value in scope.get("headers", ()):
        if name in found:
            text = value.decode("latin-1").strip()
            found[name] = text if _SHOWN_ID.fullmatch(text) else "?"
    return found[SESSION_HEADER], found[AGENT_HEADER]


def current_record() -> RequestRecord:
    """The record of the request being handled (a throwaway one outside a request)."""
    return _current.get() or RequestRecord("req_none", "-", "-")


def new_request_id() -> str:
    """Unique enough to find a request in the logs; it guards nothing, so no system
    randomness (a syscall) is spent on it."""
    return f"req_{random.getrandbits(96):024x}"


class Charger(Protocol):
    """Told of every finished request before it is logged (spend.py's ledger)."""

    def charge(self, record: RequestRecord) -> None: ...


class AccessLogMiddleware:
    """Pure ASGI, so streaming bodies pass straight through."""

    def __init__(self, app: ASGIApp, metrics: Metrics,
                 observer: RecordObserver | None = None,
                 charger: Charger | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.observer = observer
        self.charger = charger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(new_request_id(), scope["method"], scope["path"])
        record.session, record.agent = client_ids(scope)
        token = _current.set(record)
        if self.observer is not None:
            self.observer.started(record)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                MutableHeaders(scope=message).append("request-id", record.request_id)
            elif record.first_byte is None and message.get("body"):
                record.first_byte = time.perf_counter()
                if record.status >= 400:
                    record.error_body = bytes(message["body"][:4096])
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _current.reset(token)
            self._finish(record)

    def _finish(self, record: RequestRecord) -> None:
        finished = time.perf_counter()
        if self.charger is not None:
            try:
                self.charger.charge(record)
            except Exception:  # accounting must never fail a request's clean-up
                logger.exception("charging request %s failed", record.request_id)
        if record.path in QUIET_PATHS:
            logger.debug(record.line(finished))
            return
        if logger.isEnabledFor(logging.INFO):
            logger.info(record.line(finished))
        self._observe(record, finished)
        if self.observer is not None:
            self.observer.finished(record, finished)

    def _observe(self, record: RequestRecord, finished: float) -> None:
        metrics = self.metrics
        stream = str(record.stream).lower()
        metrics.requests_of(str(record.status), record.client_model).inc()
        metrics.duration_of(stream).observe(finished - record.started)
        if record.first_byte is not None:
            metrics.first_byte_of(stream).observe(record.first_byte - record.started)
        if record.tokens:
            metrics.cache.observe(record.provider, record.tokens)
        for kind, count in record.tokens.items():
            if count:
                metrics.tokens_of(kind).inc(count)


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
