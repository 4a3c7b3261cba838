"""Running it as a service: access log, request ids, metrics, tool groups, CLI, doctor."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.config.settings import Settings, load_settings
from claude_proxy.conversion.request_converter import convert_request
from claude_proxy.conversion.tool_groups import disabled_groups, env_name
from tests.conftest import (
    UPSTREAM_KEY,
    ProxyServer,
    clean_env,
    eventually,
    free_port,
    load_fixture,
)
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    text_stream,
)

USAGE = {"prompt_tokens": 1500, "completion_tokens": 40, "total_tokens": 1540,
         "prompt_tokens_details": {"cached_tokens": 1200},
         "completion_tokens_details": {"reasoning_tokens": 25}}


def post(proxy: ProxyServer, **fields: Any) -> httpx.Response:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 100,
            "messages": [{"role": "user", "content": "hello"}], **fields}
    return httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)


# ---------------------------------------------------------------- access log and request ids


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "claude_proxy.access"]


def test_access_line_per_request(proxy: ProxyServer, upstream: ScriptedUpstream,
                                 caplog: pytest.LogCaptureFixture) -> None:
    upstream.queue(text_stream(["hi"], usage=USAGE))
    with caplog.at_level(logging.INFO, logger="claude_proxy.access"):
        response = post(proxy, stream=True)
        # the line is written once the last byte has gone out
        assert eventually(lambda: access_lines(caplog))
    request_id = response.headers["request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{24}", request_id)
    # The session's proxy is shared: a client of an earlier test may still count tokens.
    lines = [line for line in access_lines(caplog) if "/v1/messages/count_tokens" not in line]
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith(f"request_id={request_id} POST /v1/messages ")
    assert "model=claude-sonnet-4-6->middle-upstream status=200 stream=true" in line
    assert re.search(r"ttfb_ms=\d+\.\d total_ms=\d+\.\d", line)
    assert line.endswith("input=300 output=40 reasoning=25 cached=1200")


def test_request_id_on_errors_and_non_streaming(proxy: ProxyServer,
                                                upstream: ScriptedUpstream,
                                                caplog: pytest.LogCaptureFixture) -> None:
    upstream.queue(completion({"content": "x"}, usage=USAGE))
    with caplog.at_level(logging.INFO, logger="claude_proxy.access"):
        ok = post(proxy)
        assert eventually(lambda: len(access_lines(caplog)) == 1)
        bad = httpx.post(f"{proxy.url}/v1/messages", json={"model": "m"})
        assert eventually(lambda: len(access_lines(caplog)) == 2)
    assert ok.headers["request-id"] != bad.headers["request-id"]
    lines = access_lines(caplog)
    assert "status=200 stream=false" in lines[0] and "output=40" in lines[0]
    assert "status=400" in lines[1] and bad.headers["request-id"] in lines[1]


# ---------------------------------------------------------------- metrics


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = "^" + re.escape(name + (f"{{{labels}}}" if labels else "")) + r" (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"{name}{{{labels}}} not in /metrics"
    return float(match.group(1))


def test_metrics_after_a_few_requests(proxy_factory: Callable[..., ProxyServer],
                                      upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(max_retries=1)
    upstream.queue(text_stream(["a"], usage=USAGE), completion({"content": "b"}, usage=USAGE),
                   error_reply(503, "busy"), text_stream(["c"], usage=USAGE),
                   error_reply(429, "slow down"), error_reply(429, "slow down"))
    assert post(proxy, stream=True).status_code == 200
    assert post(proxy).status_code == 200
    assert post(proxy, stream=True).status_code == 200  # after one retry
    assert post(proxy, stream=True).status_code == 429

    def requests_counted() -> bool:
        text = httpx.get(f"{proxy.url}/metrics").text
        return "claude_proxy_requests_total{" in text and metric(
            text, "claude_proxy_request_duration_seconds_count", 'stream="true"') == 3

    assert eventually(requests_counted)
    scrape = httpx.get(f"{proxy.url}/metrics")
    assert scrape.headers["content-type"].startswith("text/plain")
    text = scrape.text
    assert metric(text, "claude_proxy_requests_total",
                  'model="claude-sonnet-4-6",status="200"') == 3
    assert metric(text, "claude_proxy_requests_total",
                  'model="claude-sonnet-4-6",status="429"') == 1
    assert metric(text, "claude_proxy_tokens_total", 'kind="output"') == 120
    assert metric(text, "claude_proxy_tokens_total", 'kind="reasoning"') == 75
    assert metric(text, "claude_proxy_tokens_total", 'kind="cached"') == 3600
    assert metric(text, "claude_proxy_upstream_retries_total") == 2
    assert metric(text, "claude_proxy_upstream_errors_total", 'type="rate_limit_error"') == 1
    assert metric(text, "claude_proxy_active_streams") == 0
    assert metric(text, "claude_proxy_time_to_first_byte_seconds_count", 'stream="true"') == 3
    assert metric(text, "claude_proxy_request_duration_seconds_count", 'stream="false"') == 1


# ---------------------------------------------------------------- tool groups


def fixture_tools(settings: Settings) -> list[str]:
    body = load_fixture("claude-code-2.1.328-first-request.json")["body"]
    upstream = convert_request(body, settings)
    return [tool["function"]["name"] for tool in upstream.body["tools"]]


def test_tool_groups_on_the_claude_code_request(caplog: pytest.LogCaptureFixture) -> None:
    everything = fixture_tools(Settings(openai_api_key="k", provider="kimi"))
    assert everything == ["Agent", "Bash", "Edit", "ListAgents", "Read", "ReportFindings",
                          "ScheduleWakeup", "Skill", "ToolSearch", "Workflow", "Write"]
    settings = Settings(openai_api_key="k", provider="kimi",
                        tool_groups_disabled={"KIMI": ("tasking", "productivity")})
    with caplog.at_level(logging.INFO, logger="claude_proxy.conversion"):
        assert fixture_tools(settings) == ["Bash", "Edit", "Read", "Write"]
    assert ("TOOL_GROUPS_DISABLED_KIMI (tasking,productivity) removed 7 tools for kimi-k3: "
            "Agent, ListAgents, ReportFindings, ScheduleWakeup, Skill, ToolSearch, Workflow"
            in caplog.text)


def test_most_specific_name_wins_and_groups_extend() -> None:
    disabled = {"KIMI": ("filesystem",), "KIMI_K2": ("tasking",), "KIMI_K2_6": ("search",),
                "GLM": ("tasking",)}
    assert disabled_groups(disabled, "kimi", "kimi-k2.6") == ("KIMI_K2_6", ("search",))
    assert disabled_groups(disabled, "kimi", "kimi-k2.5") == ("KIMI_K2", ("tasking",))
    assert disabled_groups(disabled, "kimi", "moonshot-v1") == ("KIMI", ("filesystem",))
    assert disabled_groups(disabled, "openai", "gpt-4o") is None
    assert env_name("moonshotai/kimi-k2.5") == "MOONSHOTAI_KIMI_K2_5"
    settings = Settings(openai_api_key="k", provider="kimi",
                        tool_groups_disabled={"KIMI_K3": ("mine",)},
                        tool_group_patterns={"MINE": ("Bash", "Wr*")})
    assert fixture_tools(settings) == ["Agent", "Edit", "ListAgents", "Read", "ReportFindings",
                                       "ScheduleWakeup", "Skill", "ToolSearch", "Workflow"]


def test_tool_group_variables_from_env_file_and_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / ".env.groups"
    env_file.write_text("OPENAI_API_KEY=k\nPROVIDER=glm\nTOOL_GROUPS_DISABLED_GLM=tasking\n"
                        "TOOL_GROUP_PLAYWRIGHT_MCP=mcp__browser__*\n")
    monkeypatch.setenv("TOOL_GROUPS_DISABLED_GLM_5", "search,playwright_mcp")
    settings = load_settings(env_file)
    assert settings.tool_groups_disabled == {"GLM": ("tasking",),
                                             "GLM_5": ("search", "playwright_mcp")}
    assert settings.tool_group_patterns == {"PLAYWRIGHT_MCP": ("mcp__browser__*",)}


# ---------------------------------------------------------------- command line


def test_env_name_startup_line_and_log_file(
        tmp_path: Path, upstream: ScriptedUpstream,
        started: Callable[..., tuple[str, subprocess.Popen[str]]]) -> None:
    (tmp_path / ".env.test").write_text(
        f"OPENAI_API_KEY={UPSTREAM_KEY}\nOPENAI_BASE_URL={upstream.base_url}\nPROVIDER=kimi\n"
        "BIG_MODEL=kimi-big\nREASONING_WITH_TOOLS=true\nANTHROPIC_API_KEY=client-secret-xyz\n")
    url, process = started("--env", "test", env=clean_env(tmp_path))
    startup = process.startup_output  # type: ignore[attr-defined]
    assert (f"-> {upstream.base_url} (provider kimi); models opus=kimi-big sonnet=kimi-k3 "
            "haiku=kimi-k3; reasoning: dialect thinking for kimi-k2,kimi-k3, passback "
            "reasoning_content, with tools on; client key required") in startup
    assert httpx.get(f"{url}/health").status_code == 200
    log = (tmp_path / "logs" / "claude-proxy.log").read_text()
    assert "provider kimi" in log
    for secret in (UPSTREAM_KEY, "client-secret-xyz"):
        assert secret not in startup and secret not in log


def test_env_name_that_does_not_exist(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "--env", "nope"],
                            env=clean_env(tmp_path), cwd=tmp_path, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "env file not found: .env.nope" in result.stderr


def test_two_workers_share_the_signature_secret(
        tmp_path: Path, upstream: ScriptedUpstream,
        started: Callable[..., tuple[str, subprocess.Popen[str]]]) -> None:
    """Thinking signed by one worker is verified by the other, so passback works whichever
    worker a request lands on."""
    env = clean_env(tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=upstream.base_url,
                    PROVIDER="deepseek", REASONING_WITH_TOOLS="true")
    url, process = started("--workers", "2", env=env)
    assert "(2 workers)" in process.startup_output  # type: ignore[attr-defined]
    for attempt in range(12):
        upstream.queue(completion({"reasoning_content": f"thought {attempt}",
                                   "content": "answer"}))
        first = httpx.post(f"{url}/v1/messages", timeout=30, json={
            "model": "deepseek-chat", "max_tokens": 50, "thinking": {"type": "adaptive"},
            "messages": [{"role": "user", "content": "q"}]}).json()
        assert first["content"][0]["thinking"] == f"thought {attempt}"
        upstream.queue(completion({"content": "ok"}))
        httpx.post(f"{url}/v1/messages", timeout=30, json={
            "model": "deepseek-chat", "max_tokens": 50, "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "again"}]})
        assert upstream.requests[-1]["messages"][1]["reasoning_content"] == f"thought {attempt}"
    output: list[str] = process.later_output  # type: ignore[attr-defined]

    def access_pids() -> set[str]:
        return {line.split("[")[1].split("]")[0] for line in list(output)
                if "claude_proxy.access" in line}

    assert eventually(lambda: sum("claude_proxy.access" in line for line in list(output)) == 24)
    assert len(access_pids()) == 2, "both workers served requests"


def doctor_responder(body: dict[str, Any]) -> Reply:
    if body.get("tools"):
        return completion({"content": None, "tool_calls": [
            {"id": "call_t", "type": "function", "function": {"name": "get_time",
                                                              "arguments": "{}"}}]},
            finish="tool_calls")
    if body.get("stream"):
        return Reply(events=[chunk({"reasoning_content": "17*23 = 391"}),
                             chunk({"content": "391"}), chunk({}, "stop")])
    return completion({"content": "ok"})


def run_doctor(tmp_path: Path, upstream: ScriptedUpstream,
               **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=upstream.base_url,
                    PROVIDER="glm", BIG_MODEL="glm-4.7", MIDDLE_MODEL="glm-4.7",
                    SMALL_MODEL="glm-4.7-flash", **extra)
    return subprocess.run([sys.executable, "-m", "claude_proxy", "doctor"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_doctor_reports_a_working_setup(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.responder = doctor_responder
    result = run_doctor(tmp_path, upstream)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "  glm-4.7 (opus, sonnet)" in out and "  glm-4.7-flash (haiku)" in out
    for check in ("reachable", "auth", "model exists"):
        assert re.search(rf"{check}\s+ok", out)
    assert ("reasoning      ok    sent {'thinking': {'type': 'enabled'}}; text in "
            "reasoning_content (11 chars)") in out
    assert "tools          ok    accepted; the model called get_time" in out
    assert out.rstrip().endswith("Claude Code will work with this configuration.")
    sent = [r for r in upstream.requests if "17 * 23" in json.dumps(r["messages"])]
    assert sent and all(r["thinking"] == {"type": "enabled"} for r in sent)


def test_doctor_fails_on_a_rejected_key(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.responder = lambda body: error_reply(401, "Invalid API key")
    result = run_doctor(tmp_path, upstream)
    assert result.returncode == 1
    assert "auth           FAIL  401: Invalid API key" in result.stdout
    assert "Claude Code will NOT work yet" in result.stdout


def test_doctor_fails_on_an_unreachable_upstream(tmp_path: Path) -> None:
    env = clean_env(tmp_path, OPENAI_API_KEY="k",
                    OPENAI_BASE_URL=f"http://127.0.0.1:{free_port()}/v1")
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "doctor"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "reachable      FAIL  upstream connection failed (ConnectError)" in result.stdout


def test_fastapi_native_telemetry_is_off_unless_the_environment_configures_opentelemetry(
) -> None:
    """FastAPI's native OpenTelemetry looks up the global providers on every request: off by
    default, as FastAPI sets it when any OTEL_ variable is present."""
    from claude_proxy.server.app import telemetry_option

    assert telemetry_option({"PATH": "/usr/bin"}) == {
        "telemetry": {"tracing": False, "metrics": False, "logs": False}}
    assert telemetry_option({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) == {}
    # The proxy's own telemetry (telemetry/) makes the SERVER span: FastAPI's is then off.
    assert telemetry_option({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
                            own=True) == {
        "telemetry": {"tracing": False, "metrics": False, "logs": False}}
