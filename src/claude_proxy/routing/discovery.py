"""Context windows the upstreams tell at start, recorded with ModelTable.discover.

Where a server says how long a prompt it takes, that beats any built-in figure: vLLM's
`GET /v1/models` (`max_model_len`), OpenRouter's `GET /models` (`context_length`, and the top
provider's `max_completion_tokens`), llama.cpp's `GET /props` (`n_ctx`, the per-slot context it
runs with), and Ollama: `GET /api/ps` (the `context_length` a loaded model really runs with),
else `POST /api/show` (a Modelfile's `num_ctx`), else Ollama's documented default of 4096 tokens,
capped by the model's own `context_length`. Ollama's OpenAI-compatible API cannot be told a
context length per request (its ChatCompletionRequest has no `options`) and cuts a longer prompt
silently, so the window it loads with is the one the pre-flight must hold requests to.

Every probe is bounded by PROBE_TIMEOUT and failures are only logged: discovery never keeps the
proxy from starting.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from claude_proxy.config.file import ROUTE_NAMES, ProxyConfig
from claude_proxy.config.model_table import ModelFacts
from claude_proxy.config.settings import TIERS, ProviderSettings
from claude_proxy.upstream.client import OpenAIClient
from claude_proxy.upstream.llamacpp import parse_props
from claude_proxy.upstream.transport import UpstreamHttpClient

logger = logging.getLogger("claude_proxy.discovery")

PROBE_TIMEOUT = 3.0
OLLAMA_DEFAULT_CONTEXT = 4096
"""docs.ollama.com/context-length: 4k below 24 GiB of VRAM (more on bigger GPUs)."""
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)", re.MULTILINE)
_NOT_PROBED_HOSTS = ("api.openai.com", "azure.com", "azure-api.net")

Found = dict[str, ModelFacts]
Probe = Callable[[httpx.AsyncClient, ProviderSettings, list[str]], Awaitable[Found]]


def models_in_use(config: ProxyConfig) -> dict[str, list[str]]:
    """Each provider's models: its big/middle/small models, then those its routes name."""
    used: dict[str, list[str]] = {}
    for name, settings in config.providers.items():
        used[name] = [settings.model_for_tier(tier) for tier in TIERS]
    router = config.router
    if router is not None:
        for entry in [e for route in ROUTE_NAMES for e in router.route(route)] + router.fallback:
            provider, _, model = entry.partition(",")
            used.setdefault(provider.strip(), []).append(model.strip())
    return {name: list(dict.fromkeys(models)) for name, models in used.items()}


def windows(config: ProxyConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """provider → model → its window, output limit and where they came from (doctor and
    /health?detail=1 show it; None: unknown, no pre-flight)."""
    report: dict[str, dict[str, dict[str, Any]]] = {}
    for provider, models in models_in_use(config).items():
        for model in models:
            facts = config.models.facts(provider, model)
            report.setdefault(provider, {})[model] = {
                "context_window": facts.context_window,
                "max_output_tokens": facts.max_output_tokens,
                "source": facts.sources.get("context_window", "unknown: no pre-flight")}
    return report


def unknown_windows(config: ProxyConfig) -> list[str]:
    return [f"{provider},{model}" for provider, models in windows(config).items()
            for model, facts in models.items() if facts["context_window"] is None]


async def discover(config: ProxyConfig, transport: httpx.AsyncBaseTransport | None = None,
                   timeout: float = PROBE_TIMEOUT) -> None:
    """Ask every provider that can say, at once; record what they said."""
    used = models_in_use(config)
    # The upstream client's kind (aiohttp's transport, the shared SSL context): httpx's own
    # transport would load httpcore and h11 and a CA bundle of its own for this alone
    # (~1.7 MiB of resident memory, kept after the probes are done).
    async with UpstreamHttpClient(timeout=timeout, transport=transport) as client:
        jobs = [(name, _probe(client, settings, used.get(name, []), timeout))
                for name, settings in config.providers.items()]
        results = await asyncio.gather(*(job for _, job in jobs))
    for (name, _), found in zip(jobs, results, strict=True):
        for model, facts in found.items():
            config.models.discover(name, model, facts)
            logger.info("provider %s model %s: context window %s (%s)", name, model,
                        facts.context_window, facts.sources.get("context_window", ""))


async def _probe(client: httpx.AsyncClient, settings: ProviderSettings, models: list[str],
                 timeout: float) -> Found:
    found: Found = {}
    for probe in _probes(settings):
        try:
            async with asyncio.timeout(timeout):
                more = await probe(client, settings, models)
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            logger.debug("window probe %s for %s failed: %r", probe.__name__,
                         settings.openai_base_url, exc)
            continue
        found.update({model: facts for model, facts in more.items() if model not in found})
    return found


def _probes(settings: ProviderSettings) -> list[Probe]:
    profile = settings.provider_name
    if profile == "ollama":
        return [ollama]
    if profile == "openrouter":
        return [openrouter]
    if profile == "llamacpp":
        return [llamacpp]
    host = urlsplit(settings.openai_base_url).netloc.lower()
    if profile in ("vllm", "openai", "generic") and not any(h in host for h in _NOT_PROBED_HOSTS):
        return [vllm, llamacpp]
    return []


async def _get(client: httpx.AsyncClient, settings: ProviderSettings, url: str,
               json: dict[str, Any] | None = None) -> Any:
    headers = OpenAIClient._auth_headers(settings)
    response = await (client.post(url, json=json, headers=headers) if json is not None
                      else client.get(url, headers=headers))
    response.raise_for_status()
    return response.json()


def _root(settings: ProviderSettings) -> str:
    """The server's root: the base URL without its `/v1`."""
    base = settings.openai_base_url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _facts(window: Any, source: str, output: Any = None) -> ModelFacts | None:
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    known: dict[str, Any] = {"context_window": window}
    if isinstance(output, int) and not isinstance(output, bool) and output > 0:
        known["max_output_tokens"] = output
    return ModelFacts(**known, sources={key: source for key in known})


def _for_all(models: list[str], facts: ModelFacts | None) -> Found:
    return {model: facts for model in models} if facts is not None else {}


async def vllm(client: httpx.AsyncClient, settings: ProviderSettings, models: list[str]) -> Found:
    """vLLM (and SGLang): `max_model_len` per served model. One served model answers for
    every model name of the provider (vLLM serves one, whatever the request names)."""
    data = (await _get(client, settings, f"{settings.openai_base_url}/models"))["data"]
    found: Found = {}
    for entry in data:
        facts = _facts(entry.get("max_model_len"), "discovered: /v1/models max_model_len")
        if facts is not None:
            found[str(entry.get("id"))] = facts
    if len(found) == 1:
        only = next(iter(found.values()))
        found.update({model: only for model in models if model not in found})
    return found


async def llamacpp(client: httpx.AsyncClient, settings: ProviderSettings,
                   models: list[str]) -> Found:
    """llama.cpp's server: one model, each slot with `n_ctx` tokens."""
    props = parse_props(await _get(client, settings, f"{_root(settings)}/props"))
    n_ctx = props.n_ctx if props is not None else None
    return _for_all(models, _facts(n_ctx, "discovered: llama.cpp /props n_ctx"))


async def openrouter(client: httpx.AsyncClient, settings: ProviderSettings,
                     models: list[str]) -> Found:
    data = (await _get(client, settings, f"{settings.openai_base_url}/models"))["data"]
    wanted = set(models)
    found: Found = {}
    for entry in data:
        if entry.get("id") in wanted:
            top = entry.get("top_provider") or {}
            facts = _facts(entry.get("context_length"), "discovered: OpenRouter /models "
                           "context_length", top.get("max_completion_tokens"))
            if facts is not None:
                found[entry["id"]] = facts
    return found


async def ollama(client: httpx.AsyncClient, settings: ProviderSettings,
                 models: list[str]) -> Found:
    """The context each model runs with: loaded (`/api/ps`), its Modelfile's `num_ctx`
    (`/api/show`), else Ollama's default; never more than the model's own maximum."""
    loaded = {_tagged(entry.get("name", "")): entry.get("context_length")
              for entry in (await _get(client, settings, f"{_root(settings)}/api/ps")
                            ).get("models") or []}
    found: Found = {}
    for model in models:
        show = await _get(client, settings, f"{_root(settings)}/api/show", {"model": model})
        info = show.get("model_info") or {}
        maximum = next((v for k, v in info.items() if k.endswith(".context_length")
                        and isinstance(v, int)), None)
        num_ctx = _NUM_CTX.search(str(show.get("parameters") or ""))
        if isinstance(loaded.get(_tagged(model)), int):
            window, source = loaded[_tagged(model)], "discovered: Ollama /api/ps context_length"
        elif num_ctx:
            window, source = int(num_ctx.group(1)), "discovered: Ollama /api/show num_ctx"
        else:
            window, source = OLLAMA_DEFAULT_CONTEXT, "Ollama's default context (4096)"
        if maximum is not None and maximum < window:
            window, source = maximum, "discovered: Ollama /api/show context_length"
        facts = _facts(window, source)
        if facts is not None:
            found[model] = facts
    return found


def _tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"
