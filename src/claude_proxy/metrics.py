"""Prometheus metrics (`GET /metrics`), one registry per application.

With `claude-proxy --workers N` the CLI points PROMETHEUS_MULTIPROC_DIR at a directory it
manages (cli.metrics_directory), and a scrape sums every worker of the host (prometheus
client's multiprocess mode); across replicas Prometheus sums per target, as usual.
"""

from __future__ import annotations

import os
import threading
from typing import Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MetricT = TypeVar("MetricT", Counter, Histogram)


class Children(Generic[MetricT]):
    """A labelled metric's children, kept by label values: `labels()` checks and looks the
    values up on every call (~1.1 µs, six times a request). The metric keeps every child it
    made for the life of the process anyway, so this adds references, not entries."""

    def __init__(self, metric: MetricT) -> None:
        self.metric: MetricT = metric
        self._made: dict[tuple[str, ...], MetricT] = {}

    def __call__(self, *values: str) -> MetricT:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self.metric.labels(*values)
        return child


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class CacheStats:
    """Prompt tokens and cache reads per provider since start, for the cache-hit ratio in
    `/health?detail=1`. Per process: with several workers each reports its own requests."""

    def __init__(self) -> None:
        self._prompt: dict[str, int] = {}
        self._read: dict[str, int] = {}
        self._lock = threading.Lock()

    def observe(self, provider: str, tokens: dict[str, int]) -> None:
        """One answered request's tokens (the access record's kinds)."""
        read = tokens.get("cache_read", 0)
        prompt = tokens.get("input", 0) + read + tokens.get("cache_write", 0)
        with self._lock:
            self._prompt[provider] = self._prompt.get(provider, 0) + prompt
            self._read[provider] = self._read.get(provider, 0) + read

    def ratios(self) -> dict[str, dict[str, float | int]]:
        """Per provider: prompt tokens, cache reads, and their ratio (0 before any)."""
        with self._lock:
            return {provider: {"prompt_tokens": prompt,
                               "cache_read_tokens": self._read[provider],
                               "cache_hit_ratio": round(self._read[provider] / prompt, 4)
                               if prompt else 0.0}
                    for provider, prompt in self._prompt.items()}


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("claude_proxy_requests_total", "Requests by status and model",
                                ["status", "model"], registry=registry)
        self.time_to_first_byte = Histogram(
            "claude_proxy_time_to_first_byte_seconds", "Time to the first response byte",
            ["stream"], buckets=LATENCY_BUCKETS, registry=registry)
        self.duration = Histogram("claude_proxy_request_duration_seconds",
                                  "Whole request duration", ["stream"],
                                  buckets=LATENCY_BUCKETS, registry=registry)
        self.tokens = Counter("claude_proxy_tokens_total",
                              "Tokens by kind (input, output, reasoning, cache_read, "
                              "cache_write; cached = cache_read)", ["kind"],
                              registry=registry)
        self.cache = CacheStats()
        self.upstream_errors = Counter("claude_proxy_upstream_errors_total",
                                       "Upstream failures by Anthropic error type", ["type"],
                                       registry=registry)
        self.retries = Counter("claude_proxy_upstream_retries_total",
                               "Upstream attempts retried before the first byte",
                               registry=registry)
        self.provider_attempts = Counter(
            "claude_proxy_provider_attempts_total",
            "Upstream attempts by provider, route and outcome (ok, failed_over, error)",
            ["provider", "route", "outcome"], registry=registry)
        self.web_searches = Counter("claude_proxy_web_searches_total",
                                    "Web searches by backend (or native:<provider>) and "
                                    "outcome (ok, empty or the Anthropic error code)",
                                    ["backend", "outcome"], registry=registry)
        self.cost = Counter("claude_proxy_cost_usd", "Spend in USD by key name (never the "
                            "key), provider and upstream model", ["key", "provider", "model"],
                            registry=registry)
        self.tool_calls = Counter(
            "claude_proxy_tool_calls_total", "Upstream tool calls by provider, model and what "
            "the guard found (valid, repaired, repairable, invalid, unchecked, overflow, "
            "dropped)", ["provider", "model", "outcome"], registry=registry)
        self.tool_call_repairs = Counter(
            "claude_proxy_tool_call_repairs_total", "Tool-call repairs by provider, model and "
            "kind (the rung and what it changed)", ["provider", "model", "kind"],
            registry=registry)
        self.tool_calls_of = Children(self.tool_calls)
        self.tool_repairs_of = Children(self.tool_call_repairs)
        self.requests_of = Children(self.requests)
        self.first_byte_of = Children(self.time_to_first_byte)
        self.duration_of = Children(self.duration)
        self.tokens_of = Children(self.tokens)
        self.attempts_of = Children(self.provider_attempts)
        self.active_streams = Gauge("claude_proxy_active_streams",
                                    "Streaming responses in progress", registry=registry,
                                    multiprocess_mode="livesum")

    def count_retry(self) -> None:
        self.retries.inc()

    def count_upstream_error(self, error_type: str) -> None:
        self.upstream_errors.labels(error_type).inc()

    def close(self) -> None:
        """A worker that stops: its live gauges no longer count (multiprocess mode)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    def exposition(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            combined = CollectorRegistry()
            multiprocess.MultiProcessCollector(combined)  # type: ignore[no-untyped-call]
            return generate_latest(combined)
        return generate_latest(self.registry)
