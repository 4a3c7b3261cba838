"""The GenAI client metrics (`telemetry/`), in the generation OTEL_SEMCONV_STABILITY_OPT_IN
selects: open-telemetry/semantic-conventions-genai, docs/gen-ai/gen-ai-metrics.md (the
generation instrumentations have emitted) and docs/gen-ai/client-inference.md (the latest)."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.util.types import AttributeValue

from claude_proxy import __version__

# Bucket boundaries the conventions give.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
USAGE_COUNTERS = {  # the latest generation's counters, by the record's token kinds
    "input": "input_tokens", "output": "output_tokens",
    "cache_read": "cache_read.input_tokens", "cache_write": "cache_write.input_tokens",
    "reasoning": "reasoning.output_tokens",
}


class GenAIMetrics:
    """The GenAI client metrics, per provider and model, in the generation
    OTEL_SEMCONV_STABILITY_OPT_IN selects: by default the one instrumentations have emitted
    (`gen_ai.client.operation.*`, `gen_ai.client.token.usage`); with
    `gen_ai_latest_experimental`, the latest (`gen_ai.client.inference.*`) instead, as the
    conventions ask ("emit the latest … and do not emit the old one")."""

    def __init__(self, meters: MeterProvider, latest: bool) -> None:
        meter = meters.get_meter("claude_proxy", __version__)
        operation = "gen_ai.client.inference" if latest else "gen_ai.client.operation"
        self.duration = meter.create_histogram(
            "gen_ai.client.inference.duration" if latest else "gen_ai.client.operation.duration",
            unit="s", description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.first_chunk = meter.create_histogram(
            f"{operation}.time_to_first_chunk", unit="s",
            description="Time to receive the first chunk in a streaming operation.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.latest = latest
        if not latest:
            self.tokens = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
            return
        self.per_operation = {kind: meter.create_histogram(
            f"gen_ai.client.inference.operation.{kind}_tokens", unit="{token}",
            description=f"The number of {kind} tokens used per inference operation.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS) for kind in ("input", "output")}
        self.counters = {kind: meter.create_counter(
            f"gen_ai.client.inference.usage.{name}", unit="{token}")
            for kind, name in USAGE_COUNTERS.items()}

    def usage(self, tokens: dict[str, int], attributes: dict[str, AttributeValue]) -> None:
        """One operation's tokens (the record's Anthropic usage: input without the cache)."""
        counts = {**tokens, "input": input_tokens(tokens)}
        if not self.latest:
            for kind in ("input", "output"):
                self.tokens.record(counts.get(kind, 0),
                                   {**attributes, "gen_ai.token.type": kind})
            return
        for kind, histogram in self.per_operation.items():
            histogram.record(counts.get(kind, 0), attributes)
        # The upstreams' usage does not say which tokens were text and which images.
        by_modality = {**attributes, "gen_ai.token.modality": "unknown"}
        for kind, counter in self.counters.items():
            counter.add(counts.get(kind, 0), by_modality)


def input_tokens(tokens: dict[str, int]) -> int:
    """The conventions' input tokens include the cached ones; Anthropic's usage does not."""
    return tokens.get("input", 0) + tokens.get("cache_read", 0) + tokens.get("cache_write", 0)
