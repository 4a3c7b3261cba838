"""Where a request goes: an ordered list of (provider, model, route) candidates.

Pure: the request body and two numbers in, candidates out; no I/O and no state. The service
walks the list (failover) and asks each provider's health whether to skip it. The rules, first
match wins:

1. an explicit `PROVIDER,MODEL` (or `PROVIDER/MODEL` when PROVIDER is a configured name);
2. `image`: an image or document in the last user turn;
3. `long_context`: the estimated input (or the session's previous turn) over the threshold;
4. `web_search`: a `web_search_*` server tool;
5. `think`: adaptive thinking at effort xhigh/max, or `ultrathink` in the last user text;
6. `background`: a model name containing `haiku`;
7. `default`; with no `[router]` table, opus/sonnet/haiku → BIG/MIDDLE/SMALL of the first
   provider, other names unchanged.

Every route then fails over through its own list and the `fallback` list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from claude_proxy.config import ProviderSettings
from claude_proxy.conversion.request_converter import map_model
from claude_proxy.errors import ProxyError
from claude_proxy.routing.config import ROUTE_NAMES, RouterSettings

_CONTEXT_SUFFIX = re.compile(r"\[1m\]$", re.IGNORECASE)
_THINK_EFFORTS = frozenset({"xhigh", "max"})
_MEDIA_BLOCKS = frozenset({"image", "document"})


@dataclass(frozen=True)
class Candidate:
    provider: str
    model: str
    route: str


def client_model_name(model: str) -> str:
    """The requested model without Claude Code's `[1m]` context marker."""
    return _CONTEXT_SUFFIX.sub("", model.strip())


class Router:
    def __init__(self, providers: Mapping[str, ProviderSettings],
                 router: RouterSettings | None) -> None:
        self.providers = providers
        self.settings = router
        self.first = next(iter(providers))

    def explicit(self, model: str) -> tuple[str, str] | None:
        """`PROVIDER,MODEL` (split at the first comma, model kept verbatim), or
        `PROVIDER/MODEL` when PROVIDER is exactly a configured name; a comma naming an
        unknown provider is the client's mistake, never a silent default."""
        provider, comma, rest = model.partition(",")
        if comma:
            provider = provider.strip()
            if provider not in self.providers:
                raise ProxyError(400, f"model {model!r} names provider {provider!r}, which is "
                                      f"not configured; configured providers: "
                                      f"{', '.join(self.providers)}")
            return provider, rest.strip()
        provider, slash, rest = model.partition("/")
        if slash and provider in self.providers and rest:
            return provider, rest
        return None

    def candidates(self, body: dict[str, Any], estimated_tokens: int,
                   previous_tokens: int | None = None) -> list[Candidate]:
        """The candidates in the order to try them, without repeats."""
        model = client_model_name(str(body["model"]))
        chosen = self.explicit(model)
        if chosen is not None:
            found = [Candidate(chosen[0], chosen[1], "explicit")]
        else:
            found = self._by_rules(body, model, estimated_tokens, previous_tokens)
        return _unique(found + self.fallbacks())

    def route(self, name: str) -> list[Candidate]:
        """A named route's candidates (empty when the route is not configured)."""
        if self.settings is None:
            return []
        return self._parse(name, self.settings.route(name))

    def fallbacks(self) -> list[Candidate]:
        if self.settings is None:
            return []
        return self._parse("fallback", self.settings.fallback)

    def route_names(self) -> list[str]:
        """The configured routes, in rule order."""
        return [name for name in ROUTE_NAMES if self.route(name)]

    def _by_rules(self, body: dict[str, Any], model: str, estimated_tokens: int,
                  previous_tokens: int | None) -> list[Candidate]:
        settings = self.settings
        if settings is None:
            return [Candidate(self.first, map_model(model, self.providers[self.first]),
                              "default")]
        threshold = settings.long_context_threshold
        checks: tuple[tuple[str, Callable[[], bool]], ...] = (
            ("image", lambda: has_media_in_last_user_turn(body)),
            ("long_context", lambda: max(estimated_tokens, previous_tokens or 0) > threshold),
            ("web_search", lambda: has_web_search_tool(body)),
            ("think", lambda: wants_hard_thinking(body)),
            ("background", lambda: "haiku" in model.lower()),
        )
        for name, applies in checks:
            route = self.route(name)
            if route and applies():
                return route
        default = self.route("default")
        if default:
            return default
        first = self.providers[self.first]
        return [Candidate(self.first, map_model(model, first), "default")]

    def _parse(self, name: str, entries: list[str]) -> list[Candidate]:
        parsed = []
        for entry in entries:
            provider, _, model = entry.partition(",")
            parsed.append(Candidate(provider.strip(), model.strip(), name))
        return parsed


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    seen: set[tuple[str, str]] = set()
    unique = []
    for candidate in candidates:
        key = (candidate.provider, candidate.model)
        if key not in seen:
            seen.add(key)
            unique.append(candidate)
    return unique


# ---------------------------------------------------------------- what a request asks for


def last_user_content(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of the last user message (a string becomes one text block)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return [{"type": "text", "text": content}]
            return [block for block in content or [] if isinstance(block, dict)]
    return []


def has_media_in_last_user_turn(body: dict[str, Any]) -> bool:
    """An image or document in the last user turn, tool results included: a screenshot
    pasted now, not one from earlier in the session."""
    for block in last_user_content(body):
        if block.get("type") in _MEDIA_BLOCKS:
            return True
        inner = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(inner, list) and any(isinstance(item, dict) and item.get("type")
                                           in _MEDIA_BLOCKS for item in inner):
            return True
    return False


def has_web_search_tool(body: dict[str, Any]) -> bool:
    return any(isinstance(tool, dict) and str(tool.get("type", "")).startswith("web_search_")
               for tool in body.get("tools") or [])


def wants_hard_thinking(body: dict[str, Any]) -> bool:
    """Adaptive thinking at effort xhigh or max, or `ultrathink` in the last user text. Not
    Claude Code's everyday adaptive + high (or a 31999 budget): that would route every
    request to `think`."""
    thinking = body.get("thinking")
    output_config = body.get("output_config")
    if (isinstance(thinking, dict) and thinking.get("type") == "adaptive"
            and isinstance(output_config, dict)
            and output_config.get("effort") in _THINK_EFFORTS):
        return True
    return any(block.get("type") == "text" and "ultrathink" in str(block.get("text", "")).lower()
               for block in last_user_content(body))
