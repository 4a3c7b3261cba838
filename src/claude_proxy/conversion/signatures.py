"""Signatures for the thinking blocks the proxy emits, and the opaque-reasoning envelope.

Claude Code only keeps a thinking block's signature if it arrives in a `signature_delta`, and
sends every earlier block back with it, unchanged. The signature is therefore where the proxy
keeps what the upstream needs back and the user must not see (an OpenAI reasoning item's
`encrypted_content`, OpenRouter's encrypted or signed `reasoning_details`), together with who
produced it: the provider, the upstream model and a fingerprint of the upstream key.

    cp2.<envelope>.<mac>

`envelope` is the JSON `{"p": provider, "m": model, "k": key fingerprint, "o": [items]}`,
zlib-compressed, base64url; `mac` is an HMAC-SHA256, under a per-installation secret, of the
compressed envelope and the thinking text. A block whose signature verifies is the proxy's own
(its text may go back upstream per REASONING_PASSBACK); its opaque items go back only to the
same provider, model and key. Anything else (a real Anthropic signature, a tampered or foreign
envelope) is dropped, never forwarded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

logger = logging.getLogger("claude_proxy.conversion")

_PREFIX = "cp2."
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024
"""The most an envelope may inflate to (a verified one never comes near it)."""


@dataclass(frozen=True)
class Origin:
    """Who produced a thinking block: provider name, upstream model, key fingerprint."""

    provider: str = ""
    model: str = ""
    key: str = ""


@dataclass(frozen=True)
class Envelope:
    """A verified signature's contents."""

    origin: Origin
    opaque: list[dict[str, Any]] = field(default_factory=list)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ThinkingSigner:
    def __init__(self, secret: str | None = None) -> None:
        self._key = (secret or secrets.token_hex(32)).encode("utf-8")

    def key_fingerprint(self, upstream_key: str) -> str:
        """A short keyed digest of an upstream key: tells keys apart, reveals nothing."""
        digest = hmac.new(self._key, b"upstream-key\0" + upstream_key.encode("utf-8"),
                          hashlib.sha256).digest()
        return _b64(digest[:6])

    def sign(self, thinking: str, opaque: list[dict[str, Any]] | None = None, /, *,
             origin: Origin | None = None) -> str:
        who = origin or Origin()
        envelope: dict[str, Any] = {"p": who.provider, "m": who.model, "k": who.key}
        if opaque:
            envelope["o"] = opaque
        packed = zlib.compress(orjson.dumps(envelope), 9)
        return f"{_PREFIX}{_b64(packed)}.{_b64(self._mac(packed, thinking))}"

    def verify(self, thinking: str, signature: str) -> Envelope | None:
        """The envelope of a signature this proxy made for exactly this text, else None."""
        if not signature.startswith(_PREFIX) or signature.count(".") != 2:
            return None
        packed_text, mac_text = signature[len(_PREFIX):].split(".")
        try:
            packed, mac = _unb64(packed_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(self._mac(packed, thinking), mac):
            return None
        return _open(packed)

    def _mac(self, packed: bytes, thinking: str) -> bytes:
        message = struct.pack(">I", len(packed)) + packed + thinking.encode("utf-8")
        return hmac.new(self._key, message, hashlib.sha256).digest()


def _open(packed: bytes) -> Envelope | None:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_ENVELOPE_BYTES)
        data = orjson.loads(raw)
    except (zlib.error, orjson.JSONDecodeError):
        logger.warning("a verified thinking signature has an unreadable envelope")
        return None
    if not isinstance(data, dict):
        return None
    opaque = data.get("o")
    items = [item for item in opaque if isinstance(item, dict)] if isinstance(opaque, list) else []
    origin = Origin(str(data.get("p", "")), str(data.get("m", "")), str(data.get("k", "")))
    return Envelope(origin, items)
