"""Which deferred tools a search finds: Python `re.search` over a tool's name, description
and argument names and descriptions (the rest of a schema is noise), case-insensitive, as
Anthropic's regex variant; or an Okapi BM25 ranking of the same words for the bm25 variant.
Results keep the tools' declared order (regex) or rank (bm25), at most `limit` of them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

MAX_PATTERN = 200
"""Anthropic's limit on a regex pattern, in characters."""
_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


class BadInput(Exception):
    """The model's search cannot run (`invalid_tool_input`); the message says why."""


def searchable_text(tool: dict[str, Any]) -> str:
    """A tool's name, description, and each argument's name and description, one per line."""
    lines = [str(tool.get("name", "")), str(tool.get("description") or "")]
    schema = tool.get("input_schema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    for name, spec in (properties or {}).items() if isinstance(properties, dict) else ():
        described = spec.get("description") if isinstance(spec, dict) else None
        lines.append(f"{name} {described}" if isinstance(described, str) else str(name))
    return "\n".join(lines)


def compile_pattern(pattern: Any) -> re.Pattern[str]:
    """The model's pattern, compiled; BadInput for one Anthropic would refuse too."""
    if not isinstance(pattern, str) or not pattern:
        raise BadInput("pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN:
        raise BadInput(f"pattern is longer than {MAX_PATTERN} characters")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as error:
        raise BadInput(f"invalid regular expression: {error}") from None


def regex_search(compiled: re.Pattern[str], tools: list[dict[str, Any]], limit: int) -> list[str]:
    """The names of the tools the pattern matches, in declared order."""
    return [str(tool["name"]) for tool in tools if compiled.search(searchable_text(tool))][:limit]


def bm25_search(query: Any, tools: list[dict[str, Any]], limit: int) -> list[str]:
    """The names of the tools that rank best for the query's words (none share a word: [])."""
    if not isinstance(query, str) or not _WORD.findall(query.lower()):
        raise BadInput("query must hold at least one word")
    documents = [_WORD.findall(searchable_text(tool).lower()) for tool in tools]
    average = sum(map(len, documents)) / len(documents) if documents else 0.0
    frequency = Counter(word for document in documents for word in set(document))
    terms = set(_WORD.findall(query.lower()))
    scored = []
    for position, (tool, words) in enumerate(zip(tools, documents, strict=True)):
        counts = Counter(words)
        score = sum(_idf(len(documents), frequency[term]) * counts[term] * (K1 + 1)
                    / (counts[term] + K1 * (1 - B + B * len(words) / (average or 1)))
                    for term in terms if counts[term])
        if score > 0:
            scored.append((-score, position, str(tool["name"])))
    return [name for _, _, name in sorted(scored)[:limit]]


def _idf(documents: int, containing: int) -> float:
    return math.log(1 + (documents - containing + 0.5) / (containing + 0.5))
