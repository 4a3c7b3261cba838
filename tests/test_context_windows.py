"""Long sessions on real context windows: every upstream overflow answered as Anthropic's 400,
the pre-flight (long_context reroute, the 400 with no upstream call, the max_tokens clamp),
windows discovered at start, and count_tokens (exact for OpenAI models, calibrated per session
for the others). Real proxies on loopback, scripted upstreams, the anthropic SDK."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from bench import count_tokens as bench_count
from bench.session import load_turns
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from claude_proxy.cli.command_line import http_protocol
from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.server.app import create_app
from tests.conftest import UPSTREAM_KEY, ProxyServer, RecordingApp, eventually, serving
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    chunk,
    responses_stream,
    serve_in_thread,
    stop_server,
)
from tests.sse_grammar import check_grammar, parse_sse

OVERFLOWS = Path(__file__).parent / "data" / "overflow"
FIXTURES = sorted(path.stem for path in OVERFLOWS.glob("*.json"))
WINDOW = 100_000
WAYS = ("plain", "streamed", "first-event")


def load_overflow(name: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((OVERFLOWS / f"{name}.json").read_text("utf-8"))
    return fixture


def expected_message(fixture: dict[str, Any]) -> str:
    """The body's numbers; without them, the known window (WINDOW) and one token more."""
    limit = fixture["limit"] or WINDOW
    requested = fixture["requested"]
    if requested == "window+736":
        requested = WINDOW + 736
    return f"prompt is too long: {requested or limit + 1} tokens > {limit} maximum"


def overflow_reply(fixture: dict[str, Any], way: str) -> Reply:
    """The fixture's body as the upstream sends it: an HTTP error (to a plain or a streaming
    request), or the first event of a 200 stream."""
    body = json.loads(fixture["raw"]) if "raw" in fixture else fixture["body"]
    if way != "first-event":
        raw = fixture["raw"].encode() if "raw" in fixture else None
        return Reply(status=fixture["status"], body=body, raw_body=raw)
    if fixture["api"] == "responses":
        return responses_stream(fixture["event"])
    inner = body.get("error", body) if isinstance(body, dict) else body
    return Reply(events=[{"error": inner}], done=False)


@pytest.fixture(scope="module")
def window_proxies(proxy_factory: Callable[..., ProxyServer]) -> dict[str, ProxyServer]:
    return {"chat": proxy_factory(context_window=WINDOW),
            "responses": proxy_factory(context_window=WINDOW, big_model="o4-mini")}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", FIXTURES)
def test_every_upstream_overflow_is_anthropics_400(
        name: str, way: str, window_proxies: dict[str, ProxyServer],
        upstream: ScriptedUpstream) -> None:
    fixture = load_overflow(name)
    upstream.queue(overflow_reply(fixture, way))
    proxy = window_proxies[fixture["api"]]
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0)
    model = "claude-opus-4-6" if fixture["api"] == "responses" else "claude-sonnet-4-6"
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=model, max_tokens=100, stream=way != "plain",
                               messages=[{"role": "user", "content": "hello"}])
    assert raised.value.status_code == 400
    assert raised.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": expected_message(fixture)}}
    assert len(upstream.requests) == 1  # never retried, never failed over
    expected_path = "/v1/responses" if fixture["api"] == "responses" else "/v1/chat/completions"
    assert upstream.paths == [expected_path]


def after_text(fixture: dict[str, Any]) -> Reply:
    """The fixture's overflow announced inside a 200 stream after some text: an error chunk
    (OpenAI's `context_length_exceeded` among them), or a Responses `response.failed`."""
    if fixture["api"] == "responses":
        return responses_stream(
            {"type": "response.created", "response": {"status": "in_progress"}},
            {"type": "response.output_item.added", "item": {"type": "message", "id": "m"}},
            {"type": "response.output_text.delta", "item_id": "m", "delta": "so far"},
            fixture["event"])
    body = json.loads(fixture["raw"]) if "raw" in fixture else fixture["body"]
    inner = body.get("error", body) if isinstance(body, dict) else body
    return Reply(events=[chunk({"role": "assistant", "content": "so far"}), {"error": inner}],
                 done=False)


@pytest.mark.parametrize("name", FIXTURES)
def test_an_overflow_after_the_first_byte_is_anthropics_overflow_event(
        name: str, window_proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    """No status is left to send: the `error` event carries Anthropic's overflow, typed
    invalid_request_error (not the upstream's words, not an overloaded_error to retry)."""
    fixture = load_overflow(name)
    upstream.queue(after_text(fixture))
    proxy = window_proxies[fixture["api"]]
    model = "claude-opus-4-6" if fixture["api"] == "responses" else "claude-sonnet-4-6"
    response = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": model, "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "hello"}]})
    assert response.status_code == 200
    events = parse_sse(response.content)
    check_grammar(events)
    assert [e.name for e in events] == ["message_start", "content_block_start",
                                        "content_block_delta", "content_block_stop", "error"]
    assert events[2].data["delta"]["text"] == "so far"
    assert events[-1].data == {"type": "error", "error": {
        "type": "invalid_request_error", "message": expected_message(fixture)}}
    assert len(upstream.requests) == 1


def test_fixtures_name_their_source() -> None:
    assert len(FIXTURES) >= 16
    for name in FIXTURES:
        fixture = load_overflow(name)
        assert fixture["source"] and fixture["status"] >= 400, name


# ---------------------------------------------------------------- pre-flight


SMALL_WINDOW = 2000
SMALL_OUTPUT = 1000


@pytest.fixture(scope="module")
def pair() -> Iterator[dict[str, ScriptedUpstream]]:
    servers = {name: ScriptedUpstream().start() for name in ("small", "large")}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def preflight_proxy(tmp_path: Path, pair: dict[str, ScriptedUpstream]
                    ) -> Iterator[Callable[[bool], ProxyServer]]:
    """A proxy whose default model has a 2000-token window (and 1000 output tokens), with or
    without a long_context route to a 1M-token model."""
    for server in pair.values():
        server.reset()
    started: list[tuple[Any, Any]] = []

    def start(long_context: bool) -> ProxyServer:
        tables = "".join(
            f'[providers.{name}]\nopenai_base_url = "{server.base_url}"\n'
            f'openai_api_key = "{UPSTREAM_KEY}"\nprovider = "openai"\nbig_model = "{name}-main"'
            f'\nmiddle_model = "{name}-main"\nsmall_model = "{name}-main"\nmax_retries = 0\n'
            for name, server in pair.items())
        tables += (f'[providers.small.models."small-main"]\ncontext_window = {SMALL_WINDOW}\n'
                   f"max_output_tokens = {SMALL_OUTPUT}\n"
                   "[providers.large.models.\"large-main\"]\ncontext_window = 1000000\n")
        router = '[router]\ndefault = "small,small-main"\nlong_context_threshold = 900000\n'
        if long_context:
            router += 'long_context = "large,large-main"\n'
        path = tmp_path / "proxy.toml"
        path.write_text(tables + router)
        settings = Settings(log_file=str(tmp_path / "proxy.log"))
        app = create_app(settings, config=load_config_file(path, settings))
        sock = bind_loopback()
        server, thread = serve_in_thread(RecordingApp(app), sock, http=http_protocol())
        started.append((server, thread))
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                            thread)
        assert eventually(lambda: serving(proxy.url))
        return proxy

    yield start
    for server, thread in started:
        stop_server(server, thread)


def ask(proxy: ProxyServer, text: str, max_tokens: int = 100,
        stream: bool = False) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": text}]})


def tokens_of(text: str, model: str = "small-main") -> int:
    return estimate_request_tokens({"messages": [{"role": "user", "content": text}]}, model)


LONG = "lorem ipsum dolor sit amet " * 400  # about 2,700 tokens: over the 2,000 window


def test_over_the_window_goes_to_long_context_without_a_failed_call(
        preflight_proxy: Callable[[bool], ProxyServer],
        pair: dict[str, ScriptedUpstream]) -> None:
    response = ask(preflight_proxy(True), LONG)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "scripted default"}]
    assert pair["small"].requests == []
    assert [r["model"] for r in pair["large"].requests] == ["large-main"]


@pytest.mark.parametrize("stream", [False, True])
def test_over_the_window_without_long_context_is_refused_before_sending(
        stream: bool, preflight_proxy: Callable[[bool], ProxyServer],
        pair: dict[str, ScriptedUpstream]) -> None:
    response = ask(preflight_proxy(False), LONG, stream=stream)
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {tokens_of(LONG)} tokens > {SMALL_WINDOW} maximum"}}
    assert pair["small"].requests == [] and pair["large"].requests == []


def test_max_tokens_is_clamped_to_the_room_left(
        preflight_proxy: Callable[[bool], ProxyServer],
        pair: dict[str, ScriptedUpstream]) -> None:
    proxy = preflight_proxy(False)
    fits = "lorem ipsum dolor sit amet " * 200  # about 1,350 tokens: fits, with little room
    assert ask(proxy, fits, max_tokens=4000).status_code == 200
    assert ask(proxy, "hi", max_tokens=4000).status_code == 200
    sent = [request["max_tokens"] for request in pair["small"].requests]
    assert sent == [SMALL_WINDOW - tokens_of(fits), SMALL_OUTPUT]


# ---------------------------------------------------------------- count_tokens


def test_count_tokens_is_exact_for_openai_models(
        proxy_factory: Callable[..., ProxyServer]) -> None:
    """o200k_base, with the chat format's 3 tokens a message and 3 priming the reply:
    3 + (3+1+4) + (3+1+9) + (3+1+4) + (3+1+2) = 38."""
    proxy = proxy_factory(middle_model="gpt-4o")
    response = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json={
        "model": "claude-sonnet-4-6", "system": "You are terse.",
        "messages": [{"role": "user", "content": "Count the tokens of this sentence, exactly."},
                     {"role": "assistant", "content": "It has nine."},
                     {"role": "user", "content": "hello world"}]})
    assert response.json() == {"input_tokens": 38}


def test_count_tokens_counts_every_block_type(proxy: ProxyServer) -> None:
    """Each kind of content adds to the count: nothing is skipped."""
    def count(**fields: Any) -> int:
        body = {"model": "claude-sonnet-4-6",
                "messages": [{"role": "user", "content": "hello"}], **fields}
        reply = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=body)
        value: int = reply.json()["input_tokens"]
        return value

    base = count()
    words = "alpha beta gamma delta " * 50
    added = {
        "system": count(system=[{"type": "text", "text": words}]),
        "tools": count(tools=[{"name": "run", "description": words,
                               "input_schema": {"type": "object"}}]),
        "tool use and result": count(messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": words, "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "run", "input": {"text": words}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": words}]}]}]),
        "image": count(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}, {"type": "text",
                                                                    "text": "hello"}]}]),
        "text document": count(messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": words}}, {"type": "text",
                                                              "text": "hello"}]}]),
        "structured output": count(output_config={"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"summary": {"type": "string",
                                                         "description": words}}}}}),
    }
    assert all(value > base + 100 for value in added.values()), (base, added)


def test_count_tokens_within_five_percent_after_the_first_turn(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """The recorded 10-turn Claude Code session through bench/count_tokens.py: an upstream
    whose tokenizer is not four characters a token, reporting usage after every turn."""
    upstream.responder = bench_count.reporting
    turns = bench_count.replay(proxy_factory().url, upstream, load_turns())
    assert len(turns) == 10
    assert abs(turns[0].error) > 0.02  # the plain estimate alone is off
    assert [t.number for t in turns if abs(t.error) > bench_count.TARGET_ERROR] in ([], [1])


# ---------------------------------------------------------------- discovery


def serving_windows(routes: list[Route]) -> ScriptedUpstream:
    server = ScriptedUpstream()
    server.app.router.routes[:0] = routes  # before the scripted upstream's own (its /props)
    return server.start()


def vllm_models(_: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [
        {"id": "served-model", "object": "model", "max_model_len": 4096}]})


def llamacpp_props(_: Request) -> JSONResponse:
    return JSONResponse({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1})


def openrouter_models(_: Request) -> JSONResponse:
    return JSONResponse({"data": [
        {"id": "vendor/small-model", "context_length": 4096,
         "top_provider": {"context_length": 4096, "max_completion_tokens": 1024}},
        {"id": "vendor/other", "context_length": 1000000}]})


def ollama_ps(_: Request) -> JSONResponse:
    return JSONResponse({"models": [{"name": "qwen3:latest", "model": "qwen3:latest",
                                     "context_length": 16384}]})


async def ollama_show(request: Request) -> JSONResponse:
    model = (await request.json())["model"]
    return JSONResponse({"parameters": "temperature 0.6",
                         "model_info": {"qwen3.context_length": 40960 if model == "qwen3"
                                        else 2048}})


@pytest.mark.parametrize(("provider", "routes", "models", "window", "output", "source"), [
    ("vllm", [Route("/v1/models", vllm_models)], "default", 4096, None,
     "discovered: /v1/models max_model_len"),
    ("openai", [Route("/props", llamacpp_props)], "local-gguf", 8192, None,
     "discovered: llama.cpp /props n_ctx"),
    ("openrouter", [Route("/v1/models", openrouter_models)], "vendor/small-model", 4096, 1024,
     "discovered: OpenRouter /models context_length"),
    ("ollama", [Route("/api/ps", ollama_ps), Route("/api/show", ollama_show, methods=["POST"])],
     "qwen3", 16384, None, "discovered: Ollama /api/ps context_length"),
])
def test_windows_discovered_at_start_are_enforced(
        provider: str, routes: list[Route], models: str, window: int, output: int | None,
        source: str, proxy_factory: Callable[..., ProxyServer]) -> None:
    server = serving_windows(routes)
    try:
        proxy = proxy_factory(openai_base_url=server.base_url, provider=provider,
                              big_model=models, middle_model=models, small_model=models)
        assert eventually(lambda: serving(proxy.url))
        detail = httpx.get(f"{proxy.url}/health?detail=1").json()
        assert detail["providers"][provider]["models"] == {models: {
            "context_window": window, "max_output_tokens": output, "source": source}}
        text = "word " * (window * 2)
        response = ask(proxy, text)
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert message.startswith("prompt is too long: ")
        assert message.endswith(f" tokens > {window} maximum")
        assert server.requests == []  # Ollama never gets the prompt it would cut
    finally:
        server.stop()


def test_an_unknown_window_is_never_refused(proxy: ProxyServer,
                                            upstream: ScriptedUpstream) -> None:
    detail = httpx.get(f"{proxy.url}/health?detail=1").json()
    assert detail["providers"]["openai"]["models"]["middle-upstream"] == {
        "context_window": None, "max_output_tokens": None, "source": "unknown: no pre-flight"}
    assert ask(proxy, "word " * 300_000).status_code == 200
    assert len(upstream.requests) == 1


# ---------------------------------------------------------------- calibration


def test_calibration_follows_the_upstreams_reports() -> None:
    """Through the state store: a plain estimate without a record; the last report plus the
    growth, corrected by the last growth's own ratio; a compacted (shrunk) conversation
    scaled by the whole ratio; nothing kept without a session."""
    from claude_proxy.routing import calibration
    from claude_proxy.state.local import LocalStore

    store = LocalStore()
    assert calibration.calibrated(store, "s1", "p", "m", 1000) == 1000
    calibration.remember(store, "s1", "p", "m", reported=1200, estimate=1000)
    assert calibration.calibrated(store, "s1", "p", "m", 1500) == 1200 + 600  # whole ratio 1.2
    calibration.remember(store, "s1", "p", "m", reported=2200, estimate=1500)
    assert calibration.calibrated(store, "s1", "p", "m", 1600) == 2200 + 200  # growth ratio 2
    assert calibration.calibrated(store, "s1", "p", "m", 500) == round(500 * 2200 / 1500)
    assert calibration.calibrated(store, "s1", "p", "other-model", 1600) == 1600
    calibration.remember(store, None, "p", "m", reported=10, estimate=10)
    assert calibration.calibrated(store, None, "p", "m", 1600) == 1600


def test_side_requests_keep_their_own_calibration() -> None:
    """Claude Code's billing header changes per request and is left out; another system
    prompt (a title or compaction request) is another conversation."""
    from claude_proxy.routing.calibration import thread

    def system(header: str, prompt: str) -> dict[str, Any]:
        return {"system": [{"type": "text", "text": f"x-anthropic-billing-header: {header};"},
                           {"type": "text", "text": prompt}]}

    main = thread(system("cch=1", "You are Claude Code."))
    assert thread(system("cch=2", "You are Claude Code.")) == main
    assert thread(system("cch=1", "Summarize the conversation.")) != main
    assert thread({"system": "You are Claude Code."}) == main
