"""The original design's defaults, per profile: an unknown host thinks without tools only (and
says so in the log), `provider = "kimi"` in a config table thinks with tools as `.env.kimi`
does, and every env file agrees with the profile it names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
from dotenv import dotenv_values

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import PROFILES, Settings, infer_provider
from claude_proxy.server.app import create_app
from tests.conftest import UPSTREAM_KEY, ProxyServer, SuiteRecord, eventually, serving
from tests.scripted_upstream import (
    ScriptedUpstream,
    bind_loopback,
    completion,
    serve_in_thread,
    stop_server,
)

ROOT = Path(__file__).resolve().parents[1]
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}
TOOLS_LOG_LINE = ("thinking turned off: the request has tools and profile generic does not "
                  "think with tools (set REASONING_WITH_TOOLS=true to keep it)")


def _ask_with_tools(url: str, budget: int = 4096) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    return client.messages.create(
        model="claude-sonnet-4-6", max_tokens=16384, tools=[TOOL],  # type: ignore[list-item]
        thinking={"type": "enabled", "budget_tokens": budget},
        messages=[{"role": "user", "content": "Weather in Paris?"}])


def test_unknown_hosts_get_the_generic_profile_and_openai_keeps_its_own() -> None:
    assert infer_provider("http://127.0.0.1:8000/v1") == "generic"
    assert infer_provider("https://llm.example.internal/v1") == "generic"
    assert infer_provider("https://api.openai.com/v1") == "openai"
    assert Settings(openai_base_url="https://api.openai.com/v1").reasons_with_tools is True
    assert Settings(openai_base_url="https://llm.example.internal/v1",
                    provider="openai").reasons_with_tools is True
    generic = Settings(openai_base_url="https://llm.example.internal/v1")
    assert (generic.provider_name, generic.reasons_with_tools) == ("generic", False)
    assert Settings(openai_base_url="https://llm.example.internal/v1",
                    reasoning_with_tools=True).reasons_with_tools is True


def test_the_generic_profile_drops_thinking_with_tools_and_says_so(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """A loopback upstream named by no hint and no PROVIDER: thinking goes off for a request
    with tools (no reasoning field upstream), and the log names the profile and the switch."""
    proxy = proxy_factory(provider=None, reasoning_chat_prefixes=["*"])
    assert proxy.settings.provider_name == "generic"
    log = SuiteRecord.log_file
    assert log is not None
    before = log.stat().st_size
    upstream.queue(completion({"content": "Sunny."}), completion({"content": "Hello."}))
    message = _ask_with_tools(proxy.url)
    assert [block.type for block in message.content] == ["text"]
    assert len(upstream.requests) == 1
    sent = upstream.requests[0]
    assert "reasoning_effort" not in sent and sent["tools"][0]["function"]["name"] == "get_weather"
    with log.open("rb") as handle:
        handle.seek(before)
        written = handle.read().decode()
    assert TOOLS_LOG_LINE in written
    # Without tools the same proxy thinks: the rule is about tools only.
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    client.messages.create(model="claude-sonnet-4-6", max_tokens=4096,
                           thinking={"type": "enabled", "budget_tokens": 4096},
                           messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[1]["reasoning_effort"] == "low"


def test_a_toml_table_with_only_provider_kimi_thinks_with_tools(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """No env_file: the kimi profile's own default keeps thinking on with Claude Code's tools."""
    path = tmp_path / "proxy.toml"
    path.write_text(f'[providers.moon]\nopenai_base_url = "{upstream.base_url}"\n'
                    f'openai_api_key = "{UPSTREAM_KEY}"\nprovider = "kimi"\nmax_retries = 0\n')
    settings = Settings(log_file=str(tmp_path / "proxy.log"))
    app = create_app(settings, config=load_config_file(path, settings, {}))
    sock = bind_loopback()
    server, thread = serve_in_thread(app, sock)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert eventually(lambda: serving(url))
        upstream.queue(completion({"reasoning_content": "Paris: ask the weather tool.",
                                   "content": "Sunny."}))
        message = _ask_with_tools(url, budget=12000)
    finally:
        stop_server(server, thread)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Paris: ask the weather tool."  # type: ignore[union-attr]
    assert upstream.requests == [{
        "model": "kimi-k3",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 16384,
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}],
        "reasoning_effort": "high",  # Kimi K3's scale: a 12000-token budget (off: "low")
    }]


# Env-file variable → the profile field it must equal (the models are examples, free to differ).
PROFILE_KEYS: dict[str, Callable[[Any], object]] = {
    "PROVIDER_MAX_OUTPUT_TOKENS": lambda profile: str(profile.max_output_tokens),
    "REASONING_CHAT_MAX_OUTPUT_TOKENS": lambda profile: str(profile.reasoning_max_output_tokens),
    "REASONING_DIALECT": lambda profile: profile.dialect,
    "REASONING_PASSBACK": lambda profile: profile.passback,
    "REASONING_CHAT_PREFIXES": lambda profile: ",".join(profile.chat_prefixes),
    "REASONING_MODEL_PREFIXES": lambda profile: ",".join(profile.model_prefixes),
    "REASONING_WITH_TOOLS": lambda profile: str(profile.reasoning_with_tools).lower(),
}
ENV_FILES = sorted(path.name for path in ROOT.glob(".env.*") if path.name != ".env.example")


@pytest.mark.parametrize("name", ENV_FILES)
def test_each_env_file_says_what_its_profile_says(name: str) -> None:
    """One source: a table with `provider = "x"` and no env_file behaves as `.env.x`."""
    values = dotenv_values(ROOT / name)
    profile = PROFILES[str(values["PROVIDER"])]
    said = {key: values[key] for key in PROFILE_KEYS if key in values}
    assert said == {key: PROFILE_KEYS[key](profile) for key in said}
    if values.get("UPSTREAM_API") == "messages":
        # The provider's Anthropic endpoint (.env.<profile>-anthropic, .env.kimi-coding-...):
        # no reasoning dialect to configure.
        assert name.startswith(f".env.{profile.name}-") and name.endswith("-anthropic")
        return
    assert name == f".env.{profile.name}"
    assert "REASONING_WITH_TOOLS" in said
