"""Reload without restart, through the real server: `claude-proxy --config FILE` (one process,
and `--workers 2`, whose parent passes SIGHUP on), the config file rewritten, SIGHUP.

A new key, a removed key, a changed budget, a changed price, a new provider and a route to it
take effect in every worker; a stream open across the reload finishes, charged at the price it
started with; a file that does not load is refused whole (the old configuration serves on, and
the error is in /health?detail=1, on the dashboard and in the log).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.config.key_specs import digest_of
from tests.conftest import clean_env, eventually
from tests.scripted_upstream import Reply, ScriptedUpstream, completion, text_stream

ADMIN = "sk-reload-admin-0123456789"
KEYS = {name: f"sk-reload-{name}-0123456789" for name in ("ana", "ben", "cy")}
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
FIRST = {"price": 1.0, "ana_budget": 50.0, "keys": ("ana", "ben"), "providers": ("alpha",),
         "route": ""}
SECOND = {"price": 100.0, "ana_budget": 7.0, "keys": ("ana", "cy"),
          "providers": ("alpha", "beta"), "route": 'background = "beta,beta-model"'}

Started = Callable[..., tuple[str, subprocess.Popen[str]]]


def config_text(upstream: ScriptedUpstream, price: float, ana_budget: float,
                keys: tuple[str, ...], providers: tuple[str, ...], route: str) -> str:
    tables = "".join(f'[keys.{name}]\nkey_sha256 = "{digest_of(KEYS[name]).hex()}"\n'
                     + (f"budget_usd = {ana_budget}\n" if name == "ana" else "") + "\n"
                     for name in keys)
    provider_tables = "".join(f"""
[providers.{name}]
openai_base_url = "{upstream.base_url}"
openai_api_key = "sk-reload-upstream-0123456789"
provider = "openai"
big_model = "{name}-model"
middle_model = "{name}-model"
small_model = "{name}-model"
max_retries = 0
price_input = {price}
price_output = {price}
""" for name in providers)
    return f"""{provider_tables}
[router]
default = "alpha,alpha-model"
{route}

{tables}"""


def answer(body: dict[str, Any]) -> Reply:
    if body.get("stream"):
        return text_stream(["served ", body["model"]], usage=USAGE)
    return completion({"content": f"served {body['model']}"}, usage=USAGE)


def ask(url: str, key: str, model: str = "claude-sonnet-4-6",
        session: str = "-") -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", headers={
        "x-api-key": key, "x-claude-code-session-id": session}, timeout=30, json={
        "model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})


def configurations(url: str, attempts: int = 400) -> dict[int, dict[str, Any]]:
    """/health?detail=1's configuration as each worker answers it (by pid), each read on a
    new connection, until two workers have answered (or `attempts` reads)."""
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(attempts):
        detail = httpx.get(f"{url}/health?detail=1", headers={"x-api-key": ADMIN},
                           timeout=10).json()
        pid = int(detail["scope"].split("pid ")[1].split(")")[0])
        seen[pid] = detail["configuration"]
        if len(seen) == 2:
            break
    return seen


def reloaded(url: str, process: subprocess.Popen[str], generation: int, workers: int,
             error: bool = False) -> dict[int, dict[str, Any]]:
    """SIGHUP to the command's process; then, bounded, every worker at `generation` (with a
    refused reload's error when `error`)."""
    os.kill(process.pid, signal.SIGHUP)
    found: dict[int, dict[str, Any]] = {}

    def done() -> bool:
        found.update(configurations(url, attempts=40 if workers > 1 else 1))
        return len(found) == workers and all(
            c["generation"] == generation and bool(c["error"]) == error
            for c in found.values())
    assert eventually(done, timeout=60), found
    return found


@pytest.fixture
def fleet_upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream().start()
    server.responder = answer
    yield server
    server.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_changes_keys_budgets_prices_and_routes_in_every_worker(
        tmp_path: Path, started: Started, fleet_upstream: ScriptedUpstream,
        request: pytest.FixtureRequest, workers: int) -> None:
    """One process keeps spend in its SQLite file; two workers share it through Redis."""
    config = tmp_path / "proxy.toml"
    config.write_text(config_text(fleet_upstream, **FIRST))  # type: ignore[arg-type]
    shared = {}
    if workers > 1:
        redis = request.getfixturevalue("redis_server")
        shared = {"REDIS_URL": redis.url, "REDIS_PREFIX": f"reload-{os.getpid()}:",
                  "REDIS_TIMEOUT": "1"}
    url, process = started("--config", str(config), "--workers", str(workers),
                           env=clean_env(tmp_path, ANTHROPIC_API_KEY=ADMIN,
                                         DATA_DIR=str(tmp_path / "data"), **shared))
    assert ask(url, KEYS["ben"]).status_code == 200
    assert ask(url, KEYS["cy"]).status_code == 401
    # A stream opened on the first configuration, held open by the upstream across the reload.
    held = threading.Event()
    fleet_upstream.queue(Reply(events=text_stream(["held ", "stream"], usage=USAGE).events,
                               held=held))
    fleet_upstream.responder = None
    streamed: list[bytes] = []
    client = threading.Thread(target=lambda: streamed.append(httpx.post(
        f"{url}/v1/messages", timeout=60, headers={"x-api-key": KEYS["ana"],
                                                   "x-claude-code-session-id": "held"},
        json={"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": True,
              "messages": [{"role": "user", "content": "hold"}]}).content))
    client.start()
    assert eventually(lambda: fleet_upstream.open_streams == 1, timeout=30)
    fleet_upstream.responder = answer

    config.write_text(config_text(fleet_upstream, **SECOND))  # type: ignore[arg-type]
    reloaded(url, process, generation=2, workers=workers)
    held.set()
    client.join(timeout=60)
    events = [json.loads(line[6:]) for line in streamed[0].decode().splitlines()
              if line.startswith("data: ")]
    assert events[-1] == {"type": "message_stop"}
    assert "".join(e["delta"].get("text", "") for e in events
                   if e["type"] == "content_block_delta") == "held stream"

    # Every worker: the new key in, the removed one out, the new budget, the new provider's
    # route.
    for _ in range(4 * workers):  # on fresh connections: each worker gets its share
        assert ask(url, KEYS["cy"]).json()["content"][0]["text"] == "served alpha-model"
        assert ask(url, KEYS["ben"]).status_code == 401
        me = httpx.get(f"{url}/v1/usage/me", headers={"x-api-key": KEYS["ana"]}, timeout=10)
        assert me.json()["budget_usd"] == 7.0
        haiku = ask(url, KEYS["ana"], model="claude-haiku-4-5")
        assert haiku.json()["content"][0]["text"] == "served beta-model"
    # The held stream was charged at the price it started with (1 USD per million tokens),
    # a request after the reload at the new one (100).
    sessions = {row["session"]: row for row in httpx.get(
        f"{url}/v1/usage?group_by=session", headers={"x-api-key": ADMIN},
        timeout=10).json()["data"]}
    assert sessions["held"]["cost_usd"] == pytest.approx(1100 * 1.0 / 1e6)
    assert ask(url, KEYS["ana"], session="after").status_code == 200
    sessions = {row["session"]: row for row in httpx.get(
        f"{url}/v1/usage?group_by=session", headers={"x-api-key": ADMIN},
        timeout=10).json()["data"]}
    assert sessions["after"]["cost_usd"] == pytest.approx(1100 * 100.0 / 1e6)

    # A file that does not load is refused whole: the second configuration serves on.
    config.write_text(config_text(fleet_upstream, **FIRST) + "\n[router\n")  # type: ignore
    refused = reloaded(url, process, generation=2, workers=workers, error=True)
    assert all("not valid TOML" in c["error"] for c in refused.values()), refused
    assert ask(url, KEYS["cy"]).status_code == 200 and ask(url, KEYS["ben"]).status_code == 401
    with httpx.stream("GET", f"{url}/ui/feed", headers={"x-api-key": ADMIN},
                      timeout=10) as feed:
        hello = json.loads(next(line for line in feed.iter_lines()
                                if line.startswith("data: "))[6:])
    assert "not valid TOML" in hello["configuration"]["error"]
    assert hello["configuration"]["generation"] == 2
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)

    def output() -> str:
        return process.startup_output + "".join(process.later_output)  # type: ignore

    # Every worker lived through both SIGHUPs (none was started again), and said so.
    assert eventually(lambda: output().count("Finished server process") == workers)
    assert output().count("Started server process") == workers
    assert output().count("configuration 2 loaded (SIGHUP)") == workers
    assert ("keys +cy -ben ~ana; providers +beta; routes changed; windows and prices "
            "changed") in output()
    assert output().count("configuration not reloaded (SIGHUP)") == workers
    # Where budgeted spend is kept, said at start and again by the reload (which may be the
    # one that brings budgets): the SQLite file, or a warning for the test's Redis, which runs
    # without persistence.
    kept = ("keys have budgets: their spend is kept in SQLite file" if workers == 1 else
            "keys have budgets, but Redis at redis://127.0.0.1:")
    assert output().count(kept) == 2 * workers


@pytest.mark.browser
def test_the_dashboard_shows_a_refused_reload(tmp_path: Path, started: Started,
                                              fleet_upstream: ScriptedUpstream) -> None:
    """The page in headless chromium: a banner with the refusal and what is still served
    (the screenshot is .cache/screenshots/dashboard-reload-refused.png)."""
    from tests.test_dashboard_browser import CHROMIUM, SHOTS
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("chromium not installed (make test installs it)")
    from playwright.sync_api import sync_playwright
    config = tmp_path / "proxy.toml"
    config.write_text(config_text(fleet_upstream, **FIRST))  # type: ignore[arg-type]
    url, process = started("--config", str(config), env=clean_env(
        tmp_path, ANTHROPIC_API_KEY=ADMIN, DATA_DIR=str(tmp_path / "data")))
    config.write_text("[providers.alpha]\nopenai_base_url = 42\n")
    reloaded(url, process, generation=1, workers=1, error=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 800},
                                      extra_http_headers={"x-api-key": ADMIN})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{url}/ui")
        page.wait_for_selector("#config-error:not([hidden])")
        banner = page.inner_text("#config-error")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "dashboard-reload-refused.png"))
        browser.close()
    assert banner.startswith("Configuration not reloaded (")
    assert f"{config}: [providers.alpha] openai_base_url: " in banner
    assert banner.endswith(f"still serving configuration 1 from {config}, loaded "
                           f"{banner.rsplit('loaded ', 1)[1]}")
    assert errors == []


def test_watch_config_follows_a_configmap_update(tmp_path: Path, started: Started,
                                                 fleet_upstream: ScriptedUpstream) -> None:
    """A Kubernetes ConfigMap volume: `proxy.toml` is a symlink into `..data`, itself a
    symlink to a dated folder; an update writes a new folder and swaps `..data`. With
    --watch-config the proxy reloads on its own (no SIGHUP)."""
    volume = tmp_path / "configmap"
    volume.mkdir()

    def publish(version: str, settings: dict[str, Any]) -> None:
        folder = volume / f"..{version}"
        folder.mkdir()
        (folder / "proxy.toml").write_text(config_text(fleet_upstream, **settings))
        link = volume / "..data_tmp"
        link.symlink_to(folder.name)
        link.replace(volume / "..data")  # atomic, as the kubelet does it

    publish("2026_11_28_01", FIRST)
    (volume / "proxy.toml").symlink_to("..data/proxy.toml")
    url, _ = started("--config", str(volume / "proxy.toml"), "--watch-config",
                     env=clean_env(tmp_path, ANTHROPIC_API_KEY=ADMIN,
                                   DATA_DIR=str(tmp_path / "data")))
    assert ask(url, KEYS["cy"]).status_code == 401
    publish("2026_11_28_02", SECOND)
    assert eventually(lambda: ask(url, KEYS["cy"]).status_code == 200, timeout=60)
    assert ask(url, KEYS["ben"]).status_code == 401
    detail = httpx.get(f"{url}/health?detail=1", headers={"x-api-key": ADMIN},
                       timeout=10).json()["configuration"]
    assert (detail["generation"], detail["error"]) == (2, None)
    assert detail["reload"] == "SIGHUP, watching the files"
