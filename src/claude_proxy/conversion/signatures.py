"""Signatures for the thinking blocks the proxy emits, and the opaque-reasoning envelope.

Claude Code only keeps a thinking block's signature if it arrives in a `signature_delta`, and
sends every earlier block back with it, unchanged. The signature is therefore where the proxy
keeps what the upstream needs back and the user must not see (an OpenAI reasoning item's
`encrypted_content`, OpenRouter's encrypted or signed `reasoning_details`), together with who
produced it: the provider, the upstream model and a fingerprint of the upstream key.

    cp2.<envelope>.<mac>

`envelope` is the JSON `{"p": provider, "m": model, "k": key fingerprint, "o": [items]}`,
zlib-compressed, base64url; `mac` is an HMAC-SHA256, under a per-installation secret, of the
compressed envelope and the thinking text. A block shown without its text (the client asked
for `thinking.display: "omitted"`) carries the text in the envelope (`"t"`), and its mac
covers the empty text the client holds; `restore_hidden` puts the text back. A block whose
signature verifies is the proxy's own (its text may go back upstream per REASONING_PASSBACK);
its opaque items go back only to the same provider, model and key. Anything else (a real
Anthropic signature, a tampered or foreign envelope) is dropped, never forwarded.
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

from claude_proxy.conversion.census import holds

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
    hidden: str | None = None
    """The thinking text of a block shown without it (`display: "omitted"`)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ThinkingSigner:
    def __init__(self, secret: str | None = None) -> None:
        self._key = (secret or secrets.token_hex(32)).encode("utf-8")
        self._fingerprints: dict[str, str] = {}

    def key_fingerprint(self, upstream_key: str) -> str:
        """A short keyed digest of an upstream key: tells keys apart, reveals nothing.
        Computed once per key (there is one per provider; every request asks twice)."""
        known = self._fingerprints.get(upstream_key)
        if known is None:
            digest = hmac.new(self._key, b"upstream-key\0" + upstream_key.encode("utf-8"),
                              hashlib.sha256).digest()
            known = self._fingerprints[upstream_key] = _b64(digest[:6])
        return known

    def sign(self, thinking: str, opaque: list[dict[str, Any]] | None = None, /, *,
             origin: Origin | None = None, hidden: bool = False) -> str:
        """The signature of a block with this text; `hidden`: of a block the client is shown
        empty, the text kept inside."""
        who = origin or Origin()
        envelope: dict[str, Any] = {"p": who.provider, "m": who.model, "k": who.key}
        if opaque:
            envelope["o"] = opaque
        if hidden:
            envelope["t"] = thinking
        packed = zlib.compress(orjson.dumps(envelope), 9)
        shown = "" if hidden else thinking
        return f"{_PREFIX}{_b64(packed)}.{_b64(self._mac(packed, shown))}"

    def restore_hidden(self, block: dict[str, Any]) -> dict[str, Any]:
        """A thinking block shown empty (`display: "omitted"`) with its text back and an
        ordinary signature; any other block unchanged."""
        signature = block.get("signature")
        if block.get("thinking") or not isinstance(signature, str) or not signature:
            return block
        envelope = self.verify("", signature)
        if envelope is None or envelope.hidden is None:
            return block
        return {**block, "thinking": envelope.hidden,
                "signature": self.sign(envelope.hidden, envelope.opaque,
                                       origin=envelope.origin)}

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
    hidden = data.get("t")
    return Envelope(origin, items, hidden if isinstance(hidden, str) else None)


def restore_hidden_thinking(body: dict[str, Any], signer: ThinkingSigner) -> dict[str, Any]:
    """The request with each thinking block the client was shown empty (`display:
    "omitted"`) given its text back, so the rest of the pipeline sees an ordinary block of
    ours; the body itself when there is none."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not _has_thinking(messages):
        return body
    restored = [_restored_message(message, signer) for message in messages]
    if all(new is old for new, old in zip(restored, messages, strict=True)):
        return body
    return {**body, "messages": restored}


def _has_thinking(messages: list[Any]) -> bool:
    """Whether any assistant message holds a thinking block (every request of a long
    conversation asks, and most have none: `census` first)."""
    if not holds(messages, "thinking"):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and message.get("role") == "assistant":
            for block in content:
                if isinstance(block, dict) and block.get("type") == "thinking":
                    return True
    return False


def _restored_message(message: Any, signer: ThinkingSigner) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if message.get("role") != "assistant" or not isinstance(content, list):
        return message
    blocks = [signer.restore_hidden(block) if isinstance(block, dict)
              and block.get("type") == "thinking" else block for block in content]
    if all(new is old for new, old in zip(blocks, content, strict=True)):
        return message
    return {**message, "content": blocks}
