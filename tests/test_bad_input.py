"""Bad input never causes a 5xx, a hang, a body that is not Anthropic-shaped, or a log line
the proxy did not write (tests/hostile.py builds the requests and says what must come back).

A bounded number of examples here; `make fuzz` runs the same properties for FUZZ_SECONDS
(each round a fresh random seed), and prints what it sent.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ProxyServer
from tests.hostile import (
    LogLines,
    captured_log,
    check_answer,
    check_log,
    json_values,
    requests,
)
from tests.scripted_upstream import ScriptedUpstream

EXAMPLES = 1500
FUZZ_SECONDS = float(os.environ.get("FUZZ_SECONDS") or 0)
"""Set (by `make fuzz`): run each property for this long instead of EXAMPLES times."""
STATUSES: Counter[int] = Counter()


def nested(depth: int) -> bytes:
    return b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[' + (
        b'{"type":"text","content":[' * depth) + (b"]}" * depth) + b"]}]}"


raw_bodies = st.one_of(
    json_values.map(lambda value: json.dumps(value).encode()),
    requests().flatmap(lambda request: st.integers(0, len(request[1])).map(
        lambda n: request[1][:n])),
    st.binary(max_size=60),
    st.sampled_from([b"\xff\xfe\xfd", b'{"model": "\xc3\x28"}', nested(300), nested(2000),
                     b"[" * 5000, b'{"messages": ' * 1500]),
)
raw_requests = st.tuples(st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]),
                         raw_bodies, st.just({"content-type": "application/json"}))


@pytest.fixture(scope="module")
def proxy(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    """A proxy of this module's own: what its hostile requests leave in the dashboard's
    memory (models with line separators, …) is no other test's to read."""
    return proxy_factory()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def log_lines() -> Iterator[LogLines]:
    with captured_log() as lines:
        yield lines


def run(check: Callable[..., None], strategy: st.SearchStrategy[Any]) -> None:
    """`check` for EXAMPLES examples (the same ones every run), or with FUZZ_SECONDS, in
    rounds of fresh random examples until the time is up."""
    health = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
              HealthCheck.large_base_example]
    if not FUZZ_SECONDS:
        settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                 suppress_health_check=health)(given(strategy)(check))()
        return
    ends = time.monotonic() + FUZZ_SECONDS
    rounds = 0
    while time.monotonic() < ends:
        settings(max_examples=300, deadline=None, database=None,
                 suppress_health_check=health)(given(strategy)(check))()
        rounds += 1
    print(f"\nfuzzed {rounds} rounds of 300: statuses {dict(sorted(STATUSES.items()))}")


@pytest.mark.timeout(FUZZ_SECONDS + 300 if FUZZ_SECONDS else 180)
def test_hostile_requests(proxy: ProxyServer, upstream: ScriptedUpstream,
                          client: httpx.Client, log_lines: LogLines) -> None:
    """Mutated Claude Code requests and broken bytes: an Anthropic-shaped 4xx or a valid
    answer, and only well-formed log lines, the request's access line among them."""

    def check(request: tuple[str, bytes, dict[str, str | bytes]]) -> None:
        path, body, headers = request
        upstream.reset()
        response = client.post(f"{proxy.url}{path}", content=body, headers=headers)
        STATUSES[response.status_code] += 1
        check_answer(response, path)
        request_id = response.headers["request-id"]
        check_log(log_lines.take(request_id), request_id)

    run(check, st.one_of(requests(), requests(), raw_requests))


def test_the_examples_reached_both_the_refusals_and_the_upstream() -> None:
    """Runs after the property test (file order): its examples were refused and answered
    alike, and none was a 5xx."""
    print(f"\nbad-input statuses: {dict(sorted(STATUSES.items()))}")
    assert sum(STATUSES.values()) >= min(EXAMPLES, 1000), STATUSES
    assert STATUSES[200] >= 100 and STATUSES[400] >= 300, STATUSES
    assert all(status < 500 for status in STATUSES), STATUSES
