"""Search backends (SearXNG's JSON API, Brave, Tavily, Exa) behind one pooled httpx client.

Each backend is a pair of pure functions (query → HTTP request, JSON body → hits) so the wire
shapes can be read and tested apart from the network. Failures become the Anthropic
`web_search_tool_result_error` codes: 429 → `too_many_requests`, everything else that keeps
a search from answering (timeout, connection, 5xx, SearXNG's 403 when JSON is off, a body that
is not the expected JSON) → `unavailable`. Domain filters go to the backend where it has them
(and as `site:` terms where it does not), and are always applied to the hits by host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from claude_proxy.config.settings import SearchSettings

logger = logging.getLogger("claude_proxy.websearch")

DEFAULT_BASES = {
    "brave": "https://api.search.brave.com/res/v1",
    "tavily": "https://api.tavily.com",
    "exa": "https://api.exa.ai",
}
KEYED_BACKENDS = frozenset(DEFAULT_BASES)
MAX_QUERY_CHARS = 400
SNIPPET_CHARS = 2000


@dataclass(frozen=True)
class Hit:
    """One search result: what the client sees (url, title, page_age) and what the model
    reads (snippet)."""

    url: str
    title: str
    snippet: str = ""
    page_age: str | None = None


@dataclass(frozen=True)
class Query:
    text: str
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    max_results: int = 8


class SearchFailed(Exception):
    """A search that did not answer, with the Anthropic error code the client gets."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class HttpRequest:
    method: str
    url: str
    params: dict[str, str] = field(default_factory=dict)
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- domains


def bare_domain(entry: str) -> str:
    """`https://www.example.com/path` or `example.com` → `www.example.com` / `example.com`."""
    text = entry.strip().lower()
    host = urlsplit(text if "//" in text else f"//{text}").hostname or ""
    return host.rstrip(".")


def host_matches(url: str, domains: tuple[str, ...]) -> bool:
    """Whether the URL's host is one of `domains` or a subdomain of one."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    return any(host == domain or host.endswith("." + domain)
               for domain in map(bare_domain, domains) if domain)


def filter_hits(hits: list[Hit], query: Query) -> list[Hit]:
    """The hits the domain lists allow, at most `max_results`, each URL once."""
    kept: list[Hit] = []
    seen: set[str] = set()
    for hit in hits:
        if not hit.url or hit.url in seen:
            continue
        if query.allowed_domains and not host_matches(hit.url, query.allowed_domains):
            continue
        if query.blocked_domains and host_matches(hit.url, query.blocked_domains):
            continue
        seen.add(hit.url)
        kept.append(hit)
    return kept[:query.max_results]


def site_terms(query: Query) -> str:
    """The query with `site:` terms, for backends without domain parameters."""
    terms = [query.text]
    allowed = [bare_domain(d) for d in query.allowed_domains if bare_domain(d)]
    if allowed:
        terms.append(" OR ".join(f"site:{domain}" for domain in allowed))
    terms.extend(f"-site:{bare_domain(d)}" for d in query.blocked_domains if bare_domain(d))
    return " ".join(terms)


# ---------------------------------------------------------------- wire shapes


def _text(value: Any, limit: int = SNIPPET_CHARS) -> str:
    return value.strip()[:limit] if isinstance(value, str) else ""


def _items(data: Any, *path: str) -> list[dict[str, Any]]:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []


def searxng_request(base: str, key: str, query: Query) -> HttpRequest:
    headers = {"accept": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return HttpRequest("GET", f"{base}/search",
                       params={"q": site_terms(query), "format": "json"}, headers=headers)


def searxng_hits(data: Any) -> list[Hit]:
    return [Hit(_text(item.get("url")), _text(item.get("title")), _text(item.get("content")),
                _text(item.get("publishedDate") or item.get("pubdate")) or None)
            for item in _items(data, "results")]


def brave_request(base: str, key: str, query: Query) -> HttpRequest:
    return HttpRequest("GET", f"{base}/web/search",
                       params={"q": site_terms(query), "count": str(query.max_results)},
                       headers={"accept": "application/json", "x-subscription-token": key})


def brave_hits(data: Any) -> list[Hit]:
    hits = []
    for item in _items(data, "web", "results"):
        extra = item.get("extra_snippets")
        snippet = " ".join([_text(item.get("description")),
                            *(_text(s) for s in extra if isinstance(s, str))]
                           if isinstance(extra, list) else [_text(item.get("description"))])
        hits.append(Hit(_text(item.get("url")), _text(item.get("title")),
                        snippet.strip()[:SNIPPET_CHARS],
                        _text(item.get("page_age") or item.get("age")) or None))
    return hits


def tavily_request(base: str, key: str, query: Query) -> HttpRequest:
    body: dict[str, Any] = {"query": query.text, "max_results": query.max_results,
                            "search_depth": "basic"}
    if query.allowed_domains:
        body["include_domains"] = list(query.allowed_domains)
    if query.blocked_domains:
        body["exclude_domains"] = list(query.blocked_domains)
    return HttpRequest("POST", f"{base}/search", json=body,
                       headers={"authorization": f"Bearer {key}"})


def tavily_hits(data: Any) -> list[Hit]:
    return [Hit(_text(item.get("url")), _text(item.get("title")), _text(item.get("content")),
                _text(item.get("published_date")) or None)
            for item in _items(data, "results")]


def exa_request(base: str, key: str, query: Query) -> HttpRequest:
    body: dict[str, Any] = {"query": query.text, "numResults": query.max_results,
                            "contents": {"text": {"maxCharacters": SNIPPET_CHARS}}}
    if query.allowed_domains:
        body["includeDomains"] = list(query.allowed_domains)
    if query.blocked_domains:
        body["excludeDomains"] = list(query.blocked_domains)
    return HttpRequest("POST", f"{base}/search", json=body, headers={"x-api-key": key})


def exa_hits(data: Any) -> list[Hit]:
    hits = []
    for item in _items(data, "results"):
        highlights = item.get("highlights")
        snippet = (" ".join(h for h in highlights if isinstance(h, str))
                   if isinstance(highlights, list) and highlights else
                   _text(item.get("summary")) or _text(item.get("text")))
        hits.append(Hit(_text(item.get("url")), _text(item.get("title")),
                        snippet[:SNIPPET_CHARS], _text(item.get("publishedDate")) or None))
    return hits


Shape = tuple[Callable[[str, str, Query], HttpRequest], Callable[[Any], list[Hit]]]
SHAPES: dict[str, Shape] = {
    "searxng": (searxng_request, searxng_hits),
    "brave": (brave_request, brave_hits),
    "tavily": (tavily_request, tavily_hits),
    "exa": (exa_request, exa_hits),
}


# ---------------------------------------------------------------- the client


def _status_failure(name: str, status: int) -> SearchFailed:
    if status == 429:
        return SearchFailed("too_many_requests", f"{name} answered 429 (rate limited)")
    if name == "searxng" and status == 403:
        return SearchFailed("unavailable", "searxng answered 403: JSON output is probably off "
                            "(add `json` to search.formats in its settings.yml)")
    return SearchFailed("unavailable", f"{name} answered HTTP {status}")


class SearchBackend:
    """The configured backend: one pooled client, one `search` per query."""

    def __init__(self, settings: SearchSettings,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        name = settings.web_search_backend
        if name is None:
            raise ValueError("no WEB_SEARCH_BACKEND configured")
        self.name: str = name
        self.max_results = settings.web_search_max_results
        self._base = (settings.web_search_url or DEFAULT_BASES.get(name, "")).rstrip("/")
        key = settings.web_search_api_key
        self._key = key.get_secret_value() if key is not None else ""
        self._build, self._parse = SHAPES[name]
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(settings.web_search_timeout),
                                         transport=transport, follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def search(self, query: Query) -> list[Hit]:
        """The filtered hits (possibly none), or SearchFailed."""
        wire = self._build(self._base, self._key, query)
        try:
            response = await self._client.request(
                wire.method, wire.url, params=wire.params or None,
                content=orjson.dumps(wire.json) if wire.json is not None else None,
                headers={**wire.headers,
                         **({"content-type": "application/json"} if wire.json else {})})
        except httpx.TimeoutException:
            raise SearchFailed("unavailable", f"{self.name} timed out") from None
        except httpx.HTTPError as exc:
            raise SearchFailed("unavailable",
                               f"{self.name} connection failed ({type(exc).__name__})") from None
        if response.status_code >= 400:
            raise _status_failure(self.name, response.status_code)
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise SearchFailed("unavailable", f"{self.name} answered with a body that is not "
                               "JSON") from None
        return filter_hits(self._parse(data), query)
