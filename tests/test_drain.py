"""Drain on SIGTERM, through the real server (`claude-proxy`, DRAIN_DELAY=3, DRAIN_TIMEOUT=5):
/health answers 503 `draining` at once (/health/live stays 200), a request sent in the delay
is served, a stream open at the SIGTERM finishes, and what is still open at DRAIN_TIMEOUT ends
as clients retry: a stream with a well-formed `overloaded_error` event (a web search's too:
it lives past the socket's close like any other), a request waiting for its upstream with
529. (The soak's rolling restart, tests/soak.py, drains `--workers 2`.)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import clean_env, eventually
from tests.scripted_upstream import Reply, ScriptedUpstream, completion, text_stream
from tests.sse_grammar import check_grammar, parse_sse

Started = Callable[..., tuple[str, Any]]
DRAINED = ("the proxy is restarting and could not finish this answer within DRAIN_TIMEOUT; "
           "send the request again")


@pytest.fixture
def drain_upstream() -> Iterator[tuple[ScriptedUpstream, threading.Event]]:
    """`finish`: a stream held after its first piece until the event is set; `endless`: a
    stream that never ends; `wait`: an answer that never comes; anything else at once."""
    server = ScriptedUpstream().start()
    release = threading.Event()

    def respond(body: dict[str, Any]) -> Reply:
        asked = body["messages"][-1]["content"]
        if asked == "finish":
            return Reply(events=text_stream(["all ", "of it"]).events, held=release)
        if asked == "endless":
            return Reply(events=text_stream(["the start ", "never the end"]).events,
                         stall_at=2)
        if asked == "wait":
            return Reply(stall_at=0)
        return completion({"content": "served in the delay"})

    server.responder = respond
    yield server, release
    release.set()
    server.stop()


def post(url: str, content: str, stream: bool, **fields: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", timeout=60, json={
        "model": "claude-sonnet-4-6", "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": content}], **fields})


def search(url: str) -> httpx.Response:
    """A streamed request with the web search server tool, whose first model call waits."""
    return post(url, "wait", True, tools=[{"type": "web_search_20250305",
                                           "name": "web_search"}])


def test_sigterm_drains_and_ends_what_is_still_open_as_clients_retry(
        tmp_path: Path, started: Started,
        drain_upstream: tuple[ScriptedUpstream, threading.Event]) -> None:
    upstream, release = drain_upstream
    url, process = started(env=clean_env(
        tmp_path, OPENAI_API_KEY="sk-drain-upstream-0123456789", PROVIDER="openai",
        OPENAI_BASE_URL=upstream.base_url, MAX_RETRIES="0", BIG_MODEL="drain-model",
        MIDDLE_MODEL="drain-model", SMALL_MODEL="drain-model", DRAIN_DELAY="3",
        DRAIN_TIMEOUT="5", WEB_SEARCH_BACKEND="searxng", WEB_SEARCH_URL="http://127.0.0.1:9"))
    answers: dict[str, httpx.Response] = {}
    clients = [threading.Thread(target=lambda c=content, s=stream: answers.__setitem__(
        c, post(url, c, s))) for content, stream in (
        ("finish", True), ("endless", True), ("wait", False))]
    clients.append(threading.Thread(target=lambda: answers.__setitem__("search", search(url))))
    for client in clients:
        client.start()
    assert eventually(lambda: len(upstream.requests) == 4, timeout=30)

    process.send_signal(signal.SIGTERM)
    health = httpx.get(f"{url}/health", timeout=10)
    assert (health.status_code, health.json()) == (503, {"status": "draining"})
    live = httpx.get(f"{url}/health/live", timeout=10)
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    served = post(url, "in the delay", stream=False)
    assert served.json()["content"][0]["text"] == "served in the delay"
    release.set()
    for client in clients:
        client.join(timeout=60)

    finished = parse_sse(answers["finish"].content)
    check_grammar(finished)
    assert finished[-1].name == "message_stop"
    assert "".join(e.data["delta"].get("text", "") for e in finished
                   if e.name == "content_block_delta") == "all of it"
    ended = parse_sse(answers["endless"].content)
    check_grammar(ended)  # the open text block closed before the error
    assert [e.name for e in ended][-3:] == ["content_block_delta", "content_block_stop",
                                            "error"]
    assert [e.data["delta"]["text"] for e in ended if e.name == "content_block_delta"] == [
        "the start "]
    assert ended[-1].data == {"type": "error", "error": {"type": "overloaded_error",
                                                         "message": DRAINED}}
    searched = [e for e in parse_sse(answers["search"].content) if e.name != "ping"]
    check_grammar(searched)
    assert [e.name for e in searched] == ["message_start", "error"]
    assert searched[-1].data == ended[-1].data
    waited = answers["wait"]
    assert waited.status_code == 529
    assert waited.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                        "message": DRAINED}}
    process.wait(timeout=60)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    # The probes are not requests of the access log (a liveness probe every 20 s would fill it
    # and the dashboard); what was served is.
    logged = process.startup_output + "".join(process.later_output)
    assert " POST /v1/messages " in logged and " GET /health" not in logged
