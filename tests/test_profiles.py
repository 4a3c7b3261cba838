"""The provider env files: each loads, and sets the dialect, passback and limits its provider
needs (checked against the wire reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from claude_proxy.config.settings import load_settings, matches_prefix

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {
    # file: (provider, dialect, passback, a model that must get reasoning fields)
    ".env.kimi": ("kimi", "thinking", "reasoning_content", "kimi-k2.6"),
    ".env.glm": ("glm", "thinking", "reasoning_content", "glm-4.7-flash"),
    ".env.deepseek": ("deepseek", "thinking", "reasoning_content", "deepseek-chat"),
    ".env.dashscope": ("dashscope", "enable_thinking", "none", "qwen3-max"),
    ".env.openrouter": ("openrouter", "openrouter", "none", "moonshotai/kimi-k2.5"),
    ".env.vllm": ("vllm", "chat_template_kwargs", "reasoning", "Qwen/Qwen3-32B"),
    ".env.llamacpp": ("llamacpp", "chat_template_kwargs", "reasoning_content", "default"),
    ".env.ollama": ("ollama", "reasoning_effort", "reasoning", "qwen3:8b"),
    ".env.azure": ("azure", "reasoning_effort", "none", "gpt-5-mini"),
    ".env.openai": ("openai", "reasoning_effort", "none", "gpt-5"),
    ".env.minimax": ("minimax", "minimax", "reasoning_details", "MiniMax-M3"),
    ".env.gemini": ("gemini", "gemini", "none", "gemini-3.8-flash"),
}


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "REASONING_", "PROVIDER", "AZURE_", "BIG_", "MIDDLE_",
                            "SMALL_", "THINK")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_file(name: str) -> None:
    provider, dialect, passback, model = EXPECTED[name]
    settings = load_settings(ROOT / name)
    assert (settings.provider_name, settings.dialect, settings.passback) == (
        provider, dialect, passback)
    assert matches_prefix(model, settings.chat_prefixes + settings.model_prefixes)
    assert settings.reasoning_with_tools is True
    assert settings.max_output_tokens <= 32768
    assert settings.openai_base_url.startswith(("https://", "http://127.0.0.1"))


@pytest.mark.parametrize("name", [*sorted(EXPECTED), ".env.example"])
def test_env_files_work_with_docker_env_file(name: str) -> None:
    """`docker run --env-file` takes every character after `=`: no inline comments, no quotes."""
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key.isupper() and " #" not in value and not value.startswith(('"', "'"))


def test_example_loads_as_is() -> None:
    settings = load_settings(ROOT / ".env.example")
    assert settings.provider_name == "openai" and settings.port == 8082


@pytest.mark.parametrize(("url", "provider"), [
    ("https://api.minimax.io/v1", "minimax"),
    ("https://api.minimaxi.com/v1", "minimax"),
    ("https://generativelanguage.googleapis.com/v1beta/openai", "gemini"),
    ("https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/"
     "endpoints/openapi", "gemini"),
    ("https://api.z.ai/api/coding/paas/v4", "glm"),
])
def test_new_hosts_pick_their_profile(url: str, provider: str) -> None:
    from claude_proxy.config.settings import infer_provider
    assert infer_provider(url) == provider
