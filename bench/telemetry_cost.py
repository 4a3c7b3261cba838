"""What OpenTelemetry costs per request when it is on (docs/opentelemetry.md#what-it-costs).

One non-streamed request's record is driven through what the layers do to it (the record bound,
the route noted, `upstream request` and `first upstream byte` marked, the attempt's
`traceparent` injected, the usage recorded, the record finished) with `telemetry/` off, then
on: in-request only (spans to an exporter that drops them, metrics to an in-memory reader), and
whole (the real OTLP/HTTP pipeline to a receiver in another process, flushed at the end, so
the batch export's CPU in the SDK's threads is counted). Process CPU time, best of three.

Run: `.venv/bin/python -m bench.telemetry_cost [N]` (loopback only; a few seconds).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from claude_proxy.record import RequestRecord, bind, mark, record_usage, unbind
from claude_proxy.telemetry import Exporters, ProxyFacts, Telemetry, Upstream, open_telemetry

SCOPE: dict[str, Any] = {
    "type": "http", "method": "POST", "path": "/v1/messages", "scheme": "http",
    "headers": [(b"host", b"127.0.0.1:8082"), (b"content-type", b"application/json"),
                (b"x-claude-code-session-id", b"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")]}
USAGE = {"input_tokens": 20, "output_tokens": 30, "cache_read_input_tokens": 100}
FACTS = ProxyFacts({"openai": Upstream("openai", "api.openai.com", 443)}, [],
                   lambda record: record.message or {})


def one_request(telemetry: Telemetry | None) -> None:
    record = RequestRecord("req_bench", "POST", "/v1/messages")
    record.session = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    token = bind(record)
    if telemetry is not None:
        telemetry.started(record, SCOPE)
    record.provider, record.route, record.upstream_model = "openai", "default", "gpt-5.5"
    record.upstream_body = {"model": "gpt-5.5", "max_completion_tokens": 4096}
    mark("upstream request", "openai,gpt-5.5")
    headers: dict[str, str] = {}
    if record.trace is not None:
        record.trace.inject(headers)
        record.trace.responded("gpt-5.5-2026-08-01", "chatcmpl-bench")
    mark("first upstream byte", "openai")
    record.message = {"stop_reason": "end_turn", "usage": USAGE}
    record_usage(USAGE, 0)
    record.status = 200
    unbind(token)
    if telemetry is not None:
        telemetry.finished(record, time.perf_counter())


def cpu_per_request(make: Callable[[], Telemetry | None], count: int) -> float:
    """Microseconds of process CPU per request, best of three (a fresh telemetry each)."""
    runs = []
    for _ in range(3):
        telemetry = make()
        start = time.process_time()
        for _ in range(count):
            one_request(telemetry)
        if telemetry is not None:
            telemetry.shutdown()  # flushes the batch: its export is counted
        runs.append((time.process_time() - start) / count * 1e6)
    return min(runs)


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def in_memory() -> Telemetry | None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return open_telemetry({}, FACTS, Exporters(Dropped(), InMemoryMetricReader()))


def main(argv: list[str]) -> None:
    if argv[:1] == ["receive"]:
        ThreadingHTTPServer(("127.0.0.1", int(argv[1])), _Accept).serve_forever()
    count = int(argv[0]) if argv else 5000
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    receiver = subprocess.Popen([sys.executable, "-m", "bench.telemetry_cost", "receive",
                                 str(port)])
    try:
        time.sleep(1)
        os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                           "OTEL_BSP_MAX_QUEUE_SIZE": str(count * 3)})
        off = cpu_per_request(lambda: None, count)
        request_path = cpu_per_request(in_memory, count)
        whole = cpu_per_request(lambda: open_telemetry(os.environ, FACTS), count)
    finally:
        receiver.terminate()
    print(f"CPU per request, n={count}: off {off:.1f} µs; on, in the request "
          f"{request_path:.1f} µs; on, with the OTLP/HTTP export {whole:.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
