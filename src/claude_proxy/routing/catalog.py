"""What the proxy offers and how its providers are doing, in the shapes clients read:
`GET /v1/models` (Anthropic's list shape) and `GET /health?detail=1`.

Each model entry also carries what Claude Desktop's third-party gateway mode reads
(claude.com/docs/cowork/3p/gateway, "Models"): `anthropic_family_tier`, the Claude tier it
stands in for (without it Desktop drops every id that does not look like Claude's: all of
this proxy's), with `is_family_default` on one entry per tier (which the bare `opus`, `sonnet`
and `haiku` aliases then mean), and `max_input_tokens` / `max_tokens`, the model's whole window
and output limit from the model table (left out when unknown, never guessed).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from claude_proxy.config.file import ROUTE_NAMES
from claude_proxy.config.model_table import ModelTable
from claude_proxy.config.settings import TIERS
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Candidate, Router, asked_route, route_id

FAMILY_TIERS = {"big": "opus", "middle": "sonnet", "small": "haiku"}
"""The proxy's model tiers → the Claude tier each stands in for."""
ROUTE_TIERS = {**FAMILY_TIERS, "default": "opus", "think": "opus", "long_context": "opus",
               "image": "opus", "web_search": "opus", "subagent": "sonnet",
               "background": "haiku", "fallback": "opus"}
"""A route → the Claude tier of the requests it serves: the main loop's routes stand in for
opus (the launcher's main model), subagents for sonnet, background work for haiku."""


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


def model_entry(model_id: str, created: datetime, router: Router, models: ModelTable,
                default: bool = False) -> dict[str, Any]:
    """One model as Anthropic's Models API shows it, with the fields Claude Desktop reads."""
    provider, _, model = model_id.partition(",")
    asked = asked_route(model_id)
    shown = f"{model} ({provider})" if asked is None else f"claude-proxy route {asked}"
    entry: dict[str, Any] = {"type": "model", "id": model_id, "display_name": shown,
                             "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                             "anthropic_family_tier": family_tier(router, model_id),
                             "is_family_default": default}
    candidates = serving(router, model_id)
    window = smallest(candidate_windows(models, candidates))
    if window is not None:
        entry["max_input_tokens"] = window
    entry["max_tokens"] = output_limit(router, models, candidates)
    return entry


def models_page(ids: list[str], created: datetime, router: Router,
                models: ModelTable) -> dict[str, Any]:
    """One page with every model (the list is short, so never more than one page); the
    first entry of each tier is its family default."""
    defaults = family_defaults(router, ids)
    return {"data": [model_entry(model_id, created, router, models, model_id in defaults)
                     for model_id in ids], "has_more": False,
            "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}


def family_defaults(router: Router, ids: Iterable[str]) -> set[str]:
    """The first id of each Claude tier, in the list's order (route ids come first)."""
    first: dict[str, str] = {}
    for model_id in ids:
        first.setdefault(family_tier(router, model_id), model_id)
    return set(first.values())


def family_tier(router: Router, model_id: str) -> str:
    """The Claude tier an id stands in for: a route id by its route (`ROUTE_TIERS`); a
    `PROVIDER,MODEL` by the provider's tier that names the model, else by the first route
    that does; opus otherwise."""
    asked = asked_route(model_id)
    if asked is not None:
        return ROUTE_TIERS.get(asked, "opus")
    provider, _, model = model_id.partition(",")
    settings = router.providers.get(provider)
    if settings is not None:
        for tier in TIERS:
            if settings.model_for_tier(tier) == model:
                return FAMILY_TIERS[tier]
    for name in (*ROUTE_NAMES, "fallback"):
        route = router.route(name) if name != "fallback" else router.fallbacks()
        if any(c.provider == provider and c.model == model for c in route):
            return ROUTE_TIERS[name]
    return "opus"


def serving(router: Router, model_id: str) -> list[Candidate]:
    """Where a request for this id can end up: a route id's candidates (with the fallbacks);
    a `PROVIDER,MODEL` itself only (its window is the model's own)."""
    if asked_route(model_id) is None:
        return router.candidates({"model": model_id, "messages": []}, 0)[:1]
    return router.candidates({"model": model_id, "messages": []}, 0)


def route_candidates(router: Router, name: str) -> list[Candidate]:
    """Where a request for route `name` can end up: its own list, then the fallbacks; the
    first provider's tier when no such route is configured."""
    own = router.route(name) or router.route("default")
    if not own:
        own = [router.candidates({"model": route_id("big"), "messages": []}, 0)[0]]
    return [*own, *router.fallbacks()]


def candidate_windows(models: ModelTable, candidates: Iterable[Candidate]) -> list[int | None]:
    return [models.facts(c.provider, c.model).context_window for c in candidates]


def smallest(values: Iterable[int | None]) -> int | None:
    known = [value for value in values if value]
    return min(known) if known else None


def output_limit(router: Router, models: ModelTable, candidates: Iterable[Candidate]) -> int:
    """The smallest output limit among the candidates: the model's known
    `max_output_tokens`, else the provider's clamp (PROVIDER_MAX_OUTPUT_TOKENS or the
    profile's)."""
    limits = []
    for candidate in candidates:
        known = models.facts(candidate.provider, candidate.model).max_output_tokens
        clamp = router.providers[candidate.provider].max_output_tokens
        limits.append(min(known, clamp) if known else clamp)
    return min(limits)


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
