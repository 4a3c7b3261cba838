"""The dashboard without a browser: its memory stays bounded, its auth, its feed, its views.

The browser tests (what a person sees) are in tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from claude_proxy.record import RequestRecord
from claude_proxy.sse import decode_frames, encode_events
from claude_proxy.ui.inspect import upstream_view
from claude_proxy.ui.recorder import ProviderHealth, Recorder
from claude_proxy.ui.routes import COOKIE
from tests.conftest import CLIENT_KEY, UPSTREAM_KEY, ProxyServer, eventually
from tests.scripted_upstream import ScriptedUpstream, completion, error_reply, text_stream

HEADERS = {"anthropic-version": "2023-06-01"}


def message_body(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 64,
            "messages": [{"role": "user", "content": text}], **extra}


def fake_record(number: int, events: int = 3) -> RequestRecord:
    record = RequestRecord(f"req_{number:06d}", "POST", "/v1/messages")
    record.client_model, record.upstream_model, record.provider = "claude-x", "up-x", "p"
    record.status, record.stream = 200, True
    record.tokens = {"input": 10, "output": 5, "reasoning": 1, "cached": 0}
    record.client_body = {"model": "claude-x", "max_tokens": 10,
                          "messages": [{"role": "user", "content": "x" * 1000}]}
    record.events = [encode_events([{"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "y"}}])
                     for _ in range(events)]
    record.first_byte = record.started
    return record


# ---------------------------------------------------------------- memory stays bounded


def test_ten_thousand_requests_leave_the_ring_buffers_at_their_limits() -> None:
    recorder = Recorder(inspect=50, secrets=[], health=lambda: [ProviderHealth("p")])
    for number in range(10_000):
        record = fake_record(number)
        recorder.started(record)
        recorder.finished(record, time.perf_counter())
    sizes = recorder.sizes()
    assert (sizes["rows"], sizes["kept"], sizes["in_flight"]) == (1000, 50, 0)
    assert sizes["minutes"] <= 2  # the run may cross into the next minute
    assert recorder.rows[0]["id"] == "req_009000" and recorder.rows[-1]["id"] == "req_009999"
    assert next(iter(recorder.kept)) == "req_009950"
    assert recorder.inspect("req_000001") is None  # gone from every buffer
    assert recorder.inspect("req_009100") is not None
    assert recorder.inspect("req_009100")["kept"] is False  # type: ignore[index]
    assert recorder.inspect("req_009999")["kept"] is True  # type: ignore[index]


def test_inspect_bytes_bounds_the_kept_bodies_the_newest_always_kept() -> None:
    recorder = Recorder(inspect=50, inspect_bytes=3_000_000, secrets=[], health=list)
    for number, size in enumerate([1_000_000] * 6 + [5_000_000, 400_000]):
        record = fake_record(number, events=0)
        record.client_json, record.upstream_json = b"x" * (size // 2), b"y" * (size // 2)
        recorder.started(record)
        recorder.finished(record, time.perf_counter())
        kept = list(recorder.kept)
        if number < 6:  # three 1 MB requests fit in 3 MB
            assert kept == [f"req_{n:06d}" for n in range(max(0, number - 2), number + 1)]
            assert recorder.sizes()["kept_bytes"] == 1_000_000 * len(kept)
    # a request larger than the budget is still kept, alone; the next one evicts it
    assert list(recorder.kept) == ["req_000007"]
    assert recorder.sizes()["kept_bytes"] == 400_000
    gone = recorder.inspect("req_000005")
    assert gone is not None and gone["kept"] is False and gone["inspect_bytes"] == 3_000_000
    assert recorder.inspect("req_000007")["kept"] is True  # type: ignore[index]


def test_inspect_requests_zero_keeps_metadata_only() -> None:
    recorder = Recorder(inspect=0, secrets=[], health=list)
    record = fake_record(1)
    recorder.started(record)
    recorder.finished(record, time.perf_counter())
    assert recorder.sizes()["kept"] == 0
    view = recorder.inspect("req_000001")
    assert view is not None and view["kept"] is False and "client" not in view
    assert [event for _, event, _ in view["row"]["timeline"]] == [
        "received", "first client byte", "end"]


def test_the_minute_buckets_stop_at_an_hour() -> None:
    recorder = Recorder(inspect=1, secrets=[], health=list)
    row = {"status": 200, "tokens": {"input": 1}, "error": None, "retries": 0, "failover": [],
           "provider": "p", "ttfb": 5.0}
    for minute in range(500):
        recorder.series.add(row, minute * 60.0)
    assert len(recorder.series.buckets) == 60
    snapshot = recorder.series.snapshot(499 * 60.0)
    assert len(snapshot["minutes"]) == 60 and snapshot["requests"]["200"] == [1] * 60
    assert snapshot["ttfb"]["p"]["p50"][-1] == pytest.approx(1.3**7)  # the bucket above 5 ms


def test_only_requests_to_the_messages_api_are_recorded() -> None:
    recorder = Recorder(inspect=5, secrets=[], health=list)
    for path in ("/v1/messages/count_tokens", "/ui/feed", "/v1/models"):
        record = RequestRecord("req_x", "GET", path)
        recorder.started(record)
        recorder.finished(record, time.perf_counter())
    assert recorder.sizes() == {"rows": 0, "kept": 0, "kept_bytes": 0, "in_flight": 0,
                                "minutes": 0}


def test_feed_viewer_that_falls_behind_is_sent_a_fresh_snapshot() -> None:
    from claude_proxy.ui.routes import live_feed

    async def scenario() -> list[str]:
        recorder = Recorder(inspect=5, secrets=[], health=list)
        feed = live_feed(recorder)
        kinds = [(await anext(feed))["event"]]
        for number in range(600):  # more than the backlog a viewer may have
            record = fake_record(number)
            recorder.started(record)
            recorder.finished(record, time.perf_counter())
        kinds.append((await anext(feed))["event"])
        await feed.aclose()
        assert not recorder.subscriptions
        return kinds

    assert asyncio.run(scenario()) == ["hello", "hello"]


# ---------------------------------------------------------------- what the views say


def test_upstream_view_marks_what_the_proxy_added() -> None:
    client = {"model": "claude-sonnet-4-6", "max_tokens": 64000, "tools": [
        {"name": "Bash"}, {"name": "WebSearch"}]}
    upstream = {"model": "deepseek-reasoner", "max_tokens": 32768, "stream": True,
                "stream_options": {"include_usage": True}, "thinking": {"type": "enabled"},
                "tools": [{"type": "function", "function": {"name": "Bash"}}],
                "messages": [{"role": "assistant", "content": "", "reasoning_content": "r"}]}
    view = upstream_view(client, upstream, {"thinking": {"type": "enabled"},
                                            "reasoning_content": "<history>"})
    added = {field["name"]: field["added"] for field in view["fields"]}
    assert added == {"model": None, "max_tokens": "clamped from 64000", "stream": None,
                     "stream_options": "added so the upstream reports usage",
                     "thinking": "reasoning field added by the proxy"}
    assert view["dropped_tools"] == ["WebSearch"] and view["tools"] == ["Bash"]
    assert view["messages"][0]["added"] == ["reasoning_content"]


def test_upstream_view_of_a_responses_api_request() -> None:
    client = {"model": "claude-opus-4-5", "max_tokens": 64000, "tools": [{"name": "Bash"}]}
    upstream = {"model": "gpt-5", "max_output_tokens": 32000,
                "reasoning": {"effort": "high", "summary": "auto"},
                "tools": [{"type": "function", "name": "Bash"}],
                "input": [{"role": "user", "content": "hi"},
                          {"type": "function_call", "name": "Bash", "arguments": "{}"}]}
    view = upstream_view(client, upstream, {"reasoning": upstream["reasoning"]})
    added = {field["name"]: field["added"] for field in view["fields"]}
    assert added == {"model": None, "max_output_tokens": "clamped from 64000",
                     "reasoning": "reasoning field added by the proxy"}
    assert view["tools"] == ["Bash"] and view["dropped_tools"] == []
    assert [m["role"] for m in view["messages"]] == ["user", "function_call"]


def test_secrets_are_redacted_as_in_the_logs() -> None:
    recorder = Recorder(inspect=5, secrets=[UPSTREAM_KEY], health=list)
    text = recorder.dumps({"a": f"key {UPSTREAM_KEY}", "headers": {"x-api-key": "abc12345xyz"},
                           "note": 'authorization: "Bearer tok123456789"'}).decode()
    assert UPSTREAM_KEY not in text and "abc12345xyz" not in text and "tok123456789" not in text
    assert orjson.loads(text)["a"] == "key [REDACTED]"
    # A redaction that would cut a JSON escape in two falls back to value by value.
    escaped = recorder.dumps({"note": 'api-key: abc12345\\"rest'}).decode()
    assert orjson.loads(escaped) == {"note": 'api-key: [REDACTED]"rest'}


# ---------------------------------------------------------------- over HTTP


def test_inspector_shows_the_request_and_its_answer(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True)
    upstream.queue(error_reply(429, "slow down", {"retry-after": "0"}))
    upstream.queue(text_stream(["It is ", "sunny."], usage={
        "prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}))
    tools = [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}},
             {"name": "Image", "description": "d", "input_schema": {"type": "object"}}]
    content = [{"type": "text", "text": "weather?"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "aGVsbG8="}}]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64000, "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 2048}, "tools": tools,
            "system": "You are terse.", "messages": [{"role": "user", "content": content}]}
    with httpx.stream("POST", f"{proxy.url}/v1/messages", json=body, headers=HEADERS) as sent:
        request_id = sent.headers["request-id"]
        assert b"sunny." in sent.read()

    def inspected() -> dict[str, Any] | None:
        answer = httpx.get(f"{proxy.url}/ui/api/requests/{request_id}")
        return answer.json() if answer.status_code == 200 else None

    assert eventually(lambda: inspected() is not None)
    view = inspected()
    assert view is not None and view["kept"] is True
    row = view["row"]
    assert (row["client_model"], row["provider"], row["model"], row["status"], row["stream"],
            row["retries"], row["stop"]) == ("claude-sonnet-4-6", "deepseek",
                                             "deepseek-reasoner", 200, True, 1, "end_turn")
    assert row["tokens"] == {"input": 50, "output": 7, "reasoning": 0, "cached": 0,
                             "cache_write": 0}
    events = [event for _, event, _ in row["timeline"]]
    assert events == ["received", "upstream request", "retry", "first upstream byte",
                      "first client byte", "end"]
    client = view["client"]
    assert client["tools"] == ["get_weather", "Image"]
    assert client["system"] == [{"type": "text", "text": "You are terse."}]
    assert client["messages"][0]["blocks"] == [
        {"type": "text", "text": "weather?"},
        {"type": "image", "placeholder": "[image image/png, 8 base64 characters]"}]
    fields = {field["name"]: field for field in view["upstream"]["fields"]}
    assert fields["thinking"]["value"] == {"type": "enabled"}
    assert fields["thinking"]["added"] == "reasoning field added by the proxy"
    assert view["answer"]["text"] == "It is sunny."
    assert view["answer"]["usage"]["output_tokens"] == 7


def test_non_streaming_answer_with_thinking_and_tool_call(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True)
    upstream.queue(completion({"reasoning_content": "Paris, so call the tool.", "content": "",
                               "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                              finish="tool_calls"))
    answer = httpx.post(f"{proxy.url}/v1/messages", headers=HEADERS, json=message_body(
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}]))
    request_id = answer.headers["request-id"]
    assert eventually(lambda: httpx.get(
        f"{proxy.url}/ui/api/requests/{request_id}").status_code == 200)
    view = httpx.get(f"{proxy.url}/ui/api/requests/{request_id}").json()
    assert view["answer"]["thinking"] == ["Paris, so call the tool."]
    assert view["answer"]["tool_calls"] == [
        {"id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert view["row"]["stop"] == "tool_use" and view["row"]["stream"] is False


def test_error_rows_carry_the_error_type(proxy: ProxyServer,
                                         upstream: ScriptedUpstream) -> None:
    upstream.queue(error_reply(400, "no such thing"))
    failed = httpx.post(f"{proxy.url}/v1/messages", headers=HEADERS, json=message_body())
    assert failed.status_code == 400
    request_id = failed.headers["request-id"]
    assert eventually(lambda: httpx.get(
        f"{proxy.url}/ui/api/requests/{request_id}").status_code == 200)
    view = httpx.get(f"{proxy.url}/ui/api/requests/{request_id}").json()
    assert view["row"]["error"] == "invalid_request_error"
    assert view["error"]["message"] == failed.json()["error"]["message"]
    assert httpx.get(f"{proxy.url}/ui/api/requests/req_nope").status_code == 404


def test_a_thousand_requests_over_http_stay_within_the_buffers(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(inspect_requests=20)
    upstream.responder = lambda body: completion({"content": "ok"})
    with httpx.Client(base_url=proxy.url, headers=HEADERS) as client:
        for _ in range(1100):
            assert client.post("/v1/messages", json=message_body()).status_code == 200
    recorder = proxy.app.state.recorder
    assert eventually(lambda: len(recorder.rows) == 1000 and not recorder.in_flight)
    sizes = recorder.sizes()
    assert (sizes["rows"], sizes["kept"], sizes["in_flight"]) == (1000, 20, 0)
    assert sizes["minutes"] <= 2  # the run may cross into the next minute


def read_hello(url: str, **kwargs: Any) -> tuple[httpx.Response, dict[str, Any]]:
    """The feed's first event (then the connection is closed)."""
    with httpx.stream("GET", f"{url}/ui/feed", timeout=10, **kwargs) as feed:
        if feed.status_code != 200:
            feed.read()
            return feed, {}
        lines = feed.iter_lines()
        assert next(lines) == "event: hello"
        data = next(lines)
        assert data.startswith("data: ")
        return feed, orjson.loads(data[6:])


def test_feed_without_a_key_is_open_and_says_which_worker(proxy: ProxyServer,
                                                           upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["x"]))
    request_id = httpx.post(f"{proxy.url}/v1/messages", json=message_body(),
                            headers=HEADERS).headers["request-id"]
    assert eventually(lambda: any(row["id"] == request_id
                                  for row in proxy.app.state.recorder.rows))
    response, hello = read_hello(proxy.url)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert hello["scope"]["workers"] == 1 and hello["scope"]["pid"] > 0
    assert request_id in [row["id"] for row in hello["requests"]]
    assert [p["name"] for p in hello["providers"]] == ["openai"]
    assert set(hello["series"]) == {"minutes", "requests", "ttfb", "tokens", "errors"}


# ---------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def keyed(proxy_factory: Callable[..., ProxyServer]) -> Iterator[ProxyServer]:
    yield proxy_factory(anthropic_api_key=CLIENT_KEY)


def login(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/ui/login", data={"key": key, "next": "/ui"},
                      follow_redirects=False)


def test_with_a_key_page_feed_and_inspector_answer_401_without_it(keyed: ProxyServer) -> None:
    page = httpx.get(f"{keyed.url}/ui")
    assert page.status_code == 401 and 'name="key"' in page.text
    assert page.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{keyed.url}/ui/requests/req_1").status_code == 401
    feed, hello = read_hello(keyed.url)
    assert feed.status_code == 401 and hello == {}
    assert httpx.get(f"{keyed.url}/ui/api/requests/req_1").status_code == 401
    wrong = login(keyed.url, "not-the-key")
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    forged = httpx.get(f"{keyed.url}/ui", cookies={COOKIE: "abc.9999999999.00ff"})
    assert forged.status_code == 401


def test_with_the_key_the_session_cookie_opens_page_and_feed(keyed: ProxyServer) -> None:
    signed_in = login(keyed.url, CLIENT_KEY)
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui"
    cookie_header = signed_in.headers["set-cookie"]
    assert "HttpOnly" in cookie_header and "SameSite=strict" in cookie_header.replace(
        "SameSite=Strict", "SameSite=strict")
    assert "Path=/ui" in cookie_header
    value = signed_in.cookies[COOKIE]
    assert CLIENT_KEY not in value and CLIENT_KEY not in cookie_header
    cookies = {COOKIE: value}
    page = httpx.get(f"{keyed.url}/ui", cookies=cookies)
    assert page.status_code == 200 and '<table id="requests">' in page.text
    feed, hello = read_hello(keyed.url, cookies=cookies)
    assert feed.status_code == 200 and hello["scope"]["workers"] == 1
    for text in (page.text, orjson.dumps(hello).decode()):
        assert CLIENT_KEY not in text and UPSTREAM_KEY not in text
    # As the API takes it, too (for scripts).
    assert httpx.get(f"{keyed.url}/ui", headers={"x-api-key": CLIENT_KEY}).status_code == 200


def test_metrics_need_the_key_as_a_bearer_token(
        keyed: ProxyServer, proxy_factory: Callable[..., ProxyServer]) -> None:
    assert httpx.get(f"{keyed.url}/metrics").status_code == 401
    scrape = httpx.get(f"{keyed.url}/metrics",
                       headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert scrape.status_code == 200 and "claude_proxy_requests_total" in scrape.text
    public = proxy_factory(anthropic_api_key=CLIENT_KEY, metrics_public=True)
    assert httpx.get(f"{public.url}/metrics").status_code == 200


def test_ui_disabled_records_nothing(proxy_factory: Callable[..., ProxyServer],
                                     upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(ui_enabled=False)
    upstream.queue(text_stream(["x"]))
    assert httpx.post(f"{proxy.url}/v1/messages", json=message_body(),
                      headers=HEADERS).status_code == 200
    assert httpx.get(f"{proxy.url}/ui").status_code == 404
    assert httpx.get(f"{proxy.url}/ui/feed").status_code == 404
    assert proxy.app.state.recorder is None


def test_startup_line_prints_the_dashboard_url() -> None:
    from claude_proxy.cli.command_line import startup_line
    from claude_proxy.config.file import single_provider_config
    from claude_proxy.config.settings import Settings
    config = single_provider_config(Settings(openai_api_key="k", provider="openai"))
    assert startup_line(config, "0.0.0.0", 8082, 1).endswith(
        "dashboard http://127.0.0.1:8082/ui")
    assert "each page load shows one of the 4 workers" in startup_line(
        config, "0.0.0.0", 8082, 4)
    off = single_provider_config(Settings(openai_api_key="k", provider="openai",
                                          ui_enabled=False))
    assert startup_line(off, "127.0.0.1", 9000, 1).endswith("dashboard off (UI_ENABLED=false)")


def test_chunks_cost_one_append_per_write(proxy: ProxyServer,
                                          upstream: ScriptedUpstream) -> None:
    """What recording costs a streaming response: its record holds the frames the relay
    wrote (no copies, no per-chunk work), and they decode to the events sent."""
    upstream.queue(text_stream([f"p{n} " for n in range(20)]))
    with httpx.stream("POST", f"{proxy.url}/v1/messages", headers=HEADERS,
                      json=message_body(stream=True)) as sent:
        request_id = sent.headers["request-id"]
        sent.read()
    recorder = proxy.app.state.recorder
    assert eventually(lambda: request_id in recorder.kept)
    record = recorder.kept[request_id]
    flat = list(decode_frames(record.events))
    assert flat[0]["type"] == "message_start" and flat[-1]["type"] == "message_stop"
    text = "".join(event["delta"]["text"] for event in flat
                   if event["type"] == "content_block_delta")
    assert text == "".join(f"p{n} " for n in range(20))
