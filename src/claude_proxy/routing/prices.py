"""Built-in prices of the bundled profiles' default models, USD per million tokens.

(profile, model id) → {"price_input": …, "price_output": …, "price_cache_read": …,
"price_cache_write": …}; each entry with the provider's price page and the date, in a comment.
Prices change: a `[providers.NAME.models."MODEL"]` table (or provider-level keys) overrides any
of them. Where a provider prices by context length, the first (shortest) tier is given. A cache
write price is given only where the provider bills writes apart (else the input price applies).
Self-hosted servers (vllm, ollama) bill nothing per token: their models cost 0.
"""

from __future__ import annotations

from typing import Any


def _price(inp: float, out: float, read: float | None = None,
           write: float | None = None) -> dict[str, Any]:
    prices: dict[str, Any] = {"price_input": inp, "price_output": out}
    if read is not None:
        prices["price_cache_read"] = read
    if write is not None:
        prices["price_cache_write"] = write
    return prices


_FREE = _price(0.0, 0.0, 0.0, 0.0)

BUILT_IN_PRICES: dict[tuple[str, str], dict[str, Any]] = {
    # Moonshot Kimi K2.6: $0.95 in, $0.16 cached in, $4.00 out (platform.moonshot.ai pricing,
    # as also listed by Cloudflare Workers AI for @cf/moonshotai/kimi-k2.6), checked 2026-11-25.
    ("kimi", "kimi-k2.6"): _price(0.95, 4.00, 0.16),
    # Z.AI GLM-5: $1.00 in, $0.20 cached, $3.20 out; GLM-4.7-Flash: $0.07 in, $0.40 out
    # (docs.z.ai/guides/overview/pricing), checked 2026-11-25.
    ("glm", "glm-5"): _price(1.00, 3.20, 0.20),
    ("glm", "glm-4.7-flash"): _price(0.07, 0.40, 0.0),
    # DeepSeek: deepseek-chat $0.27 in (cache miss), $0.07 (cache hit), $1.10 out;
    # deepseek-reasoner $0.55 / $0.14 / $2.19
    # (api-docs.deepseek.com/quick_start/pricing-details-usd), checked 2026-11-25.
    ("deepseek", "deepseek-chat"): _price(0.27, 1.10, 0.07),
    ("deepseek", "deepseek-reasoner"): _price(0.55, 2.19, 0.14),
    # Alibaba Model Studio, international (Singapore) endpoint, first tier (input <= 32K, or
    # <= 128K for qwen-flash); implicit cache hits bill 20% of input
    # (alibabacloud.com/help/en/model-studio/model-pricing), checked 2026-11-25.
    ("dashscope", "qwen3-max"): _price(1.20, 6.00, 0.24),
    ("dashscope", "qwen-plus"): _price(0.40, 1.20, 0.08),
    ("dashscope", "qwen-flash"): _price(0.05, 0.40, 0.01),
    # OpenAI gpt-4o: $2.50 in, $1.25 cached, $10.00 out; gpt-4o-mini: $0.15, $0.075, $0.60
    # (platform.openai.com/docs/pricing), checked 2026-11-25. OpenRouter passes provider
    # prices through (openrouter.ai/openai/gpt-4o); Azure OpenAI global deployments list the
    # same (azure.microsoft.com/pricing/details/cognitive-services/openai-service).
    ("openai", "gpt-4o"): _price(2.50, 10.00, 1.25),
    ("openai", "gpt-4o-mini"): _price(0.15, 0.60, 0.075),
    ("azure", "gpt-4o"): _price(2.50, 10.00, 1.25),
    ("azure", "gpt-4o-mini"): _price(0.15, 0.60, 0.075),
    ("openrouter", "openai/gpt-4o"): _price(2.50, 10.00, 1.25),
    ("openrouter", "openai/gpt-4o-mini"): _price(0.15, 0.60, 0.075),
    # Self-hosted: no per-token bill.
    ("vllm", "default"): _FREE,
    ("ollama", "qwen3"): _FREE,
}
