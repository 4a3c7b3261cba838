"""Built-in context windows and output limits of the bundled profiles' models.

(profile, model id) → {"context_window": N, "max_output_tokens": M}; each entry with the
provider document it was checked against and the date, in a comment beside it. A figure that
could not be confirmed is left out (unknown: no pre-flight on it) rather than guessed. vLLM and
Ollama serve whatever the operator loaded: their windows are discovered at start
(routing/discovery.py), never built in.
"""

from __future__ import annotations

from typing import Any

_GPT_5_5 = {"context_window": 1_050_000, "max_output_tokens": 128_000}
# GPT-5.5: 1,050,000 context, 128,000 max output (OpenAI's model page as quoted by
# docs.oxen.ai gpt-5-5-2026-04-23 and docs.venice.ai gpt-5-5; checked 2026-11-25).
_GPT_5_4_MINI = {"context_window": 400_000, "max_output_tokens": 128_000}
# GPT-5.4 mini: 400,000 context, 128,000 max output (vercel.com/ai-gateway/models/openai/
# gpt-5.4-mini, linking developers.openai.com/api/docs/models/gpt-5.4-mini; 2026-11-25).
_KIMI_K3 = {"context_window": 1_048_576}
# Kimi K3: 1,048,576-token context (caudena/beam_weaver v0.1.12 release notes, from Moonshot's
# model list; the output limit is not confirmed; 2026-11-25).
_GPT_4O = {"context_window": 128_000, "max_output_tokens": 16_384}
# platform.openai.com/docs/models/gpt-4o and /gpt-4o-mini: 128,000 context, 16,384 max output
# (checked 2026-11-25).

BUILT_IN_WINDOWS: dict[tuple[str, str], dict[str, Any]] = {
    # ---- the profiles' default models
    ("kimi", "kimi-k3"): _KIMI_K3,
    # Z.ai GLM-5.3: 1,048,576 context, 131,072 output (openrouter.ai/~z-ai/glm-latest, which
    # points to GLM 5.3); GLM-5.3-Flash: 1,048,576 context, 128,000 output
    # (vercel.com/ai-gateway/models/zai/glm-5.3-flash linking docs.z.ai/guides/vlm/glm-5.3-flash;
    # getmaxim.ai zai/glm-5.3-flash for the output limit; 2026-11-25).
    ("glm", "glm-5.3"): {"context_window": 1_048_576, "max_output_tokens": 131_072},
    ("glm", "glm-5.3-flash"): {"context_window": 1_048_576, "max_output_tokens": 128_000},
    # DeepSeek V4 (Pro and Flash): 1M-token context, 1,048,576 on the API; Flash writes up to
    # 384K (openrouter.ai/deepseek/deepseek-v4-flash; docs.apiyi.com V4 Flash GA "1M 上下文、
    # 384K 最大输出"; the V4 technical report: both support one million tokens; 2026-11-25).
    ("deepseek", "deepseek-v4-pro"): {"context_window": 1_048_576},
    ("deepseek", "deepseek-v4-flash"): {"context_window": 1_048_576,
                                        "max_output_tokens": 393_216},
    # Qwen3.8-Max: 991,000 context, 128,000 output (vercel.com/ai-gateway/models/
    # qwen3.8-max-0902, the snapshot of qwen3.8-max, linking Model Studio's model page;
    # 2026-11-25).
    ("dashscope", "qwen3.8-max"): {"context_window": 991_000, "max_output_tokens": 128_000},
    ("openai", "gpt-5.5"): _GPT_5_5,
    ("openai", "gpt-5.4-mini"): _GPT_5_4_MINI,
    ("azure", "gpt-5.5"): _GPT_5_5,
    ("azure", "gpt-5.4-mini"): _GPT_5_4_MINI,
    # OpenRouter serves them with the same limits; its /models list is also read at start.
    ("openrouter", "moonshotai/kimi-k3"): _KIMI_K3,
    ("openrouter", "openai/gpt-5.4-mini"): _GPT_5_4_MINI,
    # ---- earlier defaults, still common in configurations
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
