"""What the proxy offers and how its providers are doing, in the shapes clients read:
`GET /v1/models` (Anthropic's list shape) and `GET /health?detail=1`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from claude_proxy.config.file import ROUTE_NAMES
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Router, asked_route


def model_ids(router: Router, providers: Mapping[str, Provider]) -> list[str]:
    """The route ids (`route:default`, …: what `claude-proxy claude` gives Claude Code), then
    every router entry and every provider's configured models, as `PROVIDER,MODEL`."""
    ids: list[str] = router.route_ids()
    for name in (*ROUTE_NAMES, "fallback"):
        candidates = router.route(name) if name != "fallback" else router.fallbacks()
        ids.extend(f"{c.provider},{c.model}" for c in candidates)
    for provider in providers.values():
        ids.extend(f"{provider.name},{model}" for model in provider.models)
    return list(dict.fromkeys(ids))


def model_entry(model_id: str, created: datetime) -> dict[str, Any]:
    provider, _, model = model_id.partition(",")
    asked = asked_route(model_id)
    shown = f"{model} ({provider})" if asked is None else f"claude-proxy route {asked}"
    return {"type": "model", "id": model_id, "display_name": shown,
            "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ")}


def models_page(ids: list[str], created: datetime) -> dict[str, Any]:
    """One page with every model (the list is short, so never more than one page)."""
    return {"data": [model_entry(model_id, created) for model_id in ids], "has_more": False,
            "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}


NO_CACHE_USE = {"prompt_tokens": 0, "cache_read_tokens": 0, "cache_hit_ratio": 0.0}


def health_detail(providers: Mapping[str, Provider],
                  cache: Mapping[str, dict[str, Any]] | None = None,
                  windows: Mapping[str, dict[str, Any]] | None = None,
                  backend: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Each provider's breaker state, prompt-cache hit ratio (`metrics.CacheStats`) and
    its models' context windows with where each came from (`discovery.windows`), and the
    state backend (`StateStore.describe()`): with a shared one the breakers are the fleet's,
    the counts of successes, failures and cache use this process's own."""
    detail: dict[str, Any] = {}
    for name, provider in providers.items():
        snapshot = asdict(provider.health.snapshot())
        until = snapshot.pop("cooling_until")
        snapshot["cooling_until"] = (None if until is None else datetime.fromtimestamp(
            until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        detail[name] = {"profile": provider.settings.provider_name, **snapshot,
                        "prompt_cache": (cache or {}).get(name, NO_CACHE_USE),
                        "models": (windows or {}).get(name, {})}
    state = dict(backend or {"backend": "in-process", "state": "ok", "shared": False})
    if state.get("shared"):
        scope = (f"fleet-wide: cooldowns, probes and refused fields are shared through "
                 f"{state['backend']} by every worker and replica; successes, failures and "
                 f"prompt_cache are this process's own (pid {os.getpid()})")
    else:
        scope = (f"this process only (pid {os.getpid()}); other workers or replicas keep "
                 "their own state")
    return {"scope": scope, "state_backend": state, "providers": detail}
