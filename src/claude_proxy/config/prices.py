"""Built-in prices of the bundled profiles' default models, USD per million tokens.

(profile, model id) → {"price_input": …, "price_output": …, "price_cache_read": …,
"price_cache_write": …}; each entry with the provider's price page and the date, in a comment.
A default model without an entry has no price found on its provider's page: a key with a
budget that reaches it refuses to start until the config file gives one. Prices change: a
`[providers.NAME.models."MODEL"]` table (or provider-level keys) overrides any
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
    # Moonshot Kimi K3: $3.00 in (cache miss), $0.30 (cache hit), $15.00 out
    # (platform.kimi.ai/docs/pricing/chat-k3), checked 2026-11-25.
    ("kimi", "kimi-k3"): _price(3.00, 15.00, 0.30),
    # OpenRouter passes the provider's price through (openrouter.ai/moonshotai/kimi-k3).
    ("openrouter", "moonshotai/kimi-k3"): _price(3.00, 15.00, 0.30),
    # DeepSeek V4 (api-docs.deepseek.com/quick_start/pricing), checked 2026-11-25: priced by
    # the hour, off-peak at half the peak rate; the PEAK rates are given so that a budget never
    # counts low. deepseek-v4-flash is served by V4.1-Flash at the Flash price.
    ("deepseek", "deepseek-v4-pro"): _price(1.32, 3.96, 0.044),
    ("deepseek", "deepseek-v4-flash"): _price(0.30, 1.20, 0.006),
    # Alibaba Model Studio, international (Singapore) endpoint, first tier (input <= 128K);
    # implicit cache hits bill 20% of input (alibabacloud.com/help/en/model-studio/
    # model-pricing), checked 2026-11-25. qwen3.8-max: no price found on the page's
    # snapshot: set it in the config file.
    ("dashscope", "qwen-plus"): _price(0.40, 1.20, 0.08),
    ("dashscope", "qwen-flash"): _price(0.05, 0.40, 0.01),
    # OpenAI gpt-5.5: $5.00 in, $0.50 cached, $30.00 out; gpt-5.4-mini: $0.75, $0.075, $4.50
    # (platform.openai.com/docs/pricing), checked 2026-11-25. Azure OpenAI global deployments
    # list the same (azure.microsoft.com/pricing/details/cognitive-services/openai-service);
    # OpenRouter passes OpenAI's price through (openrouter.ai/openai/gpt-5.4-mini).
    ("openai", "gpt-5.5"): _price(5.00, 30.00, 0.50),
    ("openai", "gpt-5.4-mini"): _price(0.75, 4.50, 0.075),
    ("azure", "gpt-5.5"): _price(5.00, 30.00, 0.50),
    ("azure", "gpt-5.4-mini"): _price(0.75, 4.50, 0.075),
    ("openrouter", "openai/gpt-5.4-mini"): _price(0.75, 4.50, 0.075),
    # MiniMax-M2.7: $0.30 in (cache miss), $0.06 (cache hit), $1.20 out
    # (platform.minimax.io/docs/guides/pricing-paygo), checked 2026-11-25. MiniMax-M3: no
    # price found: set it in the config file.
    ("minimax", "MiniMax-M2.7"): _price(0.30, 1.20, 0.06),
    # Gemini 3.8 Flash: $0.75 in, $0.075 cached, $3.75 out, the launch price "through
    # December 31, 2026" ($1.50 / $7.50 after) (ai.google.dev/gemini-api/docs/pricing),
    # checked 2026-11-25. gemini-3.5-flash-lite: no price found: set it in the config file.
    ("gemini", "gemini-3.8-flash"): _price(0.75, 3.75, 0.075),
    # Z.AI GLM-5.3 and GLM-5.3-Flash: no price on docs.z.ai/guides/overview/pricing as found
    # on 2026-11-25 (resellers differ): set them in the config file.
    # Self-hosted: no per-token bill.
    ("vllm", "default"): _FREE,
    ("ollama", "qwen3"): _FREE,
}
