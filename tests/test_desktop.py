"""Claude Desktop: `/v1/models` as its third-party gateway mode reads it (tiers, windows),
a replica of its model filter, and `claude-proxy desktop` round-tripping its configuration
in a temporary HOME."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.cli.desktop import PROFILE_ID, library_directory
from tests.conftest import ProxyServer, clean_env, free_port
from tests.scripted_upstream import ScriptedUpstream
from tests.test_launcher import routed_server

GOLDEN = Path(__file__).parent / "data" / "golden"
ODD_KEY = "sk-cp-desktop-0123456789abcdef"

# ------------------------------------------------------------------ /v1/models


def page_of(url: str) -> dict[str, Any]:
    """`GET /v1/models`, with `created_at` (the proxy's start) checked and set aside."""
    page: dict[str, Any] = httpx.get(f"{url}/v1/models", timeout=30).json()
    for entry in page["data"]:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry.pop("created_at"))
    return page


def golden(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


def test_models_carry_tiers_and_windows_with_routes(tmp_path: Path,
                                                    upstream: ScriptedUpstream) -> None:
    with routed_server(tmp_path, upstream) as url:
        page = page_of(url)
    assert page == golden("v1-models-routes.json")


def test_models_carry_tiers_and_windows_without_routes(
        proxy_factory: Callable[..., ProxyServer]) -> None:
    proxy = proxy_factory(context_window=65536, provider_max_output_tokens=8192)
    assert page_of(proxy.url) == golden("v1-models-tiers.json")


VENDOR_TOKENS = re.compile(r"deepseek|gemini|glm|gpt|kimi|qwen|minimax|mistral|llama|openai|"
                           r"moonshot", re.IGNORECASE)
DESKTOP_TIERS = ("sonnet", "opus", "haiku", "fable", "mythos")


def desktop_keeps(entry: dict[str, Any]) -> bool:
    """Claude Desktop's discovery filter as documented (claude.com/docs/cowork/3p/gateway:
    ids "recognizably Claude", or an `anthropic_family_tier`) and as a reimplementation of
    Desktop 1.46388 has it: a vendor token vetoes the name check, which then wants a Claude
    family name; a tier passes either way."""
    model_id = str(entry["id"]).lower()
    claude_like = (not VENDOR_TOKENS.search(model_id)
                   and re.search(r"claude|anthropic|opus|sonnet|haiku", model_id) is not None)
    return claude_like or entry.get("anthropic_family_tier") in DESKTOP_TIERS


@pytest.mark.parametrize("name", ["v1-models-routes.json", "v1-models-tiers.json"])
def test_desktops_filter_keeps_every_route(name: str) -> None:
    entries = golden(name)["data"]
    assert [entry["id"] for entry in entries if desktop_keeps(entry)] == [
        entry["id"] for entry in entries]
    # without the tiers, Desktop would show none of them
    bare = [{k: v for k, v in entry.items() if k != "anthropic_family_tier"}
            for entry in entries]
    assert [entry["id"] for entry in bare if desktop_keeps(entry)] == []
    # exactly one default per tier
    for tier in {entry["anthropic_family_tier"] for entry in entries}:
        assert sum(1 for entry in entries if entry["anthropic_family_tier"] == tier
                   and entry["is_family_default"]) == 1


def test_one_model_answers_as_the_list_does(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    with routed_server(tmp_path, upstream) as url:
        entry = httpx.get(f"{url}/v1/models/route:background", timeout=30).json()
    entry.pop("created_at")
    assert entry == next(e for e in golden("v1-models-routes.json")["data"]
                         if e["id"] == "route:background")


# ------------------------------------------------------------------ claude-proxy desktop


def test_where_desktop_reads_its_configuration(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert library_directory("darwin", {}, home) == (
        home / "Library" / "Application Support" / "Claude-3p" / "configLibrary")
    assert library_directory("win32", {"LOCALAPPDATA": str(tmp_path / "Local")}, home) == (
        tmp_path / "Local" / "Claude-3p" / "configLibrary")
    assert library_directory("linux", {}, home) == home / ".config" / "Claude-3p" / "configLibrary"
    assert library_directory("linux", {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, home) == (
        tmp_path / "xdg" / "Claude-3p" / "configLibrary")


def desktop(tmp_path: Path, env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(tmp_path, HOME=str(tmp_path / "home"))
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run([sys.executable, "-m", "claude_proxy", "desktop", "--env-file",
                           str(env_file), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_desktop_round_trips_its_configuration(tmp_path: Path,
                                               upstream: ScriptedUpstream) -> None:
    port = free_port()
    env_file = tmp_path / ".env.desktop"
    env_file.write_text(f"OPENAI_API_KEY=sk-upstream\nOPENAI_BASE_URL={upstream.base_url}\n"
                        f"PROVIDER=openai\nPORT={port}\nANTHROPIC_API_KEY={ODD_KEY}\n")
    claude_3p = tmp_path / "home" / ".config" / "Claude-3p"
    library = claude_3p / "configLibrary"
    library.mkdir(parents=True)
    theirs = {"appliedId": "11111111-1111-4111-8111-111111111111", "entries": [
        {"id": "11111111-1111-4111-8111-111111111111", "name": "Company gateway"}]}
    (library / "_meta.json").write_text(json.dumps(theirs))
    (library / "11111111-1111-4111-8111-111111111111.json").write_text('{"x": 1}')
    before = snapshot(claude_3p)

    shown = desktop(tmp_path, env_file, "--print")
    assert shown.returncode == 0, shown.stderr
    assert snapshot(claude_3p) == before  # --print writes nothing
    assert ODD_KEY not in shown.stdout and "sk-c… (30 characters)" in shown.stdout

    first = desktop(tmp_path, env_file)
    assert first.returncode == 0, first.stderr
    assert ODD_KEY not in first.stdout + first.stderr
    profile = json.loads((library / f"{PROFILE_ID}.json").read_text())
    assert profile == {
        "inferenceProvider": "gateway",
        "inferenceGatewayBaseUrl": f"http://127.0.0.1:{port}",
        "inferenceGatewayApiKey": ODD_KEY,
        "inferenceGatewayAuthScheme": "bearer",
        "inferenceModels": [
            {"name": "route:big", "anthropicFamilyTier": "opus", "isFamilyDefault": True},
            {"name": "route:middle", "anthropicFamilyTier": "sonnet", "isFamilyDefault": True},
            {"name": "route:small", "anthropicFamilyTier": "haiku", "isFamilyDefault": True}]}
    assert os.stat(library / f"{PROFILE_ID}.json").st_mode & 0o077 == 0
    assert json.loads((library / "_meta.json").read_text()) == {
        "appliedId": PROFILE_ID, "entries": [*theirs["entries"],
                                             {"id": PROFILE_ID, "name": "claude-proxy"}]}
    printed = json.loads(first.stdout[first.stdout.index("{"):first.stdout.rindex("}") + 1])
    assert printed == {**profile, "inferenceGatewayApiKey": "sk-c… (30 characters)"}

    # a second run (another port) rewrites the profile and keeps the first copy as it was
    env_file.write_text(env_file.read_text().replace(f"PORT={port}", "PORT=9999"))
    second = desktop(tmp_path, env_file)
    assert second.returncode == 0, second.stderr
    assert json.loads((library / f"{PROFILE_ID}.json").read_text())[
        "inferenceGatewayBaseUrl"] == "http://127.0.0.1:9999"
    assert len(json.loads((library / "_meta.json").read_text())["entries"]) == 2

    restored = desktop(tmp_path, env_file, "--restore")
    assert restored.returncode == 0, restored.stderr
    assert snapshot(claude_3p) == before
    again = desktop(tmp_path, env_file, "--restore")
    assert again.returncode == 2 and "nothing to restore" in again.stderr


def test_desktop_on_a_fresh_machine_and_back(tmp_path: Path,
                                             upstream: ScriptedUpstream) -> None:
    """No Desktop configuration yet: restoring removes what the command wrote."""
    env_file = tmp_path / ".env.desktop"
    env_file.write_text(f"OPENAI_API_KEY=sk-upstream\nOPENAI_BASE_URL={upstream.base_url}\n"
                        "PROVIDER=openai\n")
    library = tmp_path / "home" / ".config" / "Claude-3p" / "configLibrary"
    assert desktop(tmp_path, env_file).returncode == 0
    profile = json.loads((library / f"{PROFILE_ID}.json").read_text())
    assert profile["inferenceGatewayApiKey"] == "claude-proxy"  # the placeholder: none needed
    assert profile["inferenceGatewayBaseUrl"] == "http://127.0.0.1:8082"
    assert desktop(tmp_path, env_file, "--restore").returncode == 0
    assert snapshot(library.parent) == {}
