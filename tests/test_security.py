"""Secrets stay secret, the upstream is only what configuration says, CORS stays off."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest

from claude_proxy.logs import REDACTED, RedactingFilter, redact
from tests.conftest import CLIENT_KEY, UPSTREAM_KEY, ProxyServer
from tests.scripted_upstream import ScriptedUpstream, error_reply, text_stream

MINIMAL = {"model": "claude-sonnet-4-6", "max_tokens": 10,
           "messages": [{"role": "user", "content": "hi"}]}


def test_upstream_error_echoing_the_key_is_redacted(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=0)
    upstream.queue(error_reply(401, f"Incorrect API key provided: {UPSTREAM_KEY}."))
    response = httpx.post(f"{proxy.url}/v1/messages", json=MINIMAL)
    assert response.status_code == 401
    assert response.json()["error"] == {"type": "authentication_error",
                                        "message": "Incorrect API key provided: [REDACTED]."}


@pytest.mark.parametrize("line", [
    f"headers: {{'authorization': 'Bearer {UPSTREAM_KEY}'}}",
    f"x-api-key: {CLIENT_KEY}",
    f"sending api-key={UPSTREAM_KEY} to upstream",
    f"the key {UPSTREAM_KEY} in free text",
    "Authorization: Bearer some-unconfigured-token-123",
    "an sk-unknownkey1234567890 in a message",
])
def test_redaction_of_keys_and_auth_headers(line: str) -> None:
    redacted = redact(line, [UPSTREAM_KEY, CLIENT_KEY])
    assert UPSTREAM_KEY not in redacted and CLIENT_KEY not in redacted
    assert "some-unconfigured-token-123" not in redacted
    assert "unknownkey1234567890" not in redacted
    assert REDACTED in redacted


@pytest.mark.parametrize(("line", "expected"), [
    # Secrets nobody configured, in any case: the patterns still find them.
    ("X-API-KEY: unconfigured123", "X-API-KEY: [REDACTED]"),
    ("AUTHORIZATION=Bearer tok-987654", "AUTHORIZATION=[REDACTED]"),
    ("got BEARER tok-987654 from", "got BEARER [REDACTED] from"),
    ("an sk-abcdef123456789 here", "an sk-abcdef…[REDACTED] here"),
    # A line with none of the words is returned as it is (the access log's fast path).
    ('req_1 POST /v1/messages model=claude->gpt-4o status=200 key=team-a',
     'req_1 POST /v1/messages model=claude->gpt-4o status=200 key=team-a'),
])
def test_redaction_of_unconfigured_secrets_exactly(line: str, expected: str) -> None:
    assert redact(line, []) == expected


def test_filter_redacts_arguments_and_tracebacks() -> None:
    record = logging.LogRecord("x", logging.DEBUG, __file__, 1, "key=%s", (UPSTREAM_KEY,), None)
    try:
        raise ValueError(f"boom {CLIENT_KEY}")
    except ValueError as exc:
        record.exc_info = (ValueError, exc, exc.__traceback__)
    RedactingFilter([UPSTREAM_KEY, CLIENT_KEY]).filter(record)
    text = logging.Formatter().format(record)
    assert UPSTREAM_KEY not in text and CLIENT_KEY not in text and "boom" in text


def test_cors_is_off_and_upstream_url_cannot_be_chosen(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    preflight = httpx.options(f"{proxy.url}/v1/messages", headers={
        "origin": "https://evil.example", "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.status_code == 405
    upstream.queue(text_stream(["ok"]))
    response = httpx.post(f"{proxy.url}/v1/messages", json={
        **MINIMAL, "stream": True, "base_url": "http://127.0.0.2:1/v1",
        "api_base": "http://127.0.0.2:1", "extra_body": {"url": "http://127.0.0.2"}},
        headers={"x-upstream-url": "http://127.0.0.2:1", "host": "127.0.0.2"})
    assert response.status_code == 200
    assert len(upstream.requests) == 1  # it went to the configured upstream
    assert "access-control-allow-origin" not in response.headers
    for field in ("base_url", "api_base", "extra_body"):
        assert field not in upstream.requests[0]


def test_health_reveals_no_configuration(proxy: ProxyServer) -> None:
    body = httpx.get(f"{proxy.url}/health").text
    assert body == '{"status":"ok"}'
