"""Signatures for the thinking blocks the proxy emits.

Claude Code only keeps a thinking block's signature if it arrives in a `signature_delta`, and
sends every earlier block back with it. An HMAC of the thinking text under a per-installation
secret lets the proxy tell its own blocks (whose text may go back upstream) from foreign ones,
such as real Anthropic signatures after a model switch.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_PREFIX = "cp1."


class ThinkingSigner:
    def __init__(self, secret: str | None = None) -> None:
        self._key = (secret or secrets.token_hex(32)).encode("utf-8")

    def sign(self, thinking: str) -> str:
        digest = hmac.new(self._key, thinking.encode("utf-8"), hashlib.sha256).digest()
        return _PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")

    def verify(self, thinking: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(thinking), signature)
