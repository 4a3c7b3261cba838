"""Built-in context windows and output limits of the bundled profiles' models.

(profile, model id) → {"context_window": N, "max_output_tokens": M}; each entry with the
provider document it was checked against and the date, in a comment beside it. A figure that
could not be confirmed is left out (unknown: no pre-flight on it) rather than guessed. vLLM and
Ollama serve whatever the operator loaded: their windows are discovered at start
(routing/discovery.py), never built in.
"""

from __future__ import annotations

from typing import Any

_GPT_4O = {"context_window": 128_000, "max_output_tokens": 16_384}
# platform.openai.com/docs/models/gpt-4o and /gpt-4o-mini: 128,000 context, 16,384 max output
# (checked 2026-11-25).

BUILT_IN_WINDOWS: dict[tuple[str, str], dict[str, Any]] = {
    # Moonshot: kimi-k2.6 has a 262,144-token window (Kimi K2 family "256k context";
    # vercel.com/ai-gateway/models/kimi-k2.6 "262.1K", served by moonshotai; 2026-11-25).
    ("kimi", "kimi-k2.6"): {"context_window": 262_144},
    # Z.ai: GLM-5 200K context, 128K output (docs.aws.amazon.com model card zai-glm-5
    # "Context window: 200,000"; 128K max output; 2026-11-25).
    ("glm", "glm-5"): {"context_window": 200_000, "max_output_tokens": 131_072},
    # Z.ai: GLM-4.7-Flash 200K context (openrouter.ai/z-ai/glm-4.7-flash: 202,752; the lower
    # 200,000 of Z.ai's own "200K" is kept; 2026-11-25).
    ("glm", "glm-4.7-flash"): {"context_window": 200_000},
    # DeepSeek V3.2 behind both aliases: 128K context; deepseek-chat 8K max output,
    # deepseek-reasoner 64K (api-docs.deepseek.com/quick_start/pricing, as quoted by
    # RooCodeInc/Roo-Code packages/types/src/providers/deepseek.ts, updated 2025-12-09;
    # the older 64K page describes V3/R1; checked 2026-11-25).
    ("deepseek", "deepseek-chat"): {"context_window": 128_000, "max_output_tokens": 8_192},
    ("deepseek", "deepseek-reasoner"): {"context_window": 128_000, "max_output_tokens": 65_536},
    # Alibaba Model Studio: qwen3-max 262,144 context, 65,536 output; qwen-plus and qwen-flash
    # (Qwen3) 1,000,000 context, 32,768 output (Model Studio model list as mirrored by
    # vercel.com/ai-gateway/models/qwen3-max and getmaxim.ai dashscope/qwen-plus-latest;
    # 2026-11-25).
    ("dashscope", "qwen3-max"): {"context_window": 262_144, "max_output_tokens": 65_536},
    ("dashscope", "qwen-plus"): {"context_window": 1_000_000, "max_output_tokens": 32_768},
    ("dashscope", "qwen-flash"): {"context_window": 1_000_000, "max_output_tokens": 32_768},
    ("openai", "gpt-4o"): _GPT_4O,
    ("openai", "gpt-4o-mini"): _GPT_4O,
    ("azure", "gpt-4o"): _GPT_4O,
    ("azure", "gpt-4o-mini"): _GPT_4O,
    # OpenRouter serves the same OpenAI models with the same limits (openrouter.ai/openai/
    # gpt-4o: 128,000 context; its /models list is also read at start).
    ("openrouter", "openai/gpt-4o"): _GPT_4O,
    ("openrouter", "openai/gpt-4o-mini"): _GPT_4O,
}
