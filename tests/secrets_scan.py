"""The suite's last check, run by a session-end hook (conftest.pytest_sessionfinish) rather than
by a test that had to sort last: no secret appeared in any response or log line of the suite.
"""

from __future__ import annotations

import hashlib

import pytest

WHOLE_SUITE = 500
"""Tests collected above which the run is the whole suite, so the scan must have had the
suite's DEBUG log and its responses to read (a run of one file may have neither)."""


def findings(log: str, responses: bytes, secrets: list[str]) -> list[str]:
    """Where each secret (and each team key's hash) was found: empty when nowhere."""
    found = []
    for secret in secrets:
        for where, there in (("the log", secret in log),
                             ("a response", secret.encode() in responses)):
            if there:
                found.append(f"a secret ({secret[:6]}…) appeared in {where}")
    return found


def scan(session: pytest.Session, log: str, responses: list[bytes], keys: list[str],
         team: list[str]) -> list[str]:
    """The failures of the scan: secrets found, or (for the whole suite) a scan with nothing
    to read."""
    problems = []
    if session.testscollected >= WHOLE_SUITE:
        if "extra_json" not in log or "SSE outbound" not in log:
            problems.append("the suite did not log at DEBUG: the secrets scan read nothing")
        if len(responses) <= 100:
            problems.append("the suite's responses were not recorded")
    hashes = [hashlib.sha256(key.encode()).hexdigest() for key in team]
    return problems + findings(log, b"".join(responses), [*keys, *team, *hashes])
