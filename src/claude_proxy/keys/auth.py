"""The client key check, shared by the API, /metrics and the dashboard.

Every presented value is compared in constant time, and all of them are compared, so the time
taken does not depend on which one matched.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers


def presented_keys(headers: Headers) -> list[str]:
    """`x-api-key`, and the token of `Authorization: Bearer` (as Prometheus sends it)."""
    presented = [headers.get("x-api-key", "")]
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        presented.append(authorization[7:].strip())
    return presented


def key_matches(presented: list[str], expected: str) -> bool:
    matches = [hmac.compare_digest(value.encode(), expected.encode()) for value in presented]
    return any(matches)
