"""Several providers through one proxy: three scripted upstreams on loopback, each recording
what it received, and a proxy built from a real config file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app
from tests.conftest import (
    UPSTREAM_KEY,
    ProxyServer,
    RecordingApp,
    clean_env,
    eventually,
    serving,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    chunk,
    completion,
    error_reply,
    serve_in_thread,
    stop_server,
    text_stream,
)

NAMES = ("alpha", "beta", "gamma")
ROUTER = """
[router]
default = "alpha,alpha-main"
background = "beta,beta-small"
think = "gamma,gamma-think"
long_context = "gamma,gamma-long"
image = "beta,beta-vision"
long_context_threshold = 2000
fallback = ["beta,beta-fallback"]
cooldown_failures = 2
cooldown_seconds = 30
"""


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, ScriptedUpstream]]:
    servers = {name: ScriptedUpstream().start() for name in NAMES}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(autouse=True)
def _fresh(upstreams: dict[str, ScriptedUpstream]) -> None:
    for server in upstreams.values():
        server.reset()


class Clock:
    now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def routed_proxy(tmp_path: Path, upstreams: dict[str, ScriptedUpstream]
                 ) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def start(router: str = ROUTER, urls: dict[str, str] | None = None,
              extra: str = "", connect_timeout: float = 10) -> ProxyServer:
        urls = urls or {name: server.base_url for name, server in upstreams.items()}
        tables = "".join(
            f'[providers.{name}]\nopenai_base_url = "{url}"\nopenai_api_key = "{UPSTREAM_KEY}"'
            f"\nprovider = \"openai\"\nbig_model = \"{name}-big\"\nmiddle_model = "
            f"\"{name}-middle\"\nsmall_model = \"{name}-small\"\nretry_base_delay = 0\n"
            f"max_retries = 0\nconnect_timeout = {connect_timeout}\n"
            + (extra if name == "beta" else "") + "\n"
            for name, url in urls.items())
        path = tmp_path / "proxy.toml"
        path.write_text(tables + router)
        settings = Settings(log_file=str(tmp_path / "proxy.log"))
        config = load_config_file(path, settings)
        app = create_app(settings, config=config)
        sock = bind_loopback()
        server, thread = serve_in_thread(RecordingApp(app), sock)
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server, app,
                            thread)
        started.append(proxy)
        assert eventually(lambda: serving(proxy.url))
        for provider in app.state.wiring.service.providers.values():
            provider.health.clock = Clock()
        return proxy

    yield start
    for proxy in started:
        proxy.server.should_exit = True
        stop_server(proxy.server, proxy.thread)


def post(proxy: ProxyServer, model: str = "claude-sonnet-4-6", stream: bool = False,
         headers: dict[str, str] | None = None, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "max_tokens": 100, "stream": stream,
                            "messages": [{"role": "user", "content": "hi"}], **fields}
    return httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers, timeout=30)


def received(upstreams: dict[str, ScriptedUpstream]) -> dict[str, list[str]]:
    """Which upstream received which models, in order."""
    return {name: [r["model"] for r in server.requests] for name, server in upstreams.items()}


def answer_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return "".join(b["text"] for b in response.json()["content"] if b["type"] == "text")


# ---------------------------------------------------------------- the rules


def test_each_rule_reaches_its_upstream(routed_proxy: Callable[..., ProxyServer],
                                        upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "iVBORw0KGgo="}}
    cases = [
        ({}, "alpha", "alpha-main"),
        ({"model": "claude-haiku-4-5-20251001"}, "beta", "beta-small"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
         "gamma", "gamma-think"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
         "alpha", "alpha-main"),
        ({"messages": [{"role": "user", "content": [png]}]}, "beta", "beta-vision"),
        ({"messages": [{"role": "user", "content": "x " * 9000}]}, "gamma", "gamma-long"),
        ({"model": "gamma,vendor/model:tag"}, "gamma", "vendor/model:tag"),
        ({"model": "beta/beta-direct"}, "beta", "beta-direct"),
    ]
    for fields, provider, model in cases:
        for server in upstreams.values():
            server.reset()
        fields = {"model": "claude-sonnet-4-6", **fields}
        response = post(proxy, **fields)
        assert answer_text(response) == "scripted default"
        assert response.json()["model"] == fields["model"]  # the client's name comes back
        got = received(upstreams)
        assert got[provider] == [model], (fields, got)
        assert sum(len(models) for models in got.values()) == 1


def test_an_unknown_provider_is_refused_with_the_configured_names(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream]) -> None:
    response = post(routed_proxy(), model="delta,some-model")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "'delta'" in error["message"] and "alpha, beta, gamma" in error["message"]
    assert received(upstreams) == {name: [] for name in NAMES}


def test_the_long_context_rule_follows_the_session(routed_proxy: Callable[..., ProxyServer],
                                                   upstreams: dict[str, ScriptedUpstream]
                                                   ) -> None:
    """A small request of a session whose previous turn really used more than the threshold
    stays on the long-context model."""
    proxy = routed_proxy()
    session = {"x-claude-code-session-id": "sess-1"}
    usage = {"prompt_tokens": 5000, "completion_tokens": 3, "total_tokens": 5003}
    upstreams["alpha"].queue(text_stream(["big"], usage=usage))
    assert post(proxy, stream=True, headers=session).status_code == 200
    post(proxy, headers=session)
    post(proxy, headers={"x-claude-code-session-id": "other"})
    assert received(upstreams) == {"alpha": ["alpha-main", "alpha-main"], "beta": [],
                                   "gamma": ["gamma-long"]}


def test_vision_false_providers_get_a_placeholder_for_older_images(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy(extra="vision = false\n")
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": "iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [png, {"type": "text", "text": "see"}]},
                {"role": "assistant", "content": "a cat"},
                {"role": "user", "content": "thanks"}]
    post(proxy, model="beta,beta-text", messages=messages)
    sent = upstreams["beta"].requests[0]["messages"][0]["content"]
    assert sent == "[image omitted: this model does not accept images or documents]\n\nsee"


# ---------------------------------------------------------------- failover


def first_event_error() -> Reply:
    return Reply(events=[{"error": {"message": "overloaded", "code": 503}}])


def closed_port() -> int:
    sock = bind_loopback()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def failing_reply(failure: str, stream: bool) -> Reply:
    if failure == "first_event_error":
        error = {"error": {"message": "overloaded", "code": 503}}
        return Reply(events=[error]) if stream else Reply(body=error)
    status, message = {"500": (500, "boom"), "429": (429, "slow down"),
                       "401": (401, "invalid key")}[failure]
    return error_reply(status, message)


@pytest.mark.parametrize("failure", ["500", "429", "401", "first_event_error"])
@pytest.mark.parametrize("stream", [True, False])
def test_failover_before_the_first_byte(
        failure: str, stream: bool, routed_proxy: Callable[..., ProxyServer],
        upstreams: dict[str, ScriptedUpstream], caplog: pytest.LogCaptureFixture) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(failing_reply(failure, stream))
    response = post(proxy, stream=stream)
    assert response.status_code == 200
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines()
                  if line.startswith("data: ")]
        assert "".join(e["delta"].get("text", "") for e in events
                       if e["type"] == "content_block_delta") == "scripted default"
    else:
        assert answer_text(response) == "scripted default"
    assert received(upstreams) == {"alpha": ["alpha-main"], "beta": ["beta-fallback"],
                                   "gamma": []}
    def access_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "claude_proxy.access"
                and "/v1/messages" in r.getMessage()]

    assert eventually(access_lines)
    line = access_lines()[0]
    assert ("provider=beta route=fallback failover=alpha->beta model=claude-sonnet-4-6->"
            "beta-fallback status=200") in line
    if failure == "401":
        detail = httpx.get(f"{proxy.url}/health?detail=1").json()["providers"]["alpha"]
        assert detail["misconfigured"] is True and detail["state"] == "healthy"


def test_failover_on_connection_refused_and_connect_timeout(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream]) -> None:
    # A listening socket whose accept queue is full: the next connection attempt hangs.
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(full.getsockname())
        fillers.append(filler)
    try:
        for url in (f"http://127.0.0.1:{closed_port()}/v1",
                    f"http://127.0.0.1:{full.getsockname()[1]}/v1"):
            for server in upstreams.values():
                server.reset()
            proxy = routed_proxy(urls={"alpha": url, "beta": upstreams["beta"].base_url},
                                 router='[router]\ndefault = "alpha,a"\nfallback = ["beta,b"]\n',
                                 connect_timeout=0.3)
            assert answer_text(post(proxy)) == "scripted default"
            assert received(upstreams)["beta"] == ["b"]
    finally:
        for sock in (*fillers, full):
            sock.close()


def test_no_failover_after_the_first_byte(routed_proxy: Callable[..., ProxyServer],
                                          upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(Reply(events=[chunk({"role": "assistant", "content": "par"}),
                                           chunk({"content": "tial"})], cut_after=2))
    response = post(proxy, stream=True)
    assert response.status_code == 200
    assert "event: error" in response.text and "partial" in "".join(
        json.loads(line[6:]).get("delta", {}).get("text", "")
        for line in response.text.splitlines() if line.startswith("data: "))
    assert received(upstreams) == {"alpha": ["alpha-main"], "beta": [], "gamma": []}


def test_cooldown_keeps_traffic_away_until_exactly_one_probe(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    alpha = proxy.app.state.wiring.service.providers["alpha"]
    upstreams["alpha"].queue(error_reply(503, "down"), error_reply(503, "down"))
    for _ in range(2):
        assert post(proxy).status_code == 200  # served by beta after alpha failed
    for _ in range(3):
        assert post(proxy).status_code == 200  # alpha is cooling: it receives nothing
    assert received(upstreams)["alpha"] == ["alpha-main"] * 2
    assert received(upstreams)["beta"] == ["beta-fallback"] * 5
    detail = httpx.get(f"{proxy.url}/health?detail=1").json()
    assert detail["providers"]["alpha"]["state"] == "cooling"
    assert "this process only" in detail["scope"]
    alpha.health.clock.now += 31
    upstreams["alpha"].queue(error_reply(503, "still down"))
    assert post(proxy).status_code == 200
    assert received(upstreams)["alpha"] == ["alpha-main"] * 3  # exactly one probe
    assert post(proxy).status_code == 200
    assert received(upstreams)["alpha"] == ["alpha-main"] * 3  # reopened at once
    alpha.health.clock.now += 61  # the doubled cooldown
    assert post(proxy).status_code == 200
    assert received(upstreams)["alpha"] == ["alpha-main"] * 4  # the probe succeeded
    assert post(proxy).status_code == 200
    assert received(upstreams)["alpha"] == ["alpha-main"] * 5
    assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}


def test_when_everything_fails(routed_proxy: Callable[..., ProxyServer],
                               upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(error_reply(500, "a down"), error_reply(500, "a down"))
    upstreams["beta"].queue(error_reply(502, "b down"), error_reply(502, "b down"))
    first = post(proxy)
    assert first.status_code == 529 and first.json()["error"]["type"] == "overloaded_error"
    assert "alpha,alpha-main: 500 a down" in first.json()["error"]["message"]
    second = post(proxy)  # both breakers open now (2 failures each)
    assert second.status_code == 429
    assert second.headers["retry-after"] == "30"
    # Everything cooling: the one that reopens soonest is tried rather than refusing.
    third = post(proxy)
    assert answer_text(third) == "scripted default"
    assert received(upstreams)["alpha"] == ["alpha-main"] * 3


def test_context_overflow_goes_once_to_long_context(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    overflow = "This model's maximum context length is 128000 tokens. However, you requested " \
               "130000 tokens."
    upstreams["alpha"].queue(error_reply(400, overflow))
    assert answer_text(post(proxy)) == "scripted default"
    assert received(upstreams) == {"alpha": ["alpha-main"], "beta": [],
                                   "gamma": ["gamma-long"]}
    for server in upstreams.values():
        server.reset()
    upstreams["alpha"].queue(error_reply(400, overflow))
    upstreams["gamma"].queue(error_reply(400, overflow))
    response = post(proxy)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "prompt is too long: 130000 tokens > " \
                                                  "128000 maximum"
    assert received(upstreams)["beta"] == []  # never the fallback for a 4xx


def test_other_4xx_never_fail_over(routed_proxy: Callable[..., ProxyServer],
                                   upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(error_reply(422, "bad tool schema"))
    response = post(proxy)
    assert response.status_code == 422 and "bad tool schema" in response.text
    assert received(upstreams) == {"alpha": ["alpha-main"], "beta": [], "gamma": []}


def test_a_server_not_set_up_for_the_request_fails_over_without_retry(
        routed_proxy: Callable[..., ProxyServer],
        upstreams: dict[str, ScriptedUpstream]) -> None:
    """llama-server without --jinja (a permanent 500): the next candidate may take tools;
    when none does, the client gets the 400 that says what to change."""
    proxy = routed_proxy()
    upstreams["alpha"].queue(error_reply(500, "tools param requires --jinja flag"))
    assert answer_text(post(proxy)) == "scripted default"
    assert received(upstreams) == {"alpha": ["alpha-main"], "beta": ["beta-fallback"],
                                   "gamma": []}
    alpha = proxy.app.state.wiring.service.providers["alpha"].health.snapshot()
    assert alpha.misconfigured and alpha.state == "healthy"
    upstreams["alpha"].queue(error_reply(500, "tools param requires --jinja flag"))
    upstreams["beta"].queue(error_reply(500, "tools param requires --jinja flag"))
    response = post(proxy)
    assert response.status_code == 400
    assert response.json()["error"]["message"].endswith(
        "To fix: start llama-server with --jinja (tools are rendered by the chat template "
        "only then).")


# ---------------------------------------------------------------- models, metrics, CLI


def test_models_list_through_the_sdk(routed_proxy: Callable[..., ProxyServer]) -> None:
    proxy = routed_proxy()
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused")
    ids = [model.id for model in client.models.list()]
    assert ids == ["route:default", "route:background", "route:think", "route:long_context",
                   "route:image", "alpha,alpha-main", "beta,beta-small", "gamma,gamma-think",
                   "gamma,gamma-long", "beta,beta-vision", "beta,beta-fallback",
                   "alpha,alpha-big", "alpha,alpha-middle", "alpha,alpha-small",
                   "beta,beta-big", "beta,beta-middle",  # beta,beta-small listed once
                   "gamma,gamma-big", "gamma,gamma-middle", "gamma,gamma-small"]
    model = client.models.retrieve("gamma,gamma-long")
    assert model.display_name == "gamma-long (gamma)" and model.type == "model"
    page = httpx.get(f"{proxy.url}/v1/models").json()
    assert page["has_more"] is False and page["first_id"] == "route:default"
    assert page["last_id"] == "gamma,gamma-small"


def test_provider_metrics(routed_proxy: Callable[..., ProxyServer],
                          upstreams: dict[str, ScriptedUpstream]) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(error_reply(500, "boom"))
    post(proxy)
    post(proxy)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert ('claude_proxy_provider_attempts_total{outcome="failed_over",provider="alpha",'
            'route="default"} 1.0') in text
    assert ('claude_proxy_provider_attempts_total{outcome="ok",provider="beta",'
            'route="fallback"} 1.0') in text
    assert ('claude_proxy_provider_attempts_total{outcome="ok",provider="alpha",'
            'route="default"} 1.0') in text


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "claude_proxy", *args],
                          env=clean_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_cli_config_errors_exit_2_naming_file_key_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[providers.a]\nopenai_api_key = 'k'\n[router]\ndefault = 'zzz,m'\n")
    result = run_cli(tmp_path, "--config", str(path))
    assert result.returncode == 2
    assert f"{path}: [router] default: unknown provider 'zzz' (configured: a)" in result.stderr
    result = run_cli(tmp_path, "doctor", CONFIG_FILE=str(tmp_path / "missing.toml"))
    assert result.returncode == 2 and "config file not found" in result.stderr


def test_cli_doctor_checks_every_provider_and_route(
        tmp_path: Path, upstreams: dict[str, ScriptedUpstream]) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        f'[providers.alpha]\nopenai_base_url = "{upstreams["alpha"].base_url}"\n'
        'openai_api_key = "env:ALPHA_KEY"\nbig_model = "a1"\nmiddle_model = "a1"\n'
        'small_model = "a1"\n'
        f'[providers.beta]\nopenai_base_url = "{upstreams["beta"].base_url}"\n'
        'openai_api_key = "k"\nbig_model = "b1"\nmiddle_model = "b1"\nsmall_model = "b1"\n'
        '[router]\ndefault = "alpha,a1"\nbackground = "beta,b2"\n')
    upstreams["beta"].responder = lambda body: (error_reply(404, "no such model b2")
                                                if body["model"] == "b2" else None)
    result = run_cli(tmp_path, "doctor", "--config", str(path), ALPHA_KEY="sk-alpha",
                     OPENAI_API_KEY="stray")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "provider alpha:" in out and "provider beta:" in out
    assert "  a1 (opus, sonnet, haiku, route default)" in out
    assert "  b2 (route background)" in out
    assert "model exists   FAIL  404: no such model b2" in out
    assert "route default      ok    alpha,a1" in out
    assert "route background   FAIL  beta,b2" in out
    assert "sk-alpha" not in out


def test_cli_start_line_lists_providers_and_routes_and_warns_about_stray_variables(
        tmp_path: Path, upstreams: dict[str, ScriptedUpstream]) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        f'[providers.alpha]\nopenai_base_url = "{upstreams["alpha"].base_url}"\n'
        'openai_api_key = "k-alpha-secret-value"\n[router]\ndefault = "alpha,a1"\n'
        'fallback = ["alpha,a2"]\n')
    port = closed_port()
    process = subprocess.Popen([sys.executable, "-m", "claude_proxy", "--config", str(path),
                                "--port", str(port)],
                               env=clean_env(tmp_path, BIG_MODEL="ignored"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
        output = "".join(lines)
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert f"1 providers from {path}: alpha -> {upstreams['alpha'].base_url}" in output
    assert "routes: default=alpha,a1; fallback: alpha,a2" in output
    assert "provider variables in the environment are not used with a config file " \
           "(BIG_MODEL)" in output
    assert "k-alpha-secret-value" not in output


def test_zero_configuration_serves_a_local_ollama(tmp_path: Path) -> None:
    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "qwen3:8b"}, {"id": "llama3"}]})

    ollama = ScriptedUpstream()
    ollama.app.router.routes.insert(0, Route("/v1/models", models, methods=["GET"]))
    ollama.start()
    try:
        result = run_cli(tmp_path, "doctor", OLLAMA_HOST=f"127.0.0.1:{ollama.port}")
        assert "provider ollama: upstream http://127.0.0.1:" in result.stdout
        assert "  qwen3:8b (opus, sonnet, haiku)" in result.stdout
        assert ollama.requests and ollama.requests[0]["model"] == "qwen3:8b"
    finally:
        ollama.stop()
    nothing = run_cli(tmp_path, OLLAMA_HOST=f"127.0.0.1:{closed_port()}")
    assert nothing.returncode == 2
    for way in ("OPENAI_API_KEY", "--env-file", "--config"):
        assert way in nothing.stderr


# ---------------------------------------------------------------- Claude Code


def claude_code_available() -> bool:
    from tests.test_claude_code import CLAUDE_BIN
    return os.access(CLAUDE_BIN, os.X_OK) or bool(os.environ.get("CI"))


# Claude Code's requests are ~20k tokens: above the main router's long-context threshold.
CLAUDE_CODE_ROUTER = '[router]\ndefault = "alpha,alpha-main"\nfallback = ["beta,beta-fallback"]\n'


@pytest.mark.claude_code
@pytest.mark.skipif(not claude_code_available(), reason="Claude Code not installed")
def test_claude_code_model_flag_picks_the_provider(
        tmp_path: Path, routed_proxy: Callable[..., ProxyServer],
        upstreams: dict[str, ScriptedUpstream]) -> None:
    from tests.test_claude_code import run_claude
    proxy = routed_proxy(router=CLAUDE_CODE_ROUTER)
    upstreams["beta"].queue(text_stream(["beta ", "answers"]))
    lines = run_claude(tmp_path, proxy, "hello", "--model", "beta,some-model")
    assert lines[-1]["result"] == "beta answers" and lines[-1]["is_error"] is False
    assert received(upstreams) == {"alpha": [], "beta": ["some-model"], "gamma": []}


@pytest.mark.claude_code
@pytest.mark.skipif(not claude_code_available(), reason="Claude Code not installed")
def test_claude_code_tool_loop_survives_a_failover_mid_session(
        tmp_path: Path, routed_proxy: Callable[..., ProxyServer],
        upstreams: dict[str, ScriptedUpstream]) -> None:
    """alpha answers the first turn with a Bash call, then fails; beta takes the second turn
    (the tool result) and the loop completes."""
    from tests.test_claude_code import TOOL_OUTPUT, bash_loop_responder, blocks, run_claude
    proxy = routed_proxy(router=CLAUDE_CODE_ROUTER)
    loop = bash_loop_responder(reasoning=False)
    upstreams["alpha"].responder = lambda body: (
        error_reply(503, "alpha went down") if body["messages"][-1]["role"] == "tool"
        else loop(body))
    upstreams["beta"].responder = loop
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    assert [t["name"] for t in blocks(lines, "tool_use")] == ["Bash"]
    assert lines[-1]["result"] == f"The command printed: {TOOL_OUTPUT}"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2
    assert received(upstreams) == {"alpha": ["alpha-main", "alpha-main"],
                                   "beta": ["beta-fallback"], "gamma": []}
    tool_message = upstreams["beta"].requests[0]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith(TOOL_OUTPUT)


def test_detail_and_models_need_the_client_key_when_one_is_set(
        proxy_factory: Callable[..., ProxyServer]) -> None:
    from tests.conftest import CLIENT_KEY
    proxy = proxy_factory(anthropic_api_key=CLIENT_KEY)
    for path in ("/health?detail=1", "/v1/models"):
        refused = httpx.get(f"{proxy.url}{path}")
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        allowed = httpx.get(f"{proxy.url}{path}", headers={"x-api-key": CLIENT_KEY})
        assert allowed.status_code == 200
        assert CLIENT_KEY not in allowed.text and UPSTREAM_KEY not in allowed.text
    assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}
    detail = httpx.get(f"{proxy.url}/health?detail=1", headers={"x-api-key": CLIENT_KEY}).json()
    assert list(detail["providers"]) == ["openai"]
    assert detail["providers"]["openai"]["state"] == "healthy"
    models = httpx.get(f"{proxy.url}/v1/models", headers={"x-api-key": CLIENT_KEY}).json()
    assert [m["id"] for m in models["data"]] == [
        "route:big", "route:middle", "route:small", "openai,big-upstream",
        "openai,middle-upstream", "openai,small-upstream"]


def test_an_error_names_the_provider_and_route_that_gave_it(
        routed_proxy: Callable[..., ProxyServer], upstreams: dict[str, ScriptedUpstream],
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = routed_proxy()
    upstreams["alpha"].queue(error_reply(500, "a down"))
    upstreams["beta"].queue(error_reply(400, "bad request for beta"))
    response = post(proxy)
    assert response.status_code == 400

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "claude_proxy.access"
                and "/v1/messages" in r.getMessage()]

    assert eventually(lines)
    assert ("provider=beta route=fallback failover=alpha->beta "
            "model=claude-sonnet-4-6->beta-fallback status=400") in lines()[0]


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("model", ["opus", "opus[1m]", "claude-opus-5-5",
                                   "claude-opus-4-5", "claude-fable-5-2"])
def test_a_claude_id_reaches_the_big_model_and_comes_back_as_sent(
        proxy: ProxyServer, upstream: ScriptedUpstream, model: str) -> None:
    """Claude Code re-asks under the canonical opus id (2.1.332: `claude-opus-5-5`) after a
    refusal; Desktop sends the bare aliases: each resolves to the tier, never sent as is."""
    upstream.queue(completion({"content": "answered"}))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused")
    message = client.messages.create(model=model, max_tokens=50,
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.model == model and message.content[0].type == "text"
    assert message.content[0].text == "answered"
    assert upstream.requests[-1]["model"] == "big-upstream"
