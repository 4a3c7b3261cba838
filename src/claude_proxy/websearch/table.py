"""Where the search backend's settings come from: WEB_SEARCH_* in the environment, overridden
key by key by a config file's `[web_search]` table (the same names in lower case without the
prefix, `api_key = "env:NAME"` allowed). Checked once at start-up: an unknown backend or a
keyed backend without its key stops the proxy, naming the key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from claude_proxy.config.file import ConfigurationError, ProxyConfig, resolve_secret
from claude_proxy.config.settings import SearchSettings
from claude_proxy.websearch.backends import KEYED_BACKENDS

PREFIX = "web_search_"
TABLE = "[web_search]"


def with_search_table(config: ProxyConfig,
                      environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """The config with its `[web_search]` table applied to the settings, checked."""
    table = config.tables.get("web_search") or {}
    if table:
        path = Path(config.source)
        values = {PREFIX + key.lower(): resolve_secret(
            path, TABLE, key, value, os.environ if environ is None else environ)
            for key, value in table.items()}
        try:
            checked = SearchSettings(**values)
        except ValidationError as exc:
            raise ConfigurationError("\n".join(
                f"{path}: {TABLE} {'.'.join(str(p) for p in err['loc']).removeprefix(PREFIX)}"
                f": {err['msg']}" for err in exc.errors(include_url=False))) from None
        settings = config.settings.model_copy(
            update={name: getattr(checked, name) for name in values})
        config = replace(config, settings=settings)
    problem = configuration_problem(config.settings, f"{config.source}: {TABLE} "
                                    if table else "")
    if problem is not None:
        raise ConfigurationError(problem)
    return config


def configuration_problem(settings: SearchSettings, where: str = "") -> str | None:
    """Why the configured backend cannot work, naming the key to set (else None)."""
    def key(name: str) -> str:
        return f"{where}{name}" if where else f"WEB_SEARCH_{name.upper()}"

    name = settings.web_search_backend
    if name == "searxng" and not settings.web_search_url:
        return (f"{key('url')} is not set: the searxng backend needs the base URL of a "
                "SearXNG instance with JSON output enabled")
    secret = settings.web_search_api_key
    if name in KEYED_BACKENDS and (secret is None or not secret.get_secret_value()):
        return f"{key('api_key')} is not set: the {name} backend needs its API key"
    return None


def describe(config: ProxyConfig) -> str:
    """Web search as configured, for the startup line."""
    backend = config.settings.web_search_backend
    native = [name for name, p in config.providers.items() if p.web_search == "native"]
    off = [name for name, p in config.providers.items()
           if p.web_search == "off" or (p.web_search is None and backend is None)]
    parts = [f"backend {backend}" if backend else "no backend"]
    if native:
        parts.append(f"native on {','.join(native)}")
    if off:
        parts.append(f"answers `unavailable` on {','.join(off)}"
                     + ("" if backend else " (set WEB_SEARCH_BACKEND to search)"))
    return ", ".join(parts)
