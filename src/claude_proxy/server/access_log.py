"""One access-log line (and the metrics) per request, with a request id.

The id is returned as the `request-id` header, as Anthropic does. The middleware opens the
request's record (`record.py`) and binds it for the layers below; when the response is done it
charges the key (by the ledger of the configuration the request started on, `record.charger`:
a reload meanwhile changes neither its prices nor its budget period; a request without a key
of `[keys]` has none and costs nothing here), writes the line, and tells the dashboard
(`ui/recorder.py`).
"""

from __future__ import annotations

import logging
import time

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from claude_proxy.metrics import Metrics
from claude_proxy.record import (
    RecordObserver,
    RequestRecord,
    bind,
    client_hints,
    client_ids,
    new_request_id,
    unbind,
)
from claude_proxy.telemetry import Telemetry

logger = logging.getLogger("claude_proxy.access")

QUIET_PATHS = frozenset({"/", "/health", "/health/live", "/metrics"})
"""Probes and scrapes: logged at DEBUG only, neither counted nor on the dashboard."""


class AccessLogMiddleware:
    """Pure ASGI, so streaming bodies pass straight through."""

    def __init__(self, app: ASGIApp, metrics: Metrics,
                 observer: RecordObserver | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.observer = observer
        self.telemetry = telemetry
        """OpenTelemetry's spans (`telemetry/`); None, and free, unless configured."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(new_request_id(), scope["method"], scope["path"])
        record.session, record.agent = client_ids(scope)
        record.request_class, record.prompt_id = client_hints(scope)
        token = bind(record)
        if self.telemetry is not None:
            self.telemetry.started(record, scope)
        if self.observer is not None:
            self.observer.started(record)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = MutableHeaders(scope=message)
                headers.append("request-id", record.request_id)
                if record.charger is not None and "event-stream" not in headers.get(
                        "content-type", ""):
                    # A whole answer is charged before its head: the head then leaves with
                    # the body in one write, not alone while the charge reaches the store.
                    await self._settle(record)
            elif record.first_byte is None and message.get("body"):
                record.first_byte = time.perf_counter()
                if record.status >= 400:
                    record.error_body = bytes(message["body"][:4096])
            if (record.charger is not None and message["type"] == "http.response.body"
                    and not message.get("more_body", False)):
                await self._settle(record)  # charged before the response's last byte
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if not record.status:  # answered outside, by the application's last handler
                record.status = 500
            raise
        finally:
            unbind(token)
            self._finish(record)

    async def _settle(self, record: RequestRecord) -> None:
        assert record.charger is not None
        try:
            await record.charger.settle(record)
        except Exception:  # accounting must never fail a response
            logger.exception("charging request %s failed", record.request_id)

    def _finish(self, record: RequestRecord) -> None:
        finished = time.perf_counter()
        if record.charger is not None:
            try:
                record.charger.charge(record)
            except Exception:  # accounting must never fail a request's clean-up
                logger.exception("charging request %s failed", record.request_id)
        if self.telemetry is not None:
            self.telemetry.finished(record, finished)
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
