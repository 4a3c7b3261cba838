"""The upstream models a key can reach, and the start-up check that a budget can be counted.

A key reaches each candidate of the routes and fallbacks it may use, and, without a `default`
route, the first provider's opus / sonnet / haiku models (the default mapping). A client may
also name a model explicitly (`PROVIDER,MODEL`); that one is checked when asked for (service.py
refuses an unpriced model to a key with a budget).
"""

from __future__ import annotations

from claude_proxy.config.file import ConfigurationError, ProxyConfig
from claude_proxy.config.key_specs import KeySpec
from claude_proxy.config.settings import TIERS
from claude_proxy.routing.router import Router


def reachable(config: ProxyConfig, spec: KeySpec) -> list[tuple[str, str]]:
    """(provider, model) pairs `spec` may be routed to, in a stable order, without repeats."""
    router = Router(config.providers, config.router)
    found: list[tuple[str, str]] = []
    candidates = [c for name in router.route_names() for c in router.route(name)]
    for candidate in candidates + router.fallbacks():
        if spec.may_use(candidate.provider, candidate.route):
            found.append((candidate.provider, candidate.model))
    first = config.providers[router.first]
    if not router.route("default") and spec.may_use(router.first, "default"):
        found.extend((router.first, first.model_for_tier(tier)) for tier in TIERS)
    return list(dict.fromkeys(found))


def check_budgets(config: ProxyConfig) -> ProxyConfig:
    """`config`, once every key with a budget is known to reach only priced models (its spend
    could not be counted otherwise): ConfigurationError names the first that does not."""
    for spec in config.keys.values():
        if spec.budget_usd is None:
            continue
        for provider, model in reachable(config, spec):
            if not config.models.facts(provider, model).priced:
                raise ConfigurationError(
                    f"{config.source}: [keys.{spec.name}] has a budget, but model {model!r} of "
                    f"provider {provider!r} has no price: set price_input and price_output in "
                    f"[providers.{provider}.models.\"{model}\"]")
    return config
