"""What the proxy has learned about upstream models while running.

A model that answered 400 to something the proxy added (the reasoning fields, one of the
optional fields below, the client's cache breakpoints, a system message after the first) is
remembered, so later requests leave that out instead of failing and retrying every time.
The memory is kept in the state store (state/), per (provider, model, field), for REFUSAL_TTL
(a provider that later accepts the field gets it again); with a shared store, what one worker
or replica learns the others never try again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from claude_proxy.conversion.alternation import (
    fold_to_alternation,
    has_broken_alternation,
    has_tool_turns,
    names_alternation,
    tool_turns_as_text,
)
from claude_proxy.conversion.caching import (
    has_cache_control,
    has_system_after_first,
    names_system_position,
    strip_cache_control,
    system_messages_as_user,
)
from claude_proxy.conversion.structured import StructuredMode
from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import StateStore

REASONING = "reasoning"
SUMMARY = "reasoning.summary"
"""Responses API: reasoning summaries refused (an organisation not verified for them)."""
# Structured outputs step down instead of disappearing: a model that refused
# `response_format: json_schema` gets `json_object` (plus the schema in the system prompt),
# one that refused that too gets the prompt alone.
STRUCTURED = "response_format"
STRUCTURED_JSON_OBJECT = "response_format:json_object"
_ABOUT_STRUCTURED = re.compile(r"response_format|json_schema|json_object|structured output",
                               re.IGNORECASE)

# Words a refusal of the reasoning fields names, besides the field names themselves
# (Ollama: '"x" does not support thinking').
_REFUSAL_WORDS = ("thinking", "reasoning")
_ABOUT_A_FIELD = re.compile(r"argument|parameter|field|propert|not permitted|unrecognized|"
                            r"unknown|extra|unsupported|not supported|invalid", re.IGNORECASE)

Body = dict[str, Any]


@dataclass(frozen=True)
class Refusable:
    """Something the proxy may send that an upstream can refuse: how to tell it is in a
    body, whether an error message names it, and how to send the body without it."""

    name: str
    present: Callable[[Body], bool]
    named: Callable[[str], bool]
    drop: Callable[[Body], None]


def _names(field: str) -> Callable[[str], bool]:
    word = re.compile(rf"\b{field}\b")
    return lambda message: bool(_ABOUT_A_FIELD.search(message) and word.search(message))


def _top_level(field: str) -> Refusable:
    def drop(body: Body) -> None:
        body.pop(field, None)

    return Refusable(field, lambda body: field in body, _names(field), drop)


REFUSABLE: tuple[Refusable, ...] = (
    # Older Azure api-versions and vLLM/Ollama builds reject stream_options, some reject user;
    # Groq and Gemini reject prompt_cache_key; top_k goes only to profiles that take it.
    *(_top_level(field) for field in ("stream_options", "parallel_tool_calls", "user",
                                      "prompt_cache_key", "top_k")),
    # Mistral, NIM and some Kimi relays reject breakpoints ("...cache_control: Extra inputs
    # are not permitted"): sent without them.
    Refusable("cache_control", has_cache_control, _names("cache_control"), strip_cache_control),
    # Chat templates that take one system message only ("System message must be at the
    # beginning."): later ones are sent in place as user messages.
    Refusable("system_in_place", has_system_after_first, names_system_position,
              system_messages_as_user),
    # Templates that demand strict alternation (Gemma, the Mistral family: "Conversation roles
    # must alternate user/assistant/..."): folded (conversion/alternation.py). Gemma's takes
    # no `tool` turn either: tool calls and results go as text (before the fold, which then
    # merges them into alternating turns). One refusal teaches both (STRICT_FORM).
    Refusable("tool_turns", has_tool_turns, names_alternation, tool_turns_as_text),
    Refusable("alternation", has_broken_alternation, names_alternation, fold_to_alternation),
)
OPTIONAL_FIELDS = tuple(refusable.name for refusable in REFUSABLE)
REWRITING = ("cache_control", "system_in_place", "tool_turns", "alternation")
"""The refusals whose drop rewrites the conversation's messages (in place, or as a whole):
a model that refused one is converted whole on every request (conversion/reuse.py)."""
STRICT_FORM = ("tool_turns", "alternation")
"""What a "roles must alternate" refusal teaches at once, whichever of the two the refused
body showed: a conversation without tool turns (Claude Code's first request) taught the fold
alone, and the next one, with a `tool` message, was refused again for its tool turns (two
refusals per model). The Mistral family's templates, which take tool turns, then get them as
text too: the price of one refusal instead of two."""


def names_added_field(message: str, extras: dict[str, Any]) -> bool:
    """Whether an upstream error message is about one of the reasoning fields we added."""
    lowered = message.lower()
    return any(name.lower() in lowered for name in (*extras, *_REFUSAL_WORDS))


def refused_optional_fields(message: str, body: Body) -> list[str]:
    """The refusable things in `body` that an upstream error message rejects (any of
    STRICT_FORM: all of it)."""
    refused = [refusable.name for refusable in REFUSABLE
               if refusable.present(body) and refusable.named(message)]
    if any(name in STRICT_FORM for name in refused):
        refused += [name for name in STRICT_FORM if name not in refused]
    return refused


def drop_refused(body: Body, refuses: Callable[[str], bool]) -> None:
    """`body` without whatever `refuses` says the model refused before."""
    for refusable in REFUSABLE:
        if refuses(refusable.name):
            refusable.drop(body)


def refused_structured(message: str, body: dict[str, Any]) -> list[str]:
    """[STRUCTURED] or [STRUCTURED_JSON_OBJECT] when an upstream error message rejects the
    `response_format` we sent, else []."""
    sent = body.get("response_format")
    if not isinstance(sent, dict) or not _ABOUT_STRUCTURED.search(message):
        return []
    return [STRUCTURED if sent.get("type") == "json_schema" else STRUCTURED_JSON_OBJECT]


def structured_mode(refuses: Callable[[str], bool]) -> StructuredMode:
    """How to ask a model for a JSON schema, given what it refused before (`Refusals.of`)."""
    if refuses(STRUCTURED_JSON_OBJECT):
        return "prompt"
    if refuses(STRUCTURED):
        return "json_object"
    return "json_schema"


REFUSAL_TTL = 24 * 3600.0

ANY_FIELD = "*"
"""The record kept beside a model's refused fields: there is one while any is refused (no
field's name: a field is an identifier)."""


def _refuses_nothing(field: str) -> bool:
    return False


class Refusals:
    """(upstream model, field) pairs known to be refused by one provider; `REASONING` stands
    for all the reasoning fields of a dialect."""

    def __init__(self, store: StateStore | None = None, provider: str = "provider",
                 ttl: float = REFUSAL_TTL) -> None:
        self.store = store or LocalStore()
        self.provider = provider
        self.ttl = ttl

    def _key(self, model: str, field: str) -> str:
        return f"refusal:{self.provider}:{model}:{field}"

    def refuses(self, model: str, field: str) -> bool:
        return self.store.get(self._key(model, field)) is not None

    def of(self, model: str) -> Callable[[str], bool]:
        """`refuses` for one model, as one request asks it (a dozen fields): a model that
        refused nothing, nearly every one, costs one read of the store (ANY_FIELD), not one
        (a lock, an expiry check and a copy) per field."""
        if self.store.get(self._key(model, ANY_FIELD)) is None:
            return _refuses_nothing
        return partial(self.refuses, model)

    def remember(self, model: str, field: str) -> None:
        """The field's record, then the model's ANY_FIELD: written last and living as long,
        it outlives every field record of the model (a reader that finds a field finds it)."""
        self.store.put(self._key(model, field), {"refused": True}, ttl=self.ttl)
        self.store.put(self._key(model, ANY_FIELD), {"refused": True}, ttl=self.ttl)
