"""The upstream models a key can reach, for the start-up check that a budget can be counted.

A key reaches each candidate of the routes and fallbacks it may use, and, without a `default`
route, the first provider's opus / sonnet / haiku models (the default mapping). A client may
also name a model explicitly (`PROVIDER,MODEL`); that one is checked when asked for (service.py
refuses an unpriced model to a key with a budget).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from claude_proxy.keys import KeySpec
from claude_proxy.routing.router import Router

if TYPE_CHECKING:
    from claude_proxy.routing.config import ProxyConfig

TIERS: tuple[Literal["big", "middle", "small"], ...] = ("big", "middle", "small")


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
