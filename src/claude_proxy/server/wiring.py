"""One configuration's objects, built at start and again at each reload (server/reload.py).

What lasts as long as the process (`Lasting`: the state store, the metrics, the rate-limit
gate, the session memo, the drain, the usage log) every configuration shares. What a
configuration makes is a `Wiring` (server/endpoints.py), immutable: the providers (each kept,
with its connections, when its settings did not change), the request service, the server-tool
flows, the judge, the key ring and the ledger. A reload builds a whole new one and swaps it in;
a request keeps the one it started with; what the old one held and the new one does not (the
clients of providers removed or changed, the old search backend) is closed once no request
can still use it (`retire`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from claude_proxy.config.file import ProxyConfig, judge_route
from claude_proxy.config.key_specs import ADMIN
from claude_proxy.config.settings import Settings
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.judge import RouteJudge
from claude_proxy.keys.budget import Clock, Gate
from claude_proxy.keys.ring import KeyRing
from claude_proxy.keys.spend import Ledger, UsageLog, open_usage_log
from claude_proxy.metrics import Metrics
from claude_proxy.routing.discovery import discover as discover_windows
from claude_proxy.routing.discovery import unknown_windows
from claude_proxy.routing.providers import build_providers
from claude_proxy.server.drain import Drain
from claude_proxy.server.endpoints import Wiring
from claude_proxy.service import MessagesService
from claude_proxy.state.memo import Memo
from claude_proxy.state.store import StateStore
from claude_proxy.telemetry import ProxyFacts, upstream_of
from claude_proxy.toolsearch.loop import ToolSearchFlow
from claude_proxy.toolsearch.loop import flatten as flatten_tool_search
from claude_proxy.websearch.backends import SearchBackend
from claude_proxy.websearch.caller import ServiceCaller
from claude_proxy.websearch.flow import SearchFlow
from claude_proxy.websearch.search_blocks import replay_blocks

logger = logging.getLogger("claude_proxy.app")

Close = Callable[[], Awaitable[None]]


@dataclass
class Lasting:
    """What lives as long as the process, whatever the configuration."""

    metrics: Metrics
    store: StateStore
    gate: Gate
    bodies: Memo
    started: datetime
    drain: Drain
    clock: Clock
    facts: ProxyFacts
    """What the telemetry knows of the providers and the secrets (extended by a reload)."""
    transport: httpx.AsyncBaseTransport | None = None
    usage: UsageLog | None = None
    """The usage log, opened with the first configuration that has `[keys]`."""
    restored: set[str] = field(default_factory=set)
    """Keys whose spend was read back from the usage file (once per key and process)."""


def replayed(body: dict[str, Any], signer: ThinkingSigner) -> dict[str, Any]:
    """Earlier turns' server-tool blocks (tool search, web search) as the upstream takes them:
    tool search first, whose `server_tool_use` blocks are not searches of the web."""
    return replay_blocks(flatten_tool_search(body), signer)


def data_dir(config: ProxyConfig) -> Path:
    """DATA_DIR, else `data/` beside the config file (keys exist only with one)."""
    if config.settings.data_dir:
        return Path(config.settings.data_dir)
    return Path(config.source).resolve().parent / "data"


def admin_key(settings: Settings) -> str | None:
    key = settings.anthropic_api_key
    return key.get_secret_value() if key is not None else None


async def wire(config: ProxyConfig, lasting: Lasting, previous: Wiring | None = None) -> Wiring:
    """Everything `config` makes, ready to serve (its windows discovered); nothing of
    `previous` is changed."""
    settings = config.settings
    secret = settings.thinking_signature_secret
    signer = ThinkingSigner(secret.get_secret_value() if secret else None)
    providers = build_providers(config, lasting.transport, on_retry=lasting.metrics.count_retry,
                                store=lasting.store,
                                kept=previous.service.providers if previous else None)
    await discover_windows(config, lasting.transport)
    unknown = unknown_windows(config)
    if unknown:
        logger.warning("context window unknown for %s: no pre-flight check for %s "
                       "(set context_window in the config file, or CONTEXT_WINDOW)",
                       ", ".join(unknown), "it" if len(unknown) == 1 else "them")
    keyring = KeyRing(config.keys, admin_key(settings)) if config.keys else None
    if keyring is not None and not admin_key(settings):
        logger.warning("[keys] are configured but ANTHROPIC_API_KEY is not: the dashboard and "
                       "/metrics are open to anyone who can reach the proxy")
    service = MessagesService(config, providers, signer, lasting.metrics, lasting.store,
                              keyring, replay=partial(replayed, signer=signer))
    route = judge_route(config)
    if route:
        service.translator.judge = RouteJudge(service, route, settings.safeguards_timeout)
    backend = SearchBackend(settings) if settings.web_search_backend else None
    search = SearchFlow(settings, backend, ServiceCaller(service), signer, lasting.metrics)
    lasting.facts.upstreams.update({
        name: upstream_of(provider.provider_name, provider.openai_base_url)
        for name, provider in config.providers.items()})
    return Wiring(settings, config, lasting.metrics, lasting.gate, keyring, lasting.started,
                  lasting.bodies, service, search, ToolSearchFlow(service),
                  ledger_for(config, keyring, lasting), lasting.drain)


def ledger_for(config: ProxyConfig, keyring: KeyRing | None, lasting: Lasting) -> Ledger | None:
    """The configuration's ledger (None without `[keys]`): its keys and prices, the process's
    usage log, and the spend of keys new to this process read back from the usage file."""
    if keyring is None:
        return None
    if lasting.usage is None:
        lasting.usage = open_usage_log(lasting.store, data_dir(config))
    ledger = Ledger(keyring, config.models, lasting.store, lasting.metrics, lasting.clock,
                    lasting.usage)
    new = [name for name in [*keyring.keys, ADMIN] if name not in lasting.restored]
    ledger.restore(new)
    lasting.restored.update(new)
    return ledger


def retire(old: Wiring, new: Wiring | None) -> list[Close]:
    """What `old` holds that `new` does not (all of it at shutdown), as closers: the clients
    of providers not kept, the search backend."""
    kept = set(map(id, new.service.providers.values())) if new is not None else set()
    closers: list[Close] = [provider.client.aclose for provider in old.service.providers.values()
                            if id(provider) not in kept]
    if old.search.backend is not None:
        closers.append(old.search.backend.aclose)
    return closers


async def close_all(closers: list[Close]) -> None:
    """Runs the closers; one that fails is logged, the others still run."""
    for close in closers:
        try:
            await close()
        except Exception:  # closing what is no longer used must not fail anything
            logger.exception("closing a retired upstream client failed")


async def warn_if_spend_unsafe(ledger: Ledger) -> None:
    """At start and after each reload, when keys have budgets: a WARNING if their spend
    would not survive a restart of the store (Redis without persistence, or evicting keys),
    else where it is kept."""
    found = await ledger.durability()
    if found is None:
        return
    if found.get("warning"):
        logger.warning("keys have budgets, but %s", found["warning"])
    elif "eviction" in found:
        logger.info("keys have budgets: their spend is kept by Redis: %s; maxmemory-policy %s",
                    found["persistence"], found["eviction"])
    else:
        logger.info("keys have budgets: their spend is kept in %s", found["kept"])
