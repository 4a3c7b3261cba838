"""Who a request comes from: the configured keys (`config/key_specs.py`) and the
administrator's key, matched against what the client presented.

A presented key is hashed once and compared, in constant time, with every configured digest
(all of them, whichever matches), so the time taken says nothing about which key is close.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers

from claude_proxy.config.key_specs import ADMIN, KeySpec, digest_of
from claude_proxy.keys.auth import presented_keys


@dataclass(frozen=True)
class Identity:
    """Who sent a request: a configured key's spec, or the administrator (spec None)."""

    name: str
    spec: KeySpec | None = None

    @property
    def admin(self) -> bool:
        return self.spec is None



class KeyRing:
    """The configured keys and the administrator's key; `identify` answers who is calling."""

    def __init__(self, keys: Mapping[str, KeySpec], admin_key: str | None) -> None:
        self.keys = dict(keys)
        self._admin = digest_of(admin_key) if admin_key else None
        self._digests = [(spec.digest, spec) for spec in self.keys.values()]

    def identify(self, headers: Headers) -> Identity | None:
        """The caller, or None for a wrong or revoked key (the caller answers 401)."""
        found: Identity | None = None
        for value in presented_keys(headers):
            if not value:
                continue
            presented = digest_of(value)
            if self._admin is not None and hmac.compare_digest(presented, self._admin):
                found = found or Identity(ADMIN)
            for digest, spec in self._digests:
                if hmac.compare_digest(presented, digest) and found is None:
                    found = Identity(spec.name, spec)
        return found

    def spec(self, name: str) -> KeySpec | None:
        return self.keys.get(name)
