"""Runs last (file order): no secret appeared in any response or log line of the suite."""

from __future__ import annotations

import hashlib

from tests.conftest import CLIENT_KEY, TEAM_KEYS, UPSTREAM_KEY, SuiteRecord


def test_no_secret_in_any_response_or_log_line() -> None:
    assert SuiteRecord.log_file is not None
    log = SuiteRecord.log_file.read_text(encoding="utf-8")
    assert "extra_json" in log and "SSE outbound" in log, "the suite logged at DEBUG"
    responses = b"".join(SuiteRecord.responses)
    assert len(SuiteRecord.responses) > 100, "the responses of the suite were recorded"
    team = [*TEAM_KEYS.values()]
    hashes = [hashlib.sha256(key.encode()).hexdigest() for key in team]
    for secret in (UPSTREAM_KEY, CLIENT_KEY, *team, *hashes):
        assert secret not in log
        assert secret.encode() not in responses
