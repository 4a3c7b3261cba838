"""Tool-call ids across the two APIs.

Anthropic ids must match `^[a-zA-Z0-9_-]+$`. Upstream ids that already do are kept as they
are. Others (Kimi's `functions.add:0`) are encoded reversibly as `toolu_px<hex>`, so the next
request can give the upstream its own id back without the proxy keeping any state.
"""

from __future__ import annotations

import os
import re
import string

_SAFE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_ENCODED_PREFIX = "toolu_px"
_ALPHABET = string.ascii_letters + string.digits


_ID_LENGTH = 24
_USABLE = 4 * len(_ALPHABET)
"""Random bytes below this map evenly onto the alphabet (4 bytes per character); the few
above it are dropped, so every character stays uniform."""
_TO_ALPHABET = bytes(ord(_ALPHABET[byte % len(_ALPHABET)]) for byte in range(_USABLE)) + \
    bytes(256 - _USABLE)
_UNUSABLE = bytes(range(_USABLE, 256))


def _random_id() -> str:
    """24 characters of the alphabet, uniformly, from one read of system randomness mapped
    in C (a big random integer cut into digits in Python cost 4.7 µs; one
    `secrets.choice` per character a getrandom syscall each)."""
    characters = b""
    while len(characters) < _ID_LENGTH:
        characters += os.urandom(32).translate(_TO_ALPHABET, _UNUSABLE)
    return characters[:_ID_LENGTH].decode("ascii")


def new_tool_id() -> str:
    """A fresh id in Anthropic's style, for upstream calls that came without one."""
    return "toolu_" + _random_id()


def new_message_id() -> str:
    return "msg_" + _random_id()


def to_anthropic_id(upstream_id: str | None) -> str:
    """The id the client sees for an upstream tool call."""
    if not upstream_id:
        return new_tool_id()
    if _SAFE_ID.match(upstream_id):
        return upstream_id
    return _ENCODED_PREFIX + upstream_id.encode("utf-8").hex()


def to_upstream_id(anthropic_id: str) -> str:
    """The id to send upstream for a tool call or result the client sends back."""
    if not anthropic_id.startswith(_ENCODED_PREFIX):
        return anthropic_id
    try:
        decoded = bytes.fromhex(anthropic_id[len(_ENCODED_PREFIX):]).decode("utf-8")
    except ValueError:
        return anthropic_id
    # Only ids that needed encoding were encoded; anything else is a genuine client id.
    return anthropic_id if _SAFE_ID.match(decoded) else decoded
