"""A provider: one upstream with its own settings, HTTP client, refusal memory and health."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from claude_proxy.config.file import ProxyConfig
from claude_proxy.config.settings import TIERS, ProviderSettings
from claude_proxy.routing.health import CircuitBreaker
from claude_proxy.state.store import StateStore
from claude_proxy.upstream.capabilities import Refusals
from claude_proxy.upstream.client import OpenAIClient


@dataclass
class Provider:
    name: str
    settings: ProviderSettings
    client: OpenAIClient
    health: CircuitBreaker
    refusals: Refusals = field(default_factory=Refusals)

    @property
    def models(self) -> list[str]:
        """Its configured models (big, middle, small), without repeats."""
        return list(dict.fromkeys(self.settings.model_for_tier(tier) for tier in TIERS))


def build_providers(config: ProxyConfig, transport: httpx.AsyncBaseTransport | None = None,
                    on_retry: Callable[[], None] | None = None,
                    store: StateStore | None = None,
                    kept: Mapping[str, Provider] | None = None) -> dict[str, Provider]:
    """One Provider per configured upstream, each with its own pooled client; its health
    and refusal memory kept in `store` (shared by the fleet when it is). `kept`: the
    providers of the configuration before a reload; one whose settings did not change is
    kept as it is (its connections, and this process's counts of its successes)."""
    router = config.router
    failures = router.cooldown_failures if router else 3
    cooldown = router.cooldown_seconds if router else 30.0
    ttl = config.settings.refusal_ttl
    providers = {}
    for name, settings in config.providers.items():
        old = (kept or {}).get(name)
        if old is not None and (old.settings, old.health.failures_to_open,
                                old.health.base_cooldown, old.refusals.ttl) == (
                settings, failures, cooldown, ttl):
            providers[name] = old
            continue
        providers[name] = Provider(name, settings, OpenAIClient(settings, transport, on_retry),
                                   CircuitBreaker(failures, cooldown, store=store, name=name),
                                   Refusals(store, name, ttl))
    return providers
