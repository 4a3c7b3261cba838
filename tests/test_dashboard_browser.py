"""The dashboard as a person sees it: Debian's chromium, headless, driven by Playwright.

Real traffic first — the anthropic SDK streaming reasoning and a tool call, an upstream 429 that
is retried, a request the upstream refuses, and a Claude Code tool loop — then the page: its
rows, its charts, the inspector of the reasoning request, a request that appears while the page
is open, one in flight. Screenshots go to .cache/screenshots/ (not committed); with
DASHBOARD_README_SHOT=1 the light-theme one is also written to docs/dashboard.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion, error_reply
from tests.test_claude_code import CLAUDE_BIN, SECRET, bash_loop_responder, run_claude

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / ".cache" / "screenshots"
README_SHOT = ROOT / "docs" / "dashboard.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) and not os.environ.get("CI"),
                       reason="chromium not installed (make test installs it)"),
]

REASONING = ["The user wants the weather in Paris. ", "I should call get_weather."]
WEATHER_TOOL = {"name": "get_weather", "description": "Current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
REASONING_USAGE = {"prompt_tokens": 1234, "completion_tokens": 56, "total_tokens": 1290,
                   "completion_tokens_details": {"reasoning_tokens": 21},
                   "prompt_tokens_details": {"cached_tokens": 1000}}


@dataclass
class Traffic:
    proxy: ProxyServer
    reasoning_id: str
    reasoning_usage: dict[str, int]
    retried_id: str
    failed_id: str
    claude_code_result: str


def reasoning_tool_reply() -> Reply:
    return Reply(events=[
        chunk({"role": "assistant", "reasoning_content": REASONING[0]}),
        chunk({"reasoning_content": REASONING[1]}),
        chunk({"tool_calls": [{"index": 0, "id": "call_w1", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(None, None, REASONING_USAGE)])


@pytest.fixture(scope="module")
def traffic(proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
            tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    upstream.reset()
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-dashboard-test",
                                 max_retries=0)
    # 1. The SDK, streaming: reasoning, then a tool call.
    upstream.queue(reasoning_tool_reply())
    with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=4096, tools=[WEATHER_TOOL],  # type: ignore[list-item]
            thinking={"type": "enabled", "budget_tokens": 2048},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as stream:
        final = stream.get_final_message()
        reasoning_id = stream.response.headers["request-id"]
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    # 2. An upstream 429, retried by the proxy.
    upstream.queue(error_reply(429, "slow down", {"retry-after": "0"}),
                   completion({"content": "fine after a retry"},
                              usage={"prompt_tokens": 40, "completion_tokens": 5}))
    retried = client.messages.with_raw_response.create(
        model="claude-haiku-4-5", max_tokens=100,
        messages=[{"role": "user", "content": "hello"}])
    assert retried.parse().content[0].text == "fine after a retry"  # type: ignore[union-attr]
    # 3. A request the upstream refuses.
    upstream.queue(error_reply(400, "model_not_found: no such model"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-haiku-4-5", max_tokens=100,
                               messages=[{"role": "user", "content": "hello"}])
    # 4. Claude Code: reasoning, a Bash call, the result, the answer.
    claude_code_result = ""
    if os.access(CLAUDE_BIN, os.X_OK):
        upstream.responder = bash_loop_responder(reasoning=True)
        lines = run_claude(tmp_path_factory.mktemp("claude"), proxy, "run the echo",
                           "--allowedTools", "Bash(echo:*)")
        claude_code_result = lines[-1]["result"]
        upstream.responder = None
    usage = {"input": final.usage.input_tokens, "output": final.usage.output_tokens,
             "reasoning": 21, "cached": final.usage.cache_read_input_tokens or 0}
    return Traffic(proxy, reasoning_id, usage, retried.headers["request-id"],
                   refused.value.response.headers["request-id"], claude_code_result)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


class Page:
    """A dashboard tab at 1280×800 that remembers every console error and page error."""

    def __init__(self, browser: Any, url: str, color_scheme: str = "light") -> None:
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 800},
                                           color_scheme=color_scheme)
        self.page = self.context.new_page()
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(
            message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(url)
        self.page.wait_for_selector('body[data-ready="true"]')

    def cell(self, request_id: str, name: str) -> str:
        return str(self.page.inner_text(f'#requests tr[data-id="{request_id}"] .{name}'))

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()


def test_rows_charts_and_providers_after_real_traffic(traffic: Traffic, browser: Any) -> None:
    tab = Page(browser, f"{traffic.proxy.url}/ui")
    page, rid = tab.page, traffic.reasoning_id
    page.wait_for_selector(f'#requests tr[data-id="{traffic.failed_id}"]')
    # The SDK's reasoning + tool call request.
    assert tab.cell(rid, "c-client") == "claude-sonnet-4-6"
    assert tab.cell(rid, "c-provider-name") == "deepseek"
    assert tab.cell(rid, "c-model") == "deepseek-reasoner"
    assert tab.cell(rid, "c-status") == "200"
    assert tab.cell(rid, "c-stream") == "stream"
    assert tab.cell(rid, "c-stop") == "tool_use"
    usage = traffic.reasoning_usage
    assert (usage["input"], usage["output"], usage["cached"]) == (234, 56, 1000)
    assert [tab.cell(rid, f"c-{kind}") for kind in ("in", "out", "reason", "cached")] == [
        "234", "56", "21", "1,000"]
    # The retried one: 200 after one retry, not streamed, the haiku model.
    retried = traffic.retried_id
    assert tab.cell(retried, "c-client") == "claude-haiku-4-5"
    assert tab.cell(retried, "c-model") == "small-upstream"
    assert tab.cell(retried, "c-status") == "200"
    assert page.inner_text(f'#requests tr[data-id="{retried}"] .retries') == "↻1"
    assert tab.cell(retried, "c-stream") == "json"
    assert [tab.cell(retried, f"c-{kind}") for kind in ("in", "out")] == ["40", "5"]
    # The refused one.
    assert tab.cell(traffic.failed_id, "c-status") == "400"
    assert tab.cell(traffic.failed_id, "c-error") == "invalid_request_error"
    # Claude Code's tool loop: two more sonnet requests, a tool call then the answer.
    if traffic.claude_code_result:
        assert traffic.claude_code_result == "The command printed: hi-from-tool"
        loop = page.eval_on_selector_all(
            "#requests tbody tr", """rows => rows.map(r => [r.dataset.id,
                r.querySelector('.c-client').textContent, r.querySelector('.c-model').textContent,
                r.querySelector('.c-status').textContent, r.querySelector('.c-stop').textContent])
            """)
        claude_code = [row[1:] for row in loop if row[0] not in (
            rid, retried, traffic.failed_id)]
        assert claude_code == [
            ["claude-sonnet-4-6", "deepseek-reasoner", "200", "end_turn"],
            ["claude-sonnet-4-6", "deepseek-reasoner", "200", "tool_use"]]
    # The charts drew points, the providers panel lists the provider.
    for chart in ("chart-requests", "chart-ttfb", "chart-tokens", "chart-errors"):
        page.wait_for_selector(f"#{chart}[data-points]")
        assert int(page.get_attribute(f"#{chart}", "data-points") or 0) > 0, chart
        assert page.locator(f"#{chart} svg circle.pt").count() > 0, chart
    assert "retry" in page.inner_text("#chart-errors .legend")
    assert "invalid_request_error" in page.inner_text("#chart-errors .legend")
    assert "deepseek p50" in page.inner_text("#chart-ttfb .legend")
    provider = page.inner_text('#providers .provider[data-provider="deepseek"]')
    assert "healthy" in provider and "ok of" in provider
    assert "the only worker" in page.inner_text("#scope")
    tab.shot("dashboard-light")
    if os.environ.get("DASHBOARD_README_SHOT"):
        README_SHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(README_SHOT))
    # Filtering by status keeps only the refused request.
    page.select_option("#f-status", "4")
    assert page.eval_on_selector_all("#requests tbody tr", "rows => rows.map(r => r.dataset.id)"
                                     ) == [traffic.failed_id]
    page.select_option("#f-status", "")
    assert tab.errors == []
    tab.close()


def test_inspector_of_the_reasoning_request(traffic: Traffic, browser: Any) -> None:
    tab = Page(browser, f"{traffic.proxy.url}/ui", color_scheme="dark")
    page, rid = tab.page, traffic.reasoning_id
    page.click(f'#requests tr[data-id="{rid}"]')
    page.wait_for_selector("#inspector pre.thinking")
    assert page.url.endswith(f"/ui/requests/{rid}")
    assert page.inner_text("#inspector pre.thinking") == "".join(REASONING)
    # OpenTelemetry is off here: the inspector says so where a trace id would be.
    assert "trace id\n– (OpenTelemetry off)" in page.inner_text("#inspector dl.facts")
    highlighted = page.locator('#inspector table.fields tr.added[data-field="thinking"]')
    assert highlighted.count() == 1
    assert "reasoning field added by the proxy" in highlighted.inner_text()
    assert '{"type":"enabled"}' in highlighted.inner_text()
    calls = page.inner_text("#inspector .tool-call")
    assert "get_weather · call_w1" in calls and '"city": "Paris"' in calls
    timeline = page.inner_text("#inspector .timeline-list")
    for moment in ("received", "upstream request", "first upstream byte",
                   "first client byte", "end"):
        assert moment in timeline
    assert "get_weather" in page.inner_text("#inspector")  # the client's tools, listed
    tab.shot("inspector-dark")
    highlighted.scroll_into_view_if_needed()
    tab.shot("inspector-dark-upstream")
    page.keyboard.press("Escape")
    assert page.is_hidden("#inspector") and page.url.endswith("/ui")
    tab.shot("dashboard-dark")
    assert tab.errors == []
    tab.close()
    # The permalink opens the same view on a fresh page.
    direct = Page(browser, f"{traffic.proxy.url}/ui/requests/{rid}")
    direct.page.wait_for_selector("#inspector pre.thinking")
    assert direct.page.inner_text("#inspector pre.thinking") == "".join(REASONING)
    assert direct.errors == []
    direct.close()


def test_claude_code_loop_shows_the_reasoning_passed_back(traffic: Traffic,
                                                          browser: Any) -> None:
    if not traffic.claude_code_result:
        pytest.skip("Claude Code not installed")
    tab = Page(browser, f"{traffic.proxy.url}/ui")
    page = tab.page
    answer_row = page.locator("#requests tbody tr", has_text="end_turn").first
    answer_row.click()
    page.wait_for_selector("#inspector pre.answer")
    passed = page.locator('#inspector .extra.added[data-field="reasoning_content"]')
    assert passed.count() == 1 and passed.is_hidden()  # collapsed, like every message
    page.click("#inspector details.upstream-messages > summary")
    page.locator("#inspector details.upstream-messages details", has=page.locator(
        '.extra.added[data-field="reasoning_content"]')).locator("summary").click()
    assert passed.is_visible()
    assert "I need to run echo first." in passed.inner_text()
    assert "The command printed: hi-from-tool" in page.inner_text("#inspector pre.answer")
    assert tab.errors == []
    tab.close()


def test_requests_appear_live_without_a_reload(traffic: Traffic, browser: Any,
                                               upstream: ScriptedUpstream) -> None:
    tab = Page(browser, f"{traffic.proxy.url}/ui")
    page = tab.page
    page.evaluate("window.__sameDocument = true")
    # One in flight: the upstream sends some reasoning, then waits.
    upstream.queue(Reply(events=[chunk({"role": "assistant", "reasoning_content": "Hmm, "}),
                                 chunk({"reasoning_content": "let me think."})], stall_at=2))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 512, "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 256},
            "messages": [{"role": "user", "content": "think slowly"}]}
    with httpx.Client(base_url=traffic.proxy.url, timeout=30) as client, client.stream(
            "POST", "/v1/messages", json=body,
            headers={"anthropic-version": "2023-06-01"}) as held:
        held_id = held.headers["request-id"]
        flight = page.wait_for_selector(f'#now .flight[data-id="{held_id}"]')
        page.wait_for_selector(f'#now .flight[data-id="{held_id}"] .phase.thinking')
        assert "deepseek · deepseek-reasoner" in flight.inner_text()
        tab.shot("dashboard-in-flight")
    # A whole streamed request while the page is open.
    upstream.queue(Reply(events=[chunk({"role": "assistant", "content": "live "}),
                                 chunk({"content": "row"}), chunk({}, "stop"),
                                 chunk(None, None, {"prompt_tokens": 77,
                                                    "completion_tokens": 3})]))
    client = anthropic.Anthropic(base_url=traffic.proxy.url, api_key="sk-x", max_retries=0)
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=100,
                                messages=[{"role": "user", "content": "live?"}]) as stream:
        assert stream.get_final_message().content[0].text == "live row"  # type: ignore[union-attr]
        live_id = stream.response.headers["request-id"]
    page.wait_for_selector(f'#requests tr[data-id="{live_id}"]')
    assert tab.cell(live_id, "c-in") == "77" and tab.cell(live_id, "c-out") == "3"
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    page.wait_for_selector(f'#now .flight[data-id="{held_id}"]', state="detached")
    assert tab.errors == []
    tab.close()


def test_login_form_in_the_browser(proxy_factory: Callable[..., ProxyServer],
                                   browser: Any) -> None:
    from tests.conftest import CLIENT_KEY
    proxy = proxy_factory(anthropic_api_key=CLIENT_KEY)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    first = page.goto(f"{proxy.url}/ui")
    assert first is not None and first.status == 401
    page.fill('input[name="key"]', "wrong-key")
    page.click('button[type="submit"]')
    assert "That is not the key." in page.inner_text("body")
    page.fill('input[name="key"]', CLIENT_KEY)
    page.click('button[type="submit"]')
    page.wait_for_selector('body[data-ready="true"]')
    cookies = context.cookies()
    assert [c["name"] for c in cookies] == ["claude_proxy_ui"]
    assert cookies[0]["httpOnly"] is True and cookies[0]["sameSite"] == "Strict"
    assert CLIENT_KEY not in cookies[0]["value"]
    assert CLIENT_KEY not in page.content()
    assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it
    context.close()


@pytest.fixture
def two_providers(tmp_path: Path) -> Iterator[tuple[ProxyServer, dict[str, ScriptedUpstream]]]:
    """A proxy with providers alpha (default route) and beta (fallback); one failure cools
    alpha down."""
    from claude_proxy.config.file import load_config_file
    from claude_proxy.config.settings import Settings
    from claude_proxy.server.app import create_app
    from tests.conftest import UPSTREAM_KEY, RecordingApp, eventually, serving
    from tests.scripted_upstream import bind_loopback, serve_in_thread, stop_server

    upstreams = {name: ScriptedUpstream().start() for name in ("alpha", "beta")}
    tables = "".join(
        f'[providers.{name}]\nopenai_base_url = "{server.base_url}"\n'
        f'openai_api_key = "{UPSTREAM_KEY}"\nprovider = "openai"\nbig_model = "{name}-big"\n'
        f'middle_model = "{name}-middle"\nsmall_model = "{name}-small"\nmax_retries = 0\n\n'
        for name, server in upstreams.items())
    path = tmp_path / "proxy.toml"
    path.write_text(tables + '[router]\ndefault = "alpha,alpha-main"\n'
                    'fallback = ["beta,beta-fallback"]\ncooldown_failures = 1\n'
                    "cooldown_seconds = 600\n")
    settings = Settings(log_file=str(tmp_path / "proxy.log"))
    app = create_app(settings, config=load_config_file(path, settings))
    sock = bind_loopback()
    server, thread = serve_in_thread(RecordingApp(app), sock)
    proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                        thread)
    assert eventually(lambda: serving(proxy.url))
    yield proxy, upstreams
    stop_server(server, thread)
    for upstream_server in upstreams.values():
        upstream_server.stop()


def test_failover_and_cooldown_in_rows_and_providers(
        two_providers: tuple[ProxyServer, dict[str, ScriptedUpstream]], browser: Any) -> None:
    proxy, upstreams = two_providers
    upstreams["alpha"].queue(error_reply(500, "alpha is down"))
    answer = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200
    request_id = answer.headers["request-id"]
    tab = Page(browser, f"{proxy.url}/ui")
    page = tab.page
    page.wait_for_selector(f'#requests tr[data-id="{request_id}"]')
    assert tab.cell(request_id, "c-provider-name") == "beta"
    assert tab.cell(request_id, "c-model") == "beta-fallback"
    assert tab.cell(request_id, "c-route") == "fallback"
    badge = page.locator(f'#requests tr[data-id="{request_id}"] .failover')
    assert badge.get_attribute("title") == "failover: alpha → beta"
    page.wait_for_selector('#providers .provider[data-provider="alpha"] .state.cooling')
    alpha = page.inner_text('#providers .provider[data-provider="alpha"]')
    assert "cooling down until" in alpha and "alpha is down" in alpha
    assert "healthy" in page.inner_text('#providers .provider[data-provider="beta"]')
    assert "failover" in page.inner_text("#chart-errors .legend")
    tab.shot("dashboard-cooling")
    page.click(f'#requests tr[data-id="{request_id}"]')
    page.wait_for_selector("#inspector .timeline-list")
    timeline = page.inner_text("#inspector .timeline-list")
    assert "failover" in timeline and "alpha -> beta" in timeline
    assert "alpha: 500" in timeline
    tab.shot("dashboard-failover")
    assert tab.errors == []
    tab.close()


def test_page_says_which_worker_it_shows(proxy: ProxyServer, browser: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With several workers (claude-proxy --workers 3 sets the variable), the page says it
    shows one of them."""
    monkeypatch.setenv("CLAUDE_PROXY_WORKERS", "3")
    tab = Page(browser, f"{proxy.url}/ui")
    assert tab.page.inner_text("#scope") == (
        f"this worker (pid {os.getpid()}) of 3 — each worker shows only the requests it served")
    assert tab.errors == []
    tab.close()
