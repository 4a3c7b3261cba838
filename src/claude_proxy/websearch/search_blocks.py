"""The Anthropic web-search blocks (pure functions). A reply is built as a list of whole
content blocks, streamed by `conversion/whole_blocks.py`.

`encrypted_content` is the proxy's own token: base64url (the alphabet Claude Code expects) of
the URL and the snippet, signed with the thinking-signature secret. When a client sends the
blocks back in a later turn, the snippets go to the upstream as text; a foreign token (a real
Anthropic blob) gives only the URL and title, so nothing opaque ever goes upstream.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from claude_proxy.conversion.census import holds
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.conversion.whole_blocks import Block, new_server_tool_id, text_block
from claude_proxy.websearch.backends import Hit


@dataclass
class Search:
    """One search the proxy ran (or refused): its hits, or an Anthropic error code."""

    query: str
    hits: list[Hit] = field(default_factory=list)
    error: str | None = None
    id: str = field(default_factory=new_server_tool_id)
    source: str = "-"
    """The backend name or `native:<provider>` (for the log and the metric)."""


# ---------------------------------------------------------------- tokens


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _signed_text(url: str, snippet: str) -> str:
    return f"web_search\n{url}\n{snippet}"


def encode_token(hit: Hit, signer: ThinkingSigner) -> str:
    payload = {"v": 1, "u": hit.url, "s": hit.snippet,
               "g": signer.sign(_signed_text(hit.url, hit.snippet))}
    return _b64(orjson.dumps(payload))


def decode_token(token: Any, url: Any, signer: ThinkingSigner) -> str | None:
    """The snippet inside one of our tokens for this URL; None for anything else."""
    if not isinstance(token, str) or not token or not isinstance(url, str):
        return None
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("v") != 1 or payload.get("u") != url:
        return None
    snippet, signature = payload.get("s"), payload.get("g")
    if not isinstance(snippet, str) or not isinstance(signature, str):
        return None
    return snippet if signer.verify(_signed_text(url, snippet), signature) is not None else None


# ---------------------------------------------------------------- whole blocks


def result_content(search: Search, signer: ThinkingSigner) -> list[dict[str, Any]] | dict[str, Any]:
    if search.error is not None:
        return {"type": "web_search_tool_result_error", "error_code": search.error}
    return [{"type": "web_search_result", "url": hit.url, "title": hit.title,
             "encrypted_content": encode_token(hit, signer), "page_age": hit.page_age}
            for hit in search.hits]


def search_blocks(search: Search, signer: ThinkingSigner) -> list[Block]:
    """The `server_tool_use` / `web_search_tool_result` pair of one search."""
    return [
        {"type": "server_tool_use", "id": search.id, "name": "web_search",
         "input": {"query": search.query}},
        {"type": "web_search_tool_result", "tool_use_id": search.id,
         "content": result_content(search, signer)},
    ]


# ---------------------------------------------------------------- what the model reads


def numbered_results(search: Search) -> str:
    """The tool result the upstream model gets for its `web_search` call."""
    if search.error is not None:
        return f"Web search error: {search.error}"
    if not search.hits:
        return f'The web search for "{search.query}" found no results.'
    lines = [f'Web search results for "{search.query}" (untrusted web content):']
    for number, hit in enumerate(search.hits, 1):
        lines.append(f"[{number}] {hit.title}\nURL: {hit.url}")
        if hit.snippet:
            lines.append(hit.snippet)
        lines.append("")
    lines.append("Answer with a brief summary of these results, citing them as markdown links "
                 "[title](url).")
    return "\n".join(lines)


def digest(searches: Iterable[Search]) -> str:
    """The plain text when no model could write the summary: one line per hit."""
    lines: list[str] = []
    for search in searches:
        if search.error is not None:
            lines.append(f'Web search for "{search.query}" failed: {search.error}.')
            continue
        lines.append(f'Web search results for "{search.query}" (untrusted web content):')
        lines.extend(f"- [{hit.title or hit.url}]({hit.url})" + (f": {hit.snippet}"
                                                                 if hit.snippet else "")
                     for hit in search.hits)
        if not search.hits:
            lines.append("- no results")
    return "\n".join(lines)


# ---------------------------------------------------------------- events


def usage(input_tokens: int, output_tokens: int, searches: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "server_tool_use": {"web_search_requests": searches, "web_fetch_requests": 0}}


# ---------------------------------------------------------------- replay


def replayed_result_text(block: Block, signer: ThinkingSigner) -> str:
    """A `web_search_tool_result` from an earlier turn as text for the upstream: our own
    tokens give their snippets back, anything else only its URL and title."""
    content = block.get("content")
    if not isinstance(content, list):
        code = content.get("error_code") if isinstance(content, dict) else None
        return f"Web search error: {code or 'unavailable'}"
    if not content:
        return "Web search results: none found."
    lines = ["Web search results (untrusted web content):"]
    for number, item in enumerate((i for i in content if isinstance(i, dict)), 1):
        url, title = item.get("url", ""), item.get("title", "")
        lines.append(f"[{number}] {title}\nURL: {url}")
        snippet = decode_token(item.get("encrypted_content"), url, signer)
        if snippet:
            lines.append(snippet)
    return "\n".join(lines)


def replay_blocks(body: dict[str, Any], signer: ThinkingSigner) -> dict[str, Any]:
    """The request with earlier turns' search blocks as text blocks (the body itself when
    there are none): `server_tool_use` → the query, `web_search_tool_result` → the results."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not _any_search_block(messages):
        return body
    return {**body, "messages": [_replay_message(message, signer) for message in messages]}


def _is_search_block(block: Any) -> bool:
    """A web search's call or result; another server tool's (the advisor's) is not one."""
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    return kind == "web_search_tool_result" or (
        kind == "server_tool_use" and block.get("name", "web_search") == "web_search")


def _any_search_block(messages: list[Any]) -> bool:
    """`_has_search_block` of any message (every request of a long conversation asks, and
    most have none: `census` first)."""
    if not holds(messages, *SEARCH_TYPES):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for block in content:
                if (isinstance(block, dict) and block.get("type") in SEARCH_TYPES
                        and _is_search_block(block)):
                    return True
    return False


SEARCH_TYPES = ("server_tool_use", "web_search_tool_result")
"""A tuple: a hostile block's `type` may be a list, which a set cannot be asked about."""


def _has_search_block(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(_is_search_block(block) for block in content)


def _replay_message(message: Any, signer: ThinkingSigner) -> Any:
    if not _has_search_block(message):
        return message
    content: list[Any] = []
    for block in message["content"]:
        kind = block.get("type") if _is_search_block(block) else None
        if kind == "server_tool_use":
            query = (block.get("input") or {}).get("query", "")
            content.append(text_block(f'Searched the web for "{query}".'))
        elif kind == "web_search_tool_result":
            content.append(text_block(replayed_result_text(block, signer)))
        else:
            content.append(block)
    return {**message, "content": content}
