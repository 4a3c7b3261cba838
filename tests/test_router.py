"""The router, the circuit breaker and the config file, as pure functions: no server, no loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from claude_proxy.config.file import ConfigurationError, RouterSettings, load_config_file
from claude_proxy.config.settings import ProviderSettings, Settings
from claude_proxy.errors import ProxyError
from claude_proxy.routing.health import CircuitBreaker
from claude_proxy.routing.router import Candidate, Router
from tests.conftest import load_fixture

PROVIDERS = {
    "kimi": ProviderSettings(openai_api_key="k", provider="kimi"),
    "glm": ProviderSettings(openai_api_key="k", provider="glm"),
    "openrouter": ProviderSettings(openai_api_key="k", provider="openrouter"),
}
ROUTER = RouterSettings(
    default="kimi,kimi-k2.6", background="glm,glm-4.7-flash", think="openrouter,o/think",
    long_context=["glm,glm-long", "openrouter,o/long"], image="openrouter,o/vision",
    web_search="glm,glm-search", long_context_threshold=1000,
    fallback=["openrouter,o/fallback", "glm,glm-5"])


def routed(body: dict[str, Any], estimate: int = 10, previous: int | None = None,
           router: RouterSettings | None = ROUTER) -> list[tuple[str, str, str]]:
    found = Router(PROVIDERS, router).candidates(body, estimate, previous)
    return [(c.provider, c.model, c.route) for c in found]


def request(model: str = "claude-sonnet-4-6", content: Any = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 100,
            "messages": [{"role": "user", "content": content}], **fields}


FALLBACKS = [("openrouter", "o/fallback", "fallback"), ("glm", "glm-5", "fallback")]
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}


def test_default_route_then_the_fallback_list() -> None:
    assert routed(request()) == [("kimi", "kimi-k2.6", "default"), *FALLBACKS]


def test_explicit_provider_and_model_wins_and_keeps_the_model_verbatim() -> None:
    body = request("openrouter,anthropic/claude-sonnet-4.5", content=[PNG], thinking={
        "type": "adaptive"}, output_config={"effort": "max"})
    assert routed(body)[0] == ("openrouter", "anthropic/claude-sonnet-4.5", "explicit")
    assert routed(request("kimi,qwen3:8b[1m]"))[0] == ("kimi", "qwen3:8b", "explicit")
    assert routed(request("glm/glm-4.6"))[0] == ("glm", "glm-4.6", "explicit")
    # A slash counts only after a configured provider name: OpenRouter ids stay model names.
    assert routed(request("anthropic/claude-sonnet-4.5"))[0] == ("kimi", "kimi-k2.6",
                                                                 "default")


def test_an_unknown_provider_is_a_400_that_lists_the_configured_ones() -> None:
    with pytest.raises(ProxyError) as caught:
        routed(request("nope,some-model"))
    assert caught.value.status == 400
    assert "'nope'" in caught.value.message
    assert "kimi, glm, openrouter" in caught.value.message


def test_image_only_in_the_last_user_turn_picks_the_image_route() -> None:
    assert routed(request(content=[PNG, {"type": "text", "text": "what is this?"}]))[0][2] == (
        "image")
    in_tool_result = [{"type": "tool_result", "tool_use_id": "t1", "content": [PNG]}]
    assert routed(request(content=in_tool_result))[0][2] == "image"
    older = request()
    older["messages"] = [{"role": "user", "content": [PNG]},
                         {"role": "assistant", "content": "a cat"},
                         {"role": "user", "content": "thanks"}]
    assert routed(older)[0][2] == "default"


def test_long_context_by_estimate_or_by_the_session_previous_turn() -> None:
    assert routed(request(), estimate=1001)[:2] == [("glm", "glm-long", "long_context"),
                                                     ("openrouter", "o/long", "long_context")]
    assert routed(request(), estimate=1000)[0][2] == "default"
    assert routed(request(), estimate=10, previous=5000)[0][2] == "long_context"


def test_web_search_think_and_background_rules() -> None:
    search = request(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert routed(search)[0] == ("glm", "glm-search", "web_search")
    for effort in ("xhigh", "max"):
        hard = request(thinking={"type": "adaptive"}, output_config={"effort": effort})
        assert routed(hard)[0] == ("openrouter", "o/think", "think")
    assert routed(request(content="ultrathink about this"))[0][2] == "think"
    assert routed(request("claude-haiku-4-5-20251001"))[0] == ("glm", "glm-4.7-flash",
                                                               "background")


def test_claude_code_default_thinking_does_not_route_to_think() -> None:
    """Claude Code sends adaptive + high (or a 31999 budget) on nearly every request."""
    fixture = load_fixture("claude-code-2.1.328-first-request.json")
    body = fixture.get("body", fixture)
    assert body["thinking"]["type"] == "adaptive"
    assert routed(body, estimate=10)[0][2] == "default"
    budget = request(thinking={"type": "enabled", "budget_tokens": 31999})
    assert routed(budget)[0][2] == "default"
    high = request(thinking={"type": "adaptive"}, output_config={"effort": "high"})
    assert routed(high)[0][2] == "default"


def test_without_a_router_the_tier_mapping_of_the_first_provider() -> None:
    providers = {"one": ProviderSettings(openai_api_key="k", big_model="b", small_model="s")}
    router = Router(providers, None)
    assert router.candidates(request("claude-opus-4-7[1m]"), 10) == [
        Candidate("one", "b", "default")]
    assert router.candidates(request("claude-haiku-4-5"), 10) == [
        Candidate("one", "s", "default")]
    assert router.candidates(request("gpt-4o"), 10) == [Candidate("one", "gpt-4o", "default")]


@pytest.mark.parametrize(("model", "without_router", "with_router"), [
    ("opus", "b", ("kimi", "kimi-k2.6", "default")),
    ("opus[1m]", "b", ("kimi", "kimi-k2.6", "default")),
    ("sonnet", "m", ("kimi", "kimi-k2.6", "default")),
    ("sonnet[1m]", "m", ("kimi", "kimi-k2.6", "default")),
    ("haiku", "s", ("glm", "glm-4.7-flash", "background")),
    ("claude-opus-4-5", "b", ("kimi", "kimi-k2.6", "default")),
    ("claude-opus-4-5-20251101", "b", ("kimi", "kimi-k2.6", "default")),
    ("claude-opus-5-5[1m]", "b", ("kimi", "kimi-k2.6", "default")),
    ("claude-sonnet-4-5-20250929", "m", ("kimi", "kimi-k2.6", "default")),
    ("claude-haiku-4-5-20251001", "s", ("glm", "glm-4.7-flash", "background")),
    ("claude-fable-5-2", "b", ("kimi", "kimi-k2.6", "default")),
    ("claude-mythos-5", "b", ("kimi", "kimi-k2.6", "default")),
    ("us.anthropic.claude-opus-4-6-v1:0", "b", ("kimi", "kimi-k2.6", "default")),
])
def test_claude_aliases_canonical_and_dated_ids_resolve_to_their_tiers(
        model: str, without_router: str, with_router: tuple[str, str, str]) -> None:
    """What Claude Code and Claude Desktop send (an alias, a canonical or dated id, the
    canonical opus id it re-asks under after a refusal) never reaches an upstream as is."""
    providers = {"one": ProviderSettings(openai_api_key="k", big_model="b", middle_model="m",
                                         small_model="s")}
    assert Router(providers, None).candidates(request(model), 10) == [
        Candidate("one", without_router, "default")]
    assert routed(request(model))[0] == with_router


def test_candidates_are_not_repeated() -> None:
    router = RouterSettings(default=["glm,glm-5", "kimi,k"], fallback=["kimi,k", "glm,glm-5"])
    assert routed(request(), router=router) == [("glm", "glm-5", "default"),
                                                ("kimi", "k", "default")]


# ---------------------------------------------------------------- the circuit breaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_n_failures_then_lets_one_probe_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown=30, clock=clock)
    for _ in range(2):
        assert breaker.acquire()
        breaker.record_failure("500")
    assert breaker.acquire() and not breaker.is_cooling()
    breaker.record_failure("500")
    assert breaker.is_cooling() and not breaker.acquire()
    clock.now += 29.9
    assert not breaker.acquire()
    clock.now += 0.2
    assert breaker.acquire()          # the probe
    assert not breaker.acquire()      # nobody else while it runs
    breaker.record_success()
    assert breaker.acquire() and breaker.snapshot().state == "healthy"


def test_a_failed_probe_doubles_the_cooldown_up_to_300s_and_respects_retry_after() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown=100, clock=clock)
    breaker.record_failure("429", retry_after=150)
    assert breaker.reopens_at() == clock.now + 150
    for expected in (200, 300, 300):
        clock.now = breaker.reopens_at()
        assert breaker.acquire()
        breaker.record_failure("500")
        assert breaker.reopens_at() - clock.now == expected


def test_credential_failures_do_not_open_the_breaker() -> None:
    breaker = CircuitBreaker(failures=1, cooldown=30, clock=Clock())
    breaker.record_misconfigured("401 invalid key")
    snapshot = breaker.snapshot()
    assert breaker.acquire() and snapshot.misconfigured and snapshot.state == "healthy"
    assert snapshot.last_error == "401 invalid key"


def test_a_probe_that_ends_in_neither_is_released() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown=10, clock=clock)
    breaker.record_failure("500")
    clock.now += 11
    assert breaker.acquire()
    breaker.release()
    assert breaker.acquire()


# ---------------------------------------------------------------- the config file


def write(tmp_path: Path, text: str, name: str = "proxy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(path: Path, **environ: str) -> Any:
    return load_config_file(path, Settings(), environ)


def test_a_config_file_with_env_files_env_secrets_and_routes(tmp_path: Path) -> None:
    write(tmp_path, "OPENAI_API_KEY=sk-from-file\nOPENAI_BASE_URL=https://api.moonshot.ai/v1\n"
          "PROVIDER=kimi\nPORT=9999\nTOOL_GROUPS_DISABLED_KIMI=tasking\n", ".env.kimi")
    path = write(tmp_path, """
[providers.kimi]
env_file = ".env.kimi"
big_model = "kimi-big"

[providers.ds]
openai_base_url = "https://api.deepseek.com/v1"
openai_api_key = "env:DS_KEY"
reasoning_chat_prefixes = "deepseek-"
vision = false

[router]
default = "kimi,kimi-k2.6"
long_context = ["ds,deepseek-chat", "kimi,kimi-k2.6"]
fallback = ["ds,deepseek-chat"]
cooldown_seconds = 5
""")
    config = load(path, DS_KEY="sk-ds")
    kimi, ds = config.providers["kimi"], config.providers["ds"]
    assert list(config.providers) == ["kimi", "ds"]
    assert kimi.openai_api_key.get_secret_value() == "sk-from-file"
    assert kimi.big_model == "kimi-big" and kimi.provider_name == "kimi"
    assert kimi.tool_groups_disabled == {"KIMI": ("tasking",)}
    assert ds.openai_api_key.get_secret_value() == "sk-ds" and ds.provider_name == "deepseek"
    assert ds.chat_prefixes == ("deepseek-",) and ds.vision is False
    assert config.router.long_context == ["ds,deepseek-chat", "kimi,kimi-k2.6"]
    assert config.router.cooldown_seconds == 5
    assert set(config.secrets()) >= {"sk-from-file", "sk-ds"}


@pytest.mark.parametrize(("text", "environ", "expected"), [
    ("[providers.a]\nopenai_api_key='k'\n[router]\ndefault='b,m'\n", {},
     "[router] default: unknown provider 'b' (configured: a)"),
    ("[providers.a]\nopenai_base_url='https://api.deepseek.com/v1'\n", {},
     "[providers.a] openai_api_key: not set, and profile 'deepseek' needs a key"),
    ("[providers.a]\nopenai_api_key='env:MISSING_KEY'\n", {},
     "[providers.a] openai_api_key: environment variable MISSING_KEY is not set"),
    ("[providers.a\nopenai_api_key='k'\n", {}, "not valid TOML"),
    ("[providers.a]\nopenai_api_key='k'\nbig_modle='x'\n", {},
     "[providers.a] big_modle: Extra inputs are not permitted"),
    ("[providers.a]\nopenai_api_key='k'\n[router]\ndefault='a'\n", {},
     "[router] default: 'a' is not \"PROVIDER,MODEL\""),
    ("[providers.a]\nopenai_api_key='k'\nenv_file='.env.none'\n", {}, "env_file:"),
])
def test_config_file_errors_name_the_file_the_key_and_the_reason(
        tmp_path: Path, text: str, environ: dict[str, str], expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError) as caught:
        load(path, **environ)
    assert str(path) in str(caught.value) and expected in str(caught.value)


def test_the_example_config_in_the_repo_loads(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    config = load(root / "claude-proxy.example.toml", KIMI_API_KEY="a", DEEPSEEK_API_KEY="b",
                  OPENROUTER_API_KEY="c")
    assert list(config.providers) == ["kimi", "deepseek", "openrouter"]
    assert config.providers["kimi"].provider_name == "kimi"
    assert config.providers["kimi"].max_retries == 1  # small by default in a config file
    assert all(config.router.route(name) for name in
               ("default", "background", "think", "long_context", "image", "web_search",
                "subagent"))
