"""Where the providers and routes come from: one TOML config file, or the environment.

`--config FILE` (or `CONFIG_FILE`) names a TOML file, read through pydantic-settings' TOML
source. Its `[providers.NAME]` tables take the single-provider variables in lower case (or
`env_file = ".env.kimi"`, the file taken as it is, keys in the table winning); `[router]` says
which provider and model serves each kind of request. Without a file, the environment describes
one provider exactly as before. Every mistake is a `ConfigurationError` naming the file, the key
and the reason.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from claude_proxy.config.key_specs import KeySpec, KeyTableError, parse_keys
from claude_proxy.config.model_table import FACT_KEYS, ModelTable
from claude_proxy.config.settings import (
    TOOL_GROUP,
    TOOL_GROUPS_DISABLED,
    ProviderSettings,
    Settings,
    scan_prefixed,
)

logger = logging.getLogger("claude_proxy.config")

ROUTE_NAMES = ("default", "background", "think", "long_context", "image", "web_search",
               "subagent")
KEYLESS_PROFILES = frozenset({"ollama", "vllm", "llamacpp"})
SECRET_FROM_ENV = "env:"
FILE_PROVIDER_RETRIES = 1
"""A provider's own retries stay small: failover and Claude Code (10 tries) retry too."""


class ConfigurationError(Exception):
    """A problem that keeps the proxy from starting, worded for the person running it."""


class RouterSettings(BaseModel):
    """The `[router]` table: a route per kind of request, and the failover policy."""

    model_config = ConfigDict(extra="forbid")

    default: list[str] | None = None
    background: list[str] | None = None
    think: list[str] | None = None
    long_context: list[str] | None = None
    image: list[str] | None = None
    web_search: list[str] | None = None
    subagent: list[str] | None = None
    """Requests of Claude Code's subagents (the `x-claude-code-agent-id` header)."""
    long_context_threshold: int = Field(default=60000, ge=1)
    fallback: list[str] = Field(default_factory=list)
    safeguards: list[str] | None = None
    """The judge of Claude Code's Auto-mode tool calls (`safeguards` in a request), tried in
    order; unset: SAFEGUARDS_ROUTE, else `safeguard_results` say `unsupported`."""
    cooldown_failures: int = Field(default=3, ge=1)
    cooldown_seconds: float = Field(default=30.0, gt=0)

    @field_validator(*ROUTE_NAMES, "safeguards", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        """`"kimi,kimi-k2.6"`, or a list whose first entry is the route and the rest its own
        fallbacks."""
        return [value] if isinstance(value, str) else value

    def route(self, name: str) -> list[str]:
        value: list[str] | None = getattr(self, name)
        return value or []


class ConfigFile(BaseSettings):
    """The file's shape. Read through pydantic-settings' TOML source, nothing else."""

    model_config = SettingsConfigDict(extra="forbid")

    providers: dict[str, dict[str, Any]]
    router: RouterSettings | None = None
    web_search: dict[str, Any] | None = None
    keys: dict[str, Any] | None = None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the TOML source read: the environment never fills the file's shape."""
        return (init_settings,)


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the application is built from."""

    settings: Settings
    providers: dict[str, ProviderSettings]
    router: RouterSettings | None = None
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other tables of the config file (e.g. `[web_search]`), as written."""
    source: str = "environment"
    models: ModelTable = field(default_factory=ModelTable)
    """What is known of each provider's models: windows, output limits, prices."""
    keys: dict[str, KeySpec] = field(default_factory=dict)
    """The `[keys.NAME]` tables (key_specs.py); empty: the single client key of old."""
    key_secrets: tuple[str, ...] = ()
    """The keys read from the environment for `[keys]`, only for log redaction."""

    @property
    def first_provider(self) -> str:
        return next(iter(self.providers))

    def secrets(self) -> list[str]:
        """Every secret value in use, for log and response redaction."""
        values = self.settings.process_secrets()
        for provider in self.providers.values():
            values.extend(provider.upstream_secrets())
        values.extend(self.key_secrets)
        return values


def single_provider_config(settings: Settings) -> ProxyConfig:
    """The environment's one provider, named after its profile (PROVIDER or the URL's)."""
    name = settings.provider_name
    models = ModelTable().with_provider(name, name, {"context_window": settings.context_window},
                                        {}, "CONTEXT_WINDOW")
    config = ProxyConfig(settings, {name: settings}, models=models)
    judge_route(config)  # a SAFEGUARDS_ROUTE naming no provider stops the start here
    return config


def load_config_file(path: Path, settings: Settings,
                     environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """The providers and routes of a TOML file (ConfigurationError naming what is wrong)."""
    environ = os.environ if environ is None else environ
    if not path.is_file():
        raise ConfigurationError(f"config file not found: {path}")
    try:
        data = TomlConfigSettingsSource(ConfigFile, toml_file=path).toml_data
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path}: not valid TOML: {exc}") from None
    try:
        shape = ConfigFile(**data)
    except ValidationError as exc:
        raise ConfigurationError(_validation_message(path, "", exc)) from None
    if not shape.providers:
        raise ConfigurationError(f"{path}: no [providers.NAME] table")
    providers: dict[str, ProviderSettings] = {}
    models = ModelTable()
    for name, table in shape.providers.items():
        facts, per_model = _model_tables(path, name, table)
        providers[name] = _provider(path, name, table, environ)
        models = models.with_provider(name, providers[name].provider_name, facts, per_model,
                                      f"[providers.{name}]")
    try:
        keys, key_secrets = parse_keys(shape.keys or {}, environ)
    except KeyTableError as exc:
        raise ConfigurationError(f"{path}: {exc}") from None
    config = ProxyConfig(settings, providers, shape.router,
                         {"web_search": shape.web_search} if shape.web_search else {},
                         source=str(path), models=models, keys=keys,
                         key_secrets=tuple(key_secrets))
    _check_routes(path, config)
    _check_keys(path, config)
    judge_route(config)
    return config


def _check_keys(path: Path, config: ProxyConfig) -> None:
    """Every key names configured providers and routes. (That a key with a budget reaches only
    priced models needs the router: `routing/reach.check_budgets`, run after loading.)"""
    routes = (*ROUTE_NAMES, "fallback", "explicit")
    for spec in config.keys.values():
        where = f"[keys.{spec.name}]"
        for name in spec.providers or ():
            if name not in config.providers:
                raise ConfigurationError(f"{path}: {where} providers: unknown provider "
                                         f"{name!r} (configured: {', '.join(config.providers)})")
        for name in spec.routes or ():
            if name not in routes:
                raise ConfigurationError(f"{path}: {where} routes: unknown route {name!r} "
                                         f"(one of {', '.join(routes)})")


def _model_tables(path: Path, name: str, table: dict[str, Any],
                  ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Takes the per-model keys (FACT_KEYS) and `models` sub-tables out of a provider table."""
    where = f"[providers.{name}]"
    facts = {key: table.pop(key) for key in FACT_KEYS if key in table}
    models = table.pop("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise ConfigurationError(
            f'{path}: {where} models: expected [providers.{name}.models."MODEL"] tables')
    for model, values in [("", facts), *models.items()]:
        label = f'{where[:-1]}.models."{model}"]' if model else where
        unknown = sorted(set(values) - set(FACT_KEYS))
        if unknown:
            raise ConfigurationError(f"{path}: {label} {unknown[0]}: not a model setting "
                                     f"(one of {', '.join(FACT_KEYS)})")
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{path}: {label} {key}: expected a number >= 0")
    return facts, models


def _provider(path: Path, name: str, table: dict[str, Any],
              environ: Mapping[str, str]) -> ProviderSettings:
    where = f"[providers.{name}]"
    if "," in name or "/" in name:
        raise ConfigurationError(f"{path}: {where}: a provider name may not contain ',' or '/'")
    values: dict[str, Any] = {}
    env_file = table.get("env_file")
    if env_file is not None:
        values.update(_env_file_values(path, where, Path(str(env_file))))
    values.update({key.lower(): value for key, value in table.items() if key != "env_file"})
    if "api" in values:  # `api = "messages"`: the provider's upstream API
        values["upstream_api"] = values.pop("api")
    values.setdefault("max_retries", FILE_PROVIDER_RETRIES)
    values = {key: resolve_secret(path, where, key, value, environ)
              for key, value in values.items()}
    values["tool_groups_disabled"] = _pop_prefixed(values, TOOL_GROUPS_DISABLED)
    values["tool_group_patterns"] = _pop_prefixed(values, TOOL_GROUP)
    try:
        provider = ProviderSettings(**values)
    except ValidationError as exc:
        raise ConfigurationError(_validation_message(path, where + " ", exc)) from None
    if (not provider.openai_api_key.get_secret_value()
            and provider.provider_name not in KEYLESS_PROFILES):
        raise ConfigurationError(f"{path}: {where} openai_api_key: not set, and profile "
                                 f"{provider.provider_name!r} needs a key")
    return provider


def _env_file_values(path: Path, where: str, env_file: Path) -> dict[str, Any]:
    """A provider env file's settings for this provider (process-wide variables in it, such
    as PORT or ANTHROPIC_API_KEY, are not a provider's and are left out)."""
    if not env_file.is_absolute():
        env_file = path.parent / env_file
    if not env_file.is_file():
        raise ConfigurationError(f"{path}: {where} env_file: {env_file} not found")
    fields = set(ProviderSettings.model_fields)
    values: dict[str, Any] = {}
    for key, value in dotenv_values(env_file).items():
        name = key.lower()
        if value is not None and (name in fields or key.upper().startswith(
                (TOOL_GROUPS_DISABLED, TOOL_GROUP))):
            values[name] = value
    return values


def resolve_secret(path: Path, where: str, key: str, value: Any,
                    environ: Mapping[str, str]) -> Any:
    """`"env:NAME"` → the value of the environment variable NAME, which must be set."""
    if not isinstance(value, str) or not value.startswith(SECRET_FROM_ENV):
        return value
    variable = value[len(SECRET_FROM_ENV):]
    resolved = environ.get(variable)
    if not resolved:
        raise ConfigurationError(f"{path}: {where} {key}: environment variable {variable} "
                                 f"is not set")
    return resolved


def _pop_prefixed(values: dict[str, Any], prefix: str) -> dict[str, tuple[str, ...]]:
    keys = [key for key in values if key.upper().startswith(prefix)]
    found = {key.upper(): str(values.pop(key)) for key in keys}
    return scan_prefixed(found, prefix)


def _check_routes(path: Path, config: ProxyConfig) -> None:
    """Every route names a configured provider."""
    router = config.router
    if router is None:
        return
    entries = [(f"[router] {name}", entry) for name in ROUTE_NAMES
               for entry in router.route(name)]
    entries += [("[router] fallback", entry) for entry in router.fallback]
    entries += [("[router] safeguards", entry) for entry in router.safeguards or ()]
    for where, entry in entries:
        provider, separator, model = entry.partition(",")
        if not separator or not model.strip():
            raise ConfigurationError(f"{path}: {where}: {entry!r} is not \"PROVIDER,MODEL\"")
        if provider.strip() not in config.providers:
            raise ConfigurationError(
                f"{path}: {where}: unknown provider {provider.strip()!r} (configured: "
                f"{', '.join(config.providers)})")


def judge_route(config: ProxyConfig) -> list[str]:
    """The safeguards judge's `PROVIDER,MODEL` entries: `[router] safeguards`, else
    SAFEGUARDS_ROUTE; empty when neither is set. An entry naming no configured provider stops
    the start (a judge that can never answer would only ever say `unavailable`)."""
    if config.router is not None and config.router.safeguards:
        return config.router.safeguards
    value = config.settings.safeguards_route
    if not value:
        return []
    provider, separator, model = value.partition(",")
    if not separator or not model.strip() or provider.strip() not in config.providers:
        raise ConfigurationError(f"SAFEGUARDS_ROUTE: {value!r} is not \"PROVIDER,MODEL\" with a "
                                 f"configured provider ({', '.join(config.providers)})")
    return [value]


def _validation_message(path: Path, where: str, exc: ValidationError) -> str:
    lines = [f"{path}: {where}{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
             for err in exc.errors(include_url=False)]
    return "\n".join(lines)


def stray_provider_variables(environ: Mapping[str, str]) -> list[str]:
    """Provider variables set in the environment beside a config file (they are not used)."""
    names = {name.upper() for name in ProviderSettings.model_fields}
    return sorted(key for key in environ if key.upper() in names
                  or key.upper().startswith((TOOL_GROUPS_DISABLED, TOOL_GROUP)))
