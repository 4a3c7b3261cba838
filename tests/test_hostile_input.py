"""What a hostile client found on the proxy (issue 44), one test each: a field of another
JSON type a 500, a connection dropped without `Connection: close` after it, log lines forged
through a model or a path, a traceback for a client that leaves mid-body, and uvicorn's
plain-text 400 past the application for a body whose framing breaks.

Raw sockets where the client's bytes matter (one connection for several requests, a body cut
short, a broken chunk): httpx would not send them, or would hide which connection it used.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from claude_proxy.errors import ProxyError
from claude_proxy.server.requests import CountTokensRequest, MessagesRequest, validate_request
from tests.conftest import ProxyServer, eventually, load_fixture
from tests.hostile import EVERY_BLOCK, KINDS, LogLines, captured_log, check_log, paths
from tests.scripted_upstream import ScriptedUpstream

ASK = {"model": "claude-sonnet-4-6", "max_tokens": 64,
       "messages": [{"role": "user", "content": "hi"}]}
ENDPOINTS = ["/v1/messages", "/v1/messages/count_tokens"]


@pytest.fixture(scope="module")
def proxy(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    """A proxy of this module's own: what its hostile requests leave in the dashboard's
    memory (models with line separators, …) is no other test's to read."""
    return proxy_factory()


@pytest.fixture(scope="module")
def log_lines() -> Iterator[LogLines]:
    with captured_log() as lines:
        yield lines


def search_result(content: Any) -> dict[str, Any]:
    return {**ASK, "messages": [{"role": "user", "content": [
        {"type": "search_result", "source": "https://example.com", "title": "t",
         "content": content}]}]}


def server_tool_use(tool_input: Any) -> dict[str, Any]:
    return {**ASK, "messages": [
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
             "input": tool_input}]},
        {"role": "user", "content": "and?"}]}


def refusal(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


# ---------------------------------------------------------------- every field, every type


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("content", [True, 5])
def test_a_search_results_content_of_another_type_is_a_400_naming_it(
        path: str, content: Any, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """It was a 500 (`TypeError` in the conversion), and a 200 from count_tokens."""
    response = httpx.post(f"{proxy.url}{path}", json=search_result(content), timeout=30)
    assert response.status_code == 400 and upstream.requests == []
    assert response.json() == refusal(
        "messages.0.content.0.search_result.content: Input should be a valid list")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_server_tool_calls_input_of_another_type_is_a_400_naming_it(
        path: str, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """It was a 500 (`AttributeError` in the web-search replay)."""
    response = httpx.post(f"{proxy.url}{path}", json=server_tool_use(5), timeout=30)
    assert response.status_code == 400 and upstream.requests == []
    assert response.json() == refusal(
        "messages.1.content.0.server_tool_use.input: Input should be a valid dictionary")


def variants(body: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any, dict[str, Any]]]:
    """`body` with the value at each of its places swapped for one of each other JSON type
    (the place, the value, the body)."""
    values = {type(None): None, bool: True, int: 7, float: 0.5, str: "x", list: [],
              dict: {}}
    for place in paths(body):
        for kind in KINDS:
            changed = copy.deepcopy(body)
            parent = changed
            for step in place[:-1]:
                parent = parent[step]
            if type(parent[place[-1]]) is not kind:
                parent[place[-1]] = values[kind]
                yield place, values[kind], changed


def outcome(model: type[CountTokensRequest], body: dict[str, Any]) -> str | None:
    try:
        validate_request(model, body)
    except ProxyError as refused:
        assert refused.status == 400
        return refused.message
    return None


def test_every_field_of_every_block_type_in_every_other_type_is_refused_at_the_edge_alike(
) -> None:
    """Each place of a request holding every block type, swapped for each other JSON type:
    /v1/messages and count_tokens take it or refuse it alike, a refusal names the place
    (tests/test_bad_input.py sends what is taken on to the upstream)."""
    refused = 0
    for place, value, body in variants(EVERY_BLOCK):
        message = outcome(MessagesRequest, body)
        if place != ("max_tokens",) or value is not None:  # count_tokens needs none
            assert outcome(CountTokensRequest, body) == message, place
        if message is None:
            continue
        refused += 1
        location = message.split(":", 1)[0].split(".")
        steps = iter(location)
        assert all(str(step) in steps for step in place), (place, value, message)
    assert refused > 1000


# ---------------------------------------------------------------- connections


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on `sock`, and its answer (a Content-Length body)."""
    sock.sendall(request)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, body = received.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, value in
               (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def connect(proxy: ProxyServer) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_after_each_error_the_connection_serves_the_next_request(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """A 400 for a field's type (a 500 before, after which the connection was dropped
    without `Connection: close`), for bad JSON, a 413 for a body too large, a 404 and a 405:
    the next request on the same connection is answered."""
    proxy = proxy_factory(max_request_bytes=4096)
    good = post("/v1/messages", json.dumps(ASK).encode())
    errors = [post("/v1/messages", json.dumps(search_result(True)).encode()),
              post("/v1/messages/count_tokens", json.dumps(server_tool_use(5)).encode()),
              post("/v1/messages", b"{not json"),
              post("/v1/messages", b" " * 5000),
              post("/v1/nothing", b"{}"),
              b"GET /v1/messages HTTP/1.1\r\nhost: proxy\r\n\r\n"]
    with connect(proxy) as sock:
        for request in errors:
            status, headers, _ = exchange(sock, request)
            assert 400 <= status < 500 and headers.get("connection") != "close", status
            assert exchange(sock, good)[0] == 200


def test_a_fault_of_the_proxys_own_closes_its_connection_and_is_logged_as_a_500(
        proxy_factory: Callable[..., ProxyServer], log_lines: LogLines) -> None:
    """No client's input leads to a 500 any more; a bug still might. Its answer says
    `Connection: close` (uvicorn closes the connection once it has logged the error), and the
    access line has its status, not 0."""
    proxy = proxy_factory()
    assert eventually(lambda: hasattr(proxy.app.state, "wiring"))

    async def broken(*args: Any) -> int:
        raise RuntimeError("a bug")

    proxy.app.state.wiring.service.count_input = broken
    with connect(proxy) as sock:
        status, headers, body = exchange(sock, post("/v1/messages/count_tokens",
                                                    json.dumps(ASK).encode()))
        assert status == 500 and headers["connection"] == "close"
        assert json.loads(body) == {"type": "error", "error": {
            "type": "api_error", "message": "internal proxy error"}}
        assert sock.recv(1) == b""  # closed
    assert eventually(lambda: any("claude_proxy.access" in line and " status=500 " in line
                                  for line in log_lines.lines))
    log_lines.take("none", timeout=0)


# ---------------------------------------------------------------- logs


@pytest.mark.parametrize(("model", "shown"), [
    ("claude-sonnet-4-5\r\nX status=200", '"claude-sonnet-4-5\\r\\nX status=200"'),
    ("claude\nX", '"claude\\nX"'), ("claude\rX", '"claude\\rX"'), ("a\x00b", "a\\u0000b"),
    ("a\u2028b\x1b[31m", '"a\\u2028b\\u001b[31m"'),
])
def test_a_model_cannot_forge_a_log_line(model: str, shown: str, proxy: ProxyServer,
                                         upstream: ScriptedUpstream,
                                         log_lines: LogLines) -> None:
    """The access line shows the model escaped, quoted when it has a space or a line break
    (so that it adds no field to the line); it once began a line of its own."""
    response = httpx.post(f"{proxy.url}/v1/messages", json={**ASK, "model": model},
                          timeout=30)
    request_id = response.headers["request-id"]
    lines = log_lines.take(request_id)
    check_log(lines, request_id)
    access = next(line for line in lines if f"request_id={request_id} " in line)
    assert f" model={shown}->" in access


def test_a_path_cannot_split_its_access_line(proxy: ProxyServer,
                                             log_lines: LogLines) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages%0d%0aX%20status=200", json=ASK,
                          timeout=30)
    assert response.status_code == 404
    request_id = response.headers["request-id"]
    lines = log_lines.take(request_id)
    check_log(lines, request_id)
    assert f'request_id={request_id} POST "/v1/messages\\r\\nX status=200" ' in "\n".join(lines)


# ---------------------------------------------------------------- bodies cut short


def test_a_client_that_leaves_mid_body_is_a_499_and_one_line(proxy: ProxyServer,
                                                             log_lines: LogLines) -> None:
    """Its Content-Length promised more than it sent: once it has gone, the access line
    says 499, with no traceback and no `unexpected error` (before: both, and status 0)."""
    with connect(proxy) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: proxy\r\ncontent-length: 1000\r\n"
                     b'content-type: application/json\r\n\r\n{"model": "claude')
    assert eventually(lambda: any(" status=499 " in line for line in log_lines.lines))
    lines = log_lines.take("none", timeout=0.5)
    assert [line for line in lines if "claude_proxy.access" in line
            and " status=499 " in line], lines
    assert all(" ERROR " not in line and "Traceback" not in line for line in lines), lines


def test_a_body_whose_chunked_framing_breaks_is_the_applications_400(
        proxy: ProxyServer, log_lines: LogLines) -> None:
    """A chunk size that is no number, while the application reads the body: it answers,
    Anthropic-shaped, and closes the connection (before: uvicorn's plain-text 400 written
    past it, then a traceback from the application and status 0)."""
    with connect(proxy) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: proxy\r\n"
                     b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"8\r\n{\"model\"\r\nZZ\r\n")
        status, headers, body = exchange(sock, b"")
        assert status == 400 and headers["connection"] == "close"
        assert json.loads(body) == refusal("request body is not valid HTTP/1.1 framing")
        assert sock.recv(1) == b""
    lines = log_lines.take(headers["request-id"])
    warned = [line for line in lines if line.endswith("uvicorn.error: Invalid HTTP request "
                                                      "received.")]
    assert len(warned) == 1  # uvicorn's own word of it, as before
    check_log([line for line in lines if line not in warned], headers["request-id"])
    assert any(" status=400 " in line for line in lines if "claude_proxy.access" in line)


def test_a_sessions_next_request_has_its_changed_members_checked(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """A session's next request reuses the members its previous one had checked only where
    they are the very same (the same bytes at the end of the body): one that changed is
    checked as any other."""
    body = load_fixture("claude-code-2.1.332-tool-loop-second-request.json")["body"]
    body["stream"] = False
    headers = {"x-claude-code-session-id": "hostile-members"}
    assert httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers,
                      timeout=30).status_code == 200
    later = {**body, "messages": [*body["messages"],
                                  {"role": "assistant", "content": "done"},
                                  {"role": "user", "content": "and now?"}]}
    broken = copy.deepcopy(later)
    broken["tools"][1]["name"] = 5
    response = httpx.post(f"{proxy.url}/v1/messages", json=broken, headers=headers, timeout=30)
    assert response.json() == refusal("tools.1.name: Input should be a valid string")
    assert httpx.post(f"{proxy.url}/v1/messages", json=later, headers=headers,
                      timeout=30).status_code == 200
