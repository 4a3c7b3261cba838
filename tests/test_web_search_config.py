"""Web search settings: WEB_SEARCH_* and the `[web_search]` table, start-up checks (exit 2
naming the key), the startup line, doctor's backend check, the web_search route, and the
provider shapes read as pure functions."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import WebSearchToolResultBlock

from claude_proxy.cli.command_line import read_config
from claude_proxy.config.file import ConfigurationError
from claude_proxy.config.settings import Settings
from claude_proxy.server.app import create_app
from claude_proxy.websearch.backends import Hit, brave_hits, exa_hits, searxng_hits, tavily_hits
from claude_proxy.websearch.native import native_hits
from claude_proxy.websearch.table import describe
from tests.conftest import UPSTREAM_KEY, clean_env, eventually, serving
from tests.scripted_upstream import (
    ScriptedUpstream,
    bind_loopback,
    completion,
    serve_in_thread,
    stop_server,
)
from tests.search_backend import HITS, SearchBackendServer
from tests.test_web_search import QUERY, SUMMARY, side_query


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "claude_proxy", *args],
                          env=clean_env(tmp_path, **env), capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def provider_table(name: str, url: str, extra: str = "") -> str:
    return (f'[providers.{name}]\nopenai_base_url = "{url}"\nopenai_api_key = '
            f'"{UPSTREAM_KEY}"\nprovider = "openai"\nmax_retries = 0\n'
            f'big_model = "{name}-big"\nmiddle_model = "{name}-middle"\n'
            f'small_model = "{name}-small"\n{extra}\n')


# ---------------------------------------------------------------- start-up checks


@pytest.mark.parametrize(("env", "named"), [
    ({"WEB_SEARCH_BACKEND": "bing"}, "WEB_SEARCH_BACKEND"),
    ({"WEB_SEARCH_BACKEND": "brave"}, "WEB_SEARCH_API_KEY is not set"),
    ({"WEB_SEARCH_BACKEND": "searxng"}, "WEB_SEARCH_URL is not set"),
    ({"WEB_SEARCH_BACKEND": "searxng", "WEB_SEARCH_URL": "localhost:8888"}, "WEB_SEARCH_URL"),
    ({"WEB_SEARCH": "sometimes"}, "WEB_SEARCH")])
def test_cli_exits_2_naming_the_search_key(tmp_path: Path, env: dict[str, str],
                                           named: str) -> None:
    result = run_cli(tmp_path, "doctor", OPENAI_API_KEY="k", **env)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def write_config(tmp_path: Path, upstream: ScriptedUpstream, web_search: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(provider_table("main", upstream.base_url) + web_search)
    return path


def test_the_web_search_table_sets_the_backend(tmp_path: Path, upstream: ScriptedUpstream,
                                               search_backend: SearchBackendServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_KEY_FOR_TEST", "tavily-key-0123456789")
    monkeypatch.setenv("WEB_SEARCH_MAX_RESULTS", "5")
    path = write_config(tmp_path, upstream, (
        f'[web_search]\nbackend = "tavily"\nurl = "{search_backend.url}"\n'
        'api_key = "env:SEARCH_KEY_FOR_TEST"\ntimeout = 3\n'))
    config = read_config(None, str(path))
    settings = config.settings
    assert (settings.web_search_backend, settings.web_search_url,
            settings.web_search_max_results, settings.web_search_timeout) == (
        "tavily", search_backend.url, 5, 3.0)
    assert "tavily-key-0123456789" in config.secrets()  # redacted from the logs
    assert describe(config) == "backend tavily"


@pytest.mark.parametrize(("table", "message"), [
    ('backend = "bing"', "[web_search] backend: Input should be"),
    ('backend = "brave"', "[web_search] api_key is not set: the brave backend needs"),
    ('backend = "tavily"\napi_key = "env:NOT_SET_ANYWHERE"',
     "[web_search] api_key: environment variable NOT_SET_ANYWHERE is not set"),
    ('engine = "searxng"', "[web_search] engine: Extra inputs are not permitted")])
def test_the_web_search_table_errors_name_the_key(tmp_path: Path, upstream: ScriptedUpstream,
                                                  table: str, message: str) -> None:
    path = write_config(tmp_path, upstream, f"[web_search]\n{table}\n")
    with pytest.raises(ConfigurationError) as caught:
        read_config(None, str(path))
    assert f"{path}: {message}" in str(caught.value)
    result = run_cli(tmp_path, "--config", str(path))
    assert result.returncode == 2 and message in result.stderr


def test_startup_line_says_how_search_runs(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(provider_table("glm", upstream.base_url, 'web_search = "native"')
                    + provider_table("ds", upstream.base_url))
    assert describe(read_config(None, str(path))) == (
        "no backend, native on glm, answers `unavailable` on ds (set WEB_SEARCH_BACKEND "
        "to search)")
    path.write_text(path.read_text() + '[web_search]\nbackend = "searxng"\n'
                    'url = "http://127.0.0.1:9/"\n')
    assert describe(read_config(None, str(path))) == "backend searxng, native on glm"


# ---------------------------------------------------------------- doctor


def test_doctor_checks_the_backend(tmp_path: Path, upstream: ScriptedUpstream,
                                   search_backend: SearchBackendServer) -> None:
    upstream.responder = lambda body: completion({"content": "ok"})
    env = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": upstream.base_url,
           "WEB_SEARCH_BACKEND": "searxng", "WEB_SEARCH_URL": search_backend.url}
    result = run_cli(tmp_path, "doctor", **env)
    assert "web search backend searxng\n    search         ok    answered with 3 results" in (
        result.stdout)
    assert search_backend.requests[0].params == {"q": "claude-proxy doctor", "format": "json"}
    search_backend.mode = "json_off"
    result = run_cli(tmp_path, "doctor", **env)
    assert result.returncode == 1
    assert ("search         FAIL  unavailable: searxng answered 403: JSON output is probably "
            "off (add `json` to search.formats in its settings.yml)") in result.stdout


# ---------------------------------------------------------------- routing


@pytest.fixture
def second_upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream().start()
    yield server
    server.stop()


def test_the_web_search_route_writes_the_summary(
        tmp_path: Path, upstream: ScriptedUpstream, second_upstream: ScriptedUpstream,
        search_backend: SearchBackendServer) -> None:
    """With `[router] web_search`, the summary call goes to that route's provider."""
    path = tmp_path / "proxy.toml"
    path.write_text(provider_table("main", upstream.base_url)
                    + provider_table("searcher", second_upstream.base_url)
                    + '[router]\ndefault = "main,main-big"\n'
                      'web_search = "searcher,search-model"\n'
                    + f'[web_search]\nbackend = "searxng"\nurl = "{search_backend.url}"\n')
    config = read_config(None, str(path))
    app = create_app(config.settings, config=config)
    sock = bind_loopback()
    server, thread = serve_in_thread(app, sock)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert eventually(lambda: serving(url))
        second_upstream.queue(completion({"content": SUMMARY}))
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        fields: dict[str, Any] = {k: v for k, v in side_query().items() if k != "stream"}
        message = client.messages.create(**fields)
    finally:
        stop_server(server, thread)
    result = message.content[1]
    assert isinstance(result, WebSearchToolResultBlock) and isinstance(result.content, list)
    assert [item.url for item in result.content] == [hit.url for hit in HITS]
    assert message.content[2].text == SUMMARY  # type: ignore[union-attr]
    assert upstream.requests == []
    assert [r["model"] for r in second_upstream.requests] == ["search-model"]
    assert [s.query for s in search_backend.requests] == [QUERY]


def test_newer_tool_versions_are_search_requests(
        proxy: Any, upstream: ScriptedUpstream) -> None:
    body = side_query(stream=False)
    body["tools"][0]["type"] = "web_search_20260209"
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    message = client.messages.create(**{k: v for k, v in body.items() if k != "stream"})
    assert [b.type for b in message.content] == ["server_tool_use", "web_search_tool_result"]
    assert upstream.requests == []


# ---------------------------------------------------------------- shapes as pure functions


def test_backend_shapes_read_their_fields() -> None:
    assert searxng_hits({"results": [{"url": "u", "title": "t", "content": "c",
                                      "pubdate": "2026"}, "junk"]}) == [Hit("u", "t", "c",
                                                                              "2026")]
    assert brave_hits({"web": {"results": [{"url": "u", "title": "t", "description": "d",
                                            "extra_snippets": ["e1", "e2"],
                                            "age": "3 days"}]}}) == [
        Hit("u", "t", "d e1 e2", "3 days")]
    assert tavily_hits({"results": [{"url": "u", "title": "t", "content": "c",
                                     "published_date": None}]}) == [Hit("u", "t", "c")]
    assert exa_hits({"results": [{"url": "u", "title": "t", "text": "long text",
                                  "highlights": ["h1", "h2"]}]}) == [Hit("u", "t", "h1 h2")]
    assert searxng_hits({"results": None}) == [] and brave_hits({}) == []


def test_native_shapes_read_their_sources() -> None:
    perplexity = {"choices": [{"message": {"content": "x [1]"}}],
                  "citations": ["https://a.example/"],
                  "search_results": [{"title": "A", "url": "https://a.example/",
                                      "date": "2026-01-02", "snippet": "s"}]}
    assert native_hits(perplexity) == [Hit("https://a.example/", "A", "s", "2026-01-02")]
    citations_only = {"choices": [{"message": {"content": "x"}}],
                      "citations": ["https://b.example/", "https://b.example/"]}
    assert native_hits(citations_only) == [Hit("https://b.example/", "https://b.example/")]
    assert native_hits({"choices": []}) == []


def test_settings_default_to_no_backend() -> None:
    settings = Settings(openai_api_key="k")
    assert settings.web_search_backend is None and settings.web_search is None
    assert settings.web_search_max_results == 8 and settings.web_search_timeout == 15
