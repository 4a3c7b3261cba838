"""Bad input never causes a 5xx, a hang, or a body that is not Anthropic-shaped.

A property-based test (hypothesis) sends thousands of generated bad requests to the running
proxy: arbitrary JSON, valid requests with fields replaced by wrong values, broken bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ProxyServer
from tests.scripted_upstream import ScriptedUpstream
from tests.sse_grammar import check_grammar, parse_sse

VALID: dict[str, Any] = {
    "model": "claude-sonnet-4-6", "max_tokens": 50, "stream": False,
    "system": [{"type": "text", "text": "sys"}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"c": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}]},
    ],
    "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "metadata": {"user_id": "u"},
}

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(
    allow_nan=False) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "text", "content", "role", "source", "id", "name", "input",
                         "tool_use_id", "thinking", "data", "x", ""]) | st.text(max_size=8),
        children, max_size=4),
    max_leaves=25)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


VALID_PATHS = paths(VALID)
STATUSES: Counter[int] = Counter()


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    """A valid request with one to three places replaced, removed or wrapped."""
    body = json.loads(json.dumps(VALID))
    body["stream"] = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(VALID_PATHS))
        parent = body
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["replace", "delete", "wrap"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "wrap":
                parent[path[-1]] = [parent[path[-1]]]
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    return json.dumps(body).encode()


def nested(depth: int) -> bytes:
    return b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[' + (
        b'{"type":"x","content":[' * depth) + (b"]}" * depth) + b"]}]}"


raw_bodies = st.one_of(
    json_values.map(lambda value: json.dumps(value).encode()),
    mutated_requests(),
    mutated_requests().flatmap(lambda body: st.integers(0, len(body)).map(lambda n: body[:n])),
    st.binary(max_size=60),
    st.sampled_from([b"\xff\xfe\xfd", b'{"model": "\xc3\x28"}', nested(300), nested(2000),
                     b"[" * 5000, b'{"messages": ' * 1500]),
)


@pytest.fixture(scope="module")
def client() -> Any:
    with httpx.Client(timeout=30) as http:
        yield http


def check_answer(response: httpx.Response, path: str = "/v1/messages") -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = parse_sse(response.content)
        check_grammar(events)
        return
    body = response.json()
    if response.status_code == 200 and path.startswith("/v1/messages/count_tokens"):
        assert set(body) == {"input_tokens"} and isinstance(body["input_tokens"], int)
    elif response.status_code == 200:
        assert body["type"] == "message" and isinstance(body["content"], list)
        assert isinstance(body["usage"]["output_tokens"], int)
    else:
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str)


@settings(max_examples=2200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(body=raw_bodies, path=st.sampled_from(["/v1/messages", "/v1/messages?beta=true",
                                              "/v1/messages/count_tokens"]))
def test_generated_bad_requests(body: bytes, path: str, proxy: ProxyServer,
                                upstream: ScriptedUpstream, client: httpx.Client) -> None:
    response = client.post(f"{proxy.url}{path}", content=body,
                           headers={"content-type": "application/json"})
    check_answer(response, path)
    STATUSES[response.status_code] += 1


def test_at_least_2000_requests_of_every_kind_were_sent() -> None:
    """Runs after the property test (file order): it really sent 2,000+ requests, and they
    exercised both the rejections and the full path to the upstream."""
    print(f"\nbad-input statuses: {dict(sorted(STATUSES.items()))}")
    assert sum(STATUSES.values()) >= 2000, STATUSES
    assert STATUSES[200] >= 100 and STATUSES[400] >= 500, STATUSES
    assert all(status < 500 for status in STATUSES), STATUSES


def test_the_generator_reaches_the_upstream_too(proxy: ProxyServer, upstream: ScriptedUpstream,
                                                client: httpx.Client) -> None:
    """The mutations are not all rejected: valid-enough requests go through and are answered."""
    response = client.post(f"{proxy.url}/v1/messages", json=VALID)
    check_answer(response)
    assert response.status_code == 200 and len(upstream.requests) == 1
