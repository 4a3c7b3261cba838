"""What is known of one upstream model: its context window, its output limit, its prices.

One lookup answers "what do we know about this model, and from where" for the pre-flight
check, the Claude Code launcher, spend accounting, `doctor` and `/health?detail=1` alike.

Where a figure comes from, the first that has it wins:
1. `[providers.NAME.models."MODEL"]` in the config file;
2. the same key in `[providers.NAME]` (every model of that provider), or `CONTEXT_WINDOW`
   for the single provider of the environment;
3. what the upstream said at start (vLLM `max_model_len`, OpenRouter `context_length`, …);
4. the built-in figures of the bundled profiles (`BUILT_IN`, each with its source and date).
Unknown stays `None`: no pre-flight for that model, no price (a budget refuses to start).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

FACT_KEYS = ("context_window", "max_output_tokens", "price_input", "price_output",
             "price_cache_read", "price_cache_write")
"""Keys of a per-model table; prices are USD per million tokens."""
PRICE_KEYS = FACT_KEYS[2:]


@dataclass(frozen=True)
class ModelFacts:
    context_window: int | None = None
    max_output_tokens: int | None = None
    price_input: float | None = None
    price_output: float | None = None
    price_cache_read: float | None = None
    price_cache_write: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    """For each known figure, where it came from (shown by doctor and /health?detail=1)."""

    @property
    def priced(self) -> bool:
        """Input and output have a price (cache prices default to the input price)."""
        return self.price_input is not None and self.price_output is not None

    def prices(self) -> tuple[float, float, float, float] | None:
        """(input, output, cache read, cache write) in USD per million tokens, the cache
        prices defaulting to the input price; None without input and output prices."""
        if self.price_input is None or self.price_output is None:
            return None
        return (self.price_input, self.price_output,
                self.price_input if self.price_cache_read is None else self.price_cache_read,
                self.price_input if self.price_cache_write is None else self.price_cache_write)

    def known(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FACT_KEYS
                if getattr(self, name) is not None}


BuiltIn = Mapping[tuple[str, str], Mapping[str, Any]]
"""(profile name, model id) → figures; each entry's source and date in a comment beside it."""


def _built_in() -> dict[tuple[str, str], dict[str, Any]]:
    """The bundled profiles' figures: windows and output limits (config/windows.py) and
    prices (config/prices.py), kept apart because they change for different reasons."""
    from claude_proxy.config.prices import BUILT_IN_PRICES
    from claude_proxy.config.windows import BUILT_IN_WINDOWS

    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for table in (BUILT_IN_WINDOWS, BUILT_IN_PRICES):
        for key, values in table.items():
            merged.setdefault(key, {}).update(values)
    return merged


def facts_from(values: Mapping[str, Any], source: str) -> ModelFacts:
    """A table's fact keys as ModelFacts, each one attributed to `source`."""
    known = {key: values[key] for key in FACT_KEYS if values.get(key) is not None}
    return ModelFacts(**known, sources={key: source for key in known})


_FIGURES = tuple(item.name for item in fields(ModelFacts) if item.name != "sources")


def layered(*layers: ModelFacts) -> ModelFacts:
    """The first layer that knows a figure wins it (with its source)."""
    result: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for name in _FIGURES:
            if name in result:
                continue
            value = getattr(layer, name)
            if value is not None:
                result[name] = value
                sources[name] = layer.sources.get(name, "")
    return ModelFacts(**result, sources=sources)


@dataclass
class ModelTable:
    """The per-model facts of every configured provider (built once at start; `discovered`
    is filled by this process's start-up probes)."""

    provider_level: dict[str, ModelFacts] = field(default_factory=dict)
    """provider name → facts for all its models."""
    per_model: dict[str, dict[str, ModelFacts]] = field(default_factory=dict)
    """provider name → model id → facts."""
    profiles: dict[str, str] = field(default_factory=dict)
    """provider name → its profile name (for the built-in figures)."""
    discovered: dict[tuple[str, str], ModelFacts] = field(default_factory=dict)
    built_in: BuiltIn = field(default_factory=_built_in)
    _known: dict[tuple[str, str], ModelFacts] = field(default_factory=dict, init=False,
                                                      repr=False, compare=False)
    """facts() answers, kept: every request asks for its candidates' facts, and they change
    only when discover() learns something (a new table from with_provider starts empty)."""

    def facts(self, provider: str, model: str) -> ModelFacts:
        """Everything known of `model` served by `provider`, with where each figure came from."""
        known = self._known.get((provider, model))
        if known is None:
            known = self._known[(provider, model)] = self._layered_facts(provider, model)
        return known

    def _layered_facts(self, provider: str, model: str) -> ModelFacts:
        profile = self.profiles.get(provider, "")
        built = self.built_in.get((profile, model))
        return layered(
            self.per_model.get(provider, {}).get(model, ModelFacts()),
            self.provider_level.get(provider, ModelFacts()),
            self.discovered.get((provider, model), ModelFacts()),
            facts_from(built, f"built-in ({profile} profile)") if built else ModelFacts(),
        )

    def discover(self, provider: str, model: str, facts: ModelFacts) -> None:
        """Figures the upstream told this process at start."""
        known = self.discovered.get((provider, model))
        self.discovered[(provider, model)] = layered(known, facts) if known else facts
        self._known.clear()

    def with_provider(self, provider: str, profile: str, table: Mapping[str, Any],
                      models: Mapping[str, Mapping[str, Any]], where: str) -> ModelTable:
        """This table plus one provider's `[providers.NAME]` keys and models sub-tables."""
        provider_level = dict(self.provider_level)
        provider_level[provider] = facts_from(table, where)
        per_model = dict(self.per_model)
        per_model[provider] = {model: facts_from(values, f'{where[:-1]}.models."{model}"]')
                               for model, values in models.items()}
        return replace(self, provider_level=provider_level, per_model=per_model,
                       profiles={**self.profiles, provider: profile})
