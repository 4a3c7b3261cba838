"""Where a request goes: an ordered list of (provider, model, route) candidates.

Pure: the request body and two numbers in, candidates out; no I/O and no state. The service
walks the list (failover) and asks each provider's health whether to skip it. The rules, first
match wins:

1. an explicit `PROVIDER,MODEL` (or `PROVIDER/MODEL` when PROVIDER is a configured name);
2. `image`: an image or document in the last user turn;
3. `long_context`: the estimated input (or the session's previous turn) over the threshold,
   or Claude Code's compaction request (request class `compaction`);
4. `web_search`: a `web_search_*` server tool;
5. `think`: adaptive thinking at effort xhigh/max, or `ultrathink` in the last user text;
6. `subagent`: a request of one of Claude Code's subagents (`x-claude-code-agent-id`, or
   request class `subagent`);
7. `background`: a model name containing `haiku`, or request class `auxiliary` (titles,
   summaries: Claude Code's own small calls);
8. `default`; with no `[router]` table, opus/sonnet/haiku → BIG/MIDDLE/SMALL of the first
   provider, other names unchanged.

The request class is Claude Code's `x-claude-code-request-class` gateway hint (sent with
CLAUDE_CODE_GATEWAY_HINT_HEADERS=1, which the launcher sets): exact where the model name
and the agent id are guesses.

A model id `route:NAME` (what `claude-proxy claude` gives Claude Code) asks for the route NAME
by name: the rules above still apply first, so a long or illustrated request still goes where
such requests go. Without a `[router]` table, `route:big`, `route:middle` and `route:small`
name the first provider's BIG/MIDDLE/SMALL_MODEL.

Every route then fails over through its own list and the `fallback` list.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from claude_proxy.config.file import ROUTE_NAMES, RouterSettings
from claude_proxy.config.settings import TIERS, ProviderSettings
from claude_proxy.conversion.request_converter import map_model
from claude_proxy.errors import ProxyError

_CONTEXT_SUFFIX = re.compile(r"\[1m\]$", re.IGNORECASE)
_THINK_EFFORTS = frozenset({"xhigh", "max"})
_MEDIA_BLOCKS = frozenset({"image", "document"})
ROUTE_ID_PREFIX = "route:"
"""Model ids that name a route rather than a model (`route:default`, `route:background`)."""


@dataclass(frozen=True)
class Candidate:
    provider: str
    model: str
    route: str


def client_model_name(model: str) -> str:
    """The requested model without Claude Code's `[1m]` context marker."""
    return _CONTEXT_SUFFIX.sub("", model.strip())


def route_id(name: str) -> str:
    """The model id that asks for the route (or, without a `[router]`, the tier) `name`."""
    return ROUTE_ID_PREFIX + name


def asked_route(model: str) -> str | None:
    """The route a `route:NAME` model id asks for, else None."""
    if model[:len(ROUTE_ID_PREFIX)].lower() != ROUTE_ID_PREFIX:
        return None
    return model[len(ROUTE_ID_PREFIX):].strip().lower()


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
                   previous_tokens: int | None = None,
                   subagent: bool = False, request_class: str = "-") -> list[Candidate]:
        """The candidates in the order to try them, without repeats. `subagent`: the request
        came from one of Claude Code's subagents; `request_class`: Claude Code's hint (`-`
        without one)."""
        model = client_model_name(str(body["model"]))
        chosen = self.explicit(model)
        if chosen is not None:
            found = [Candidate(chosen[0], chosen[1], "explicit")]
        else:
            asked = asked_route(model)
            if asked is not None:
                self.check_route_id(asked)
            found = self._by_rules(body, model, estimated_tokens, previous_tokens,
                                   subagent or request_class == "subagent", asked,
                                   request_class)
        return _unique(found + self.fallbacks())

    def route_ids(self) -> list[str]:
        """The `route:NAME` ids worth offering: `route:default` and each other configured
        route, or without a `[router]` table the three model tiers."""
        if self.settings is None:
            return [route_id(tier) for tier in TIERS]
        return [route_id("default"), *(route_id(name) for name in self.route_names()
                                       if name != "default")]

    @staticmethod
    def check_route_id(asked: str) -> None:
        """A `route:NAME` that names no route or tier is the client's mistake (400), never a
        model name sent upstream."""
        if asked not in (*ROUTE_NAMES, *TIERS):
            raise ProxyError(400, f"model {route_id(asked)!r} names no route of this proxy; "
                                  f"routes: {', '.join(ROUTE_NAMES)}; tiers: "
                                  f"{', '.join(TIERS)}")

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
                  previous_tokens: int | None, subagent: bool = False,
                  asked: str | None = None, request_class: str = "-") -> list[Candidate]:
        settings = self.settings
        if settings is None:
            return [self._first_provider(model, asked)]
        threshold = settings.long_context_threshold
        checks: tuple[tuple[str, Callable[[], bool]], ...] = (
            ("image", lambda: has_media_in_last_user_turn(body)),
            ("long_context", lambda: request_class == "compaction"
             or max(estimated_tokens, previous_tokens or 0) > threshold),
            ("web_search", lambda: has_web_search_tool(body)),
            ("think", lambda: wants_hard_thinking(body)),
            ("subagent", lambda: subagent),
            ("background", lambda: request_class == "auxiliary" or "haiku" in model.lower()),
        )
        for name, applies in checks:
            route = self.route(name)
            if route and (applies() or asked == name):
                return route
        default = self.route("default")
        if default:
            return default
        return [self._first_provider(model, asked)]

    def _first_provider(self, model: str, asked: str | None) -> Candidate:
        """The opus/sonnet/haiku (or route id) mapping onto the first provider's tiers."""
        first = self.providers[self.first]
        if asked is None:
            return Candidate(self.first, map_model(model, first), "default")
        tier = next((t for t in TIERS if t == asked), "small" if asked == "background" else "big")
        return Candidate(self.first, first.model_for_tier(tier), "default")

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
