"""Provider-native web search (pure): the switch each upstream needs, and its sources as hits.

| provider   | switch added to the chat request               | sources in the answer          |
|------------|------------------------------------------------|--------------------------------|
| openrouter | tool `openrouter:web_search`                   | `message.annotations[]`        |
| glm        | tool `web_search` with `search_result: true`   | top-level `web_search[]`       |
| perplexity | none (Sonar searches); `search_domain_filter`  | `search_results[]`/`citations` |
| openai     | `web_search_options` (the search models)       | `message.annotations[]`        |
| /responses | tool `web_search` (OpenAI, Azure: any model    | `url_citation` annotations,    |
|            | the proxy sends to the Responses API)          | `web_search_call` sources      |

Kimi, DeepSeek, DashScope, vLLM and Ollama return no sources from their chat APIs: they, and
Azure chat models, fall back to the backend.
"""

from __future__ import annotations

from typing import Any

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.websearch.backends import SNIPPET_CHARS, Hit, Query


def native_kind(settings: ProviderSettings, api: str = "chat") -> str | None:
    """Which native search this provider has on this upstream API, if any (none on a
    Messages upstream: its searches are emulated with the backend)."""
    if api == "responses":
        return "responses"
    if api == "messages":
        return None
    if "perplexity" in settings.openai_base_url.lower():
        return "perplexity"
    name = settings.provider_name
    if name in ("openrouter", "glm"):
        return name
    if name == "openai" and not settings.is_azure:
        return "openai"
    return None


def native_switch(kind: str | None, query: Query,
                  body: dict[str, Any]) -> dict[str, Any] | None:
    """The fields to set on the converted upstream request to make it search (None: this
    provider has no native search)."""
    if kind is None:
        return None
    tools = list(body.get("tools") or [])
    if kind == "responses":
        tool: dict[str, Any] = {"type": "web_search"}
        if query.allowed_domains:
            tool["filters"] = {"allowed_domains": list(query.allowed_domains)}
        return {"tools": [*tools, tool],
                "include": [*(body.get("include") or []), "web_search_call.action.sources"]}
    if kind == "openrouter":
        parameters: dict[str, Any] = {"max_results": query.max_results}
        if query.allowed_domains:
            parameters["allowed_domains"] = list(query.allowed_domains)
        if query.blocked_domains:
            parameters["excluded_domains"] = list(query.blocked_domains)
        return {"tools": [*tools, {"type": "openrouter:web_search", "parameters": parameters}]}
    if kind == "glm":
        options: dict[str, Any] = {"enable": True, "search_engine": "search_std",
                                   "search_result": True, "count": query.max_results}
        if query.text:
            options["search_query"] = query.text
        if len(query.allowed_domains) == 1:
            options["search_domain_filter"] = query.allowed_domains[0]
        return {"tools": [*tools, {"type": "web_search", "web_search": options}]}
    if kind == "perplexity":
        domains = [*query.allowed_domains, *(f"-{d}" for d in query.blocked_domains)]
        return {"search_domain_filter": domains} if domains else {}
    return {"web_search_options": {"search_context_size": "medium"}}


def _text(value: Any) -> str:
    return value.strip()[:SNIPPET_CHARS] if isinstance(value, str) else ""


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _responses_hits(response: dict[str, Any]) -> list[Hit]:
    """A /responses answer's sources: the cited ones (with titles) first, then the other
    sources its `web_search_call` items read."""
    cited: list[Hit] = []
    read: list[Hit] = []
    for item in _dicts(response.get("output")):
        if item.get("type") == "message":
            for part in _dicts(item.get("content")):
                cited.extend(Hit(_text(a.get("url")), _text(a.get("title")))
                             for a in _dicts(part.get("annotations"))
                             if a.get("type") == "url_citation")
        elif item.get("type") == "web_search_call":
            action = item.get("action")
            sources = action.get("sources") if isinstance(action, dict) else None
            read.extend(Hit(_text(s.get("url")), _text(s.get("title")) or _text(s.get("url")))
                        for s in _dicts(sources))
    return cited + read


def native_hits(completion: dict[str, Any]) -> list[Hit]:
    """The sources of a native-search answer, in order, each URL once."""
    hits: list[Hit] = []
    choices = _dicts(completion.get("choices"))
    message = choices[0].get("message") if choices else None
    for annotation in _dicts(message.get("annotations") if isinstance(message, dict) else None):
        citation = annotation.get("url_citation")
        if annotation.get("type") == "url_citation" and isinstance(citation, dict):
            hits.append(Hit(_text(citation.get("url")), _text(citation.get("title")),
                            _text(citation.get("content"))))
    for item in _dicts(completion.get("web_search")):
        hits.append(Hit(_text(item.get("link")), _text(item.get("title")),
                        _text(item.get("content")), _text(item.get("publish_date")) or None))
    for item in _dicts(completion.get("search_results")):
        hits.append(Hit(_text(item.get("url")), _text(item.get("title")),
                        _text(item.get("snippet")), _text(item.get("date")) or None))
    if not completion.get("search_results"):
        for url in completion.get("citations") or []:
            if isinstance(url, str):
                hits.append(Hit(url.strip(), url.strip()))
    hits.extend(_responses_hits(completion))
    unique: dict[str, Hit] = {}
    for hit in hits:
        if hit.url and hit.url not in unique:
            unique[hit.url] = hit
    return list(unique.values())
