"""`claude-proxy claude` and `claude-proxy env` with a stand-in `claude` that records what it
was given (tests/launcher_standin.py); the subagent route and the session/agent columns.

Real Claude Code against the launcher is in tests/test_launcher_claude_code.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.cli.launcher import claude_code_environment, shell_lines
from claude_proxy.config.file import RouterSettings, load_config_file
from claude_proxy.config.settings import Settings
from claude_proxy.routing.router import Candidate, Router
from claude_proxy.server.app import create_app
from tests.conftest import (
    UPSTREAM_KEY,
    ProxyServer,
    clean_env,
    eventually,
    free_port,
    serving,
)
from tests.scripted_upstream import ScriptedUpstream, bind_loopback, serve_in_thread, stop_server

STANDIN = Path(__file__).with_name("launcher_standin.py")
ODD_KEY = "sk-ant it's \"odd\" $HOME `x` \\ end"
"""A client key with every character a shell could misread."""
BASH_DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def standin(tmp_path: Path) -> Path:
    """An executable `claude` that runs the stand-in with this interpreter."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "claude"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    script.chmod(0o755)
    return script


def env_file(tmp_path: Path, upstream: ScriptedUpstream, port: int, **extra: str) -> Path:
    path = tmp_path / ".env.launch"
    values = {"OPENAI_API_KEY": UPSTREAM_KEY, "OPENAI_BASE_URL": upstream.base_url,
              "PROVIDER": "openai", "BIG_MODEL": "big-up", "MIDDLE_MODEL": "middle-up",
              "SMALL_MODEL": "small-up", "PORT": str(port), "CONTEXT_WINDOW": "65536",
              "PROVIDER_MAX_OUTPUT_TOKENS": "8192", **extra}
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def launch(tmp_path: Path, *args: str, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """`claude-proxy claude ARGS` with the stand-in; its exit status and what it recorded."""
    dump = tmp_path / "dump.json"
    dump.unlink(missing_ok=True)
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "claude", *args], env=env,
                            cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=120)
    assert dump.exists(), result.stderr
    return result.returncode, json.loads(dump.read_text())


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(tmp_path, CLAUDE_BIN=str(standin(tmp_path)),  # PWD: the stand-in's sh
                     STANDIN_DUMP=str(tmp_path / "dump.json"), PWD=str(tmp_path), **extra)


def changed(after: dict[str, str], before: dict[str, str]) -> dict[str, str | None]:
    """What differs, None for a variable removed."""
    return {k: after.get(k) for k in {**before, **after} if before.get(k) != after.get(k)}


EXPECTED = {
    "ANTHROPIC_AUTH_TOKEN": ODD_KEY, "ANTHROPIC_API_KEY": None,
    "ANTHROPIC_MODEL": "route:big", "ANTHROPIC_DEFAULT_OPUS_MODEL": "route:big",
    "ANTHROPIC_DEFAULT_SONNET_MODEL": "route:middle",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": "route:small",
    "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "65536", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "8192",
    "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1"}


def test_background_proxy_started_for_the_session_and_stopped_after(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    port = free_port()
    config = env_file(tmp_path, upstream, port)
    env = base_env(tmp_path, ANTHROPIC_API_KEY=ODD_KEY)
    status, seen = launch(tmp_path, "--env-file", str(config), "-p", "hi", env=env)
    assert status == 0
    url = f"http://127.0.0.1:{port}"
    assert changed(seen["env"], env) == {"ANTHROPIC_BASE_URL": url, **EXPECTED}
    # the session's proxy answered with the key it was given, from another process …
    assert seen["proxy"]["status"] == 200
    scope = seen["proxy"]["body"]["scope"]
    assert f"(pid {os.getpid()})" not in scope and list(seen["proxy"]["body"]["providers"]) == [
        "openai"]
    # … and is gone once Claude Code has exited
    assert not serving(url)


def test_a_running_proxy_is_reused(tmp_path: Path, upstream: ScriptedUpstream,
                                   proxy: ProxyServer) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    config = env_file(tmp_path, upstream, port, HOST="127.0.0.1")
    env = base_env(tmp_path)
    status, seen = launch(tmp_path, "--env-file", str(config), env=env)
    assert status == 0 and seen["env"]["ANTHROPIC_BASE_URL"] == proxy.url
    assert seen["proxy"]["status"] == 200
    assert f"(pid {os.getpid()})" in seen["proxy"]["body"]["scope"]  # this test's own proxy
    assert serving(proxy.url)  # still there afterwards


def test_arguments_pass_through_and_the_exit_status_is_claude_codes(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    config = env_file(tmp_path, upstream, free_port())
    env = base_env(tmp_path, STANDIN_EXIT="7")
    args = ["-p", "two words", "--env", "kimi", "--config", "x.toml", "--", "'$HOME'", ""]
    status, seen = launch(tmp_path, f"--env-file={config}", *args, env=env)
    assert status == 7 and seen["argv"] == args
    status, seen = launch(tmp_path, "--env-file", str(config), "--", "--env", "x", env=env)
    assert status == 7 and seen["argv"] == ["--env", "x"]


def test_claude_found_on_path(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    config = env_file(tmp_path, upstream, free_port())
    env = base_env(tmp_path)
    del env["CLAUDE_BIN"]
    env["PATH"] = f"{standin(tmp_path).parent}{os.pathsep}{env['PATH']}"
    status, seen = launch(tmp_path, "--env-file", str(config), "--version", env=env)
    assert status == 0 and seen["argv"] == ["--version"]


def test_without_claude_code_the_message_says_how_to_get_it(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    config = env_file(tmp_path, upstream, free_port())
    env = clean_env(tmp_path, PATH=str(tmp_path))
    env.pop("CLAUDE_BIN", None)
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "claude", "--env-file",
                             str(config)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("claude-proxy: Claude Code not found: install it (npm install -g "
                             "@anthropic-ai/claude-code) or set CLAUDE_BIN to its path\n")


def shell_environment(tmp_path: Path, shell: list[str], script: str,
                      env: dict[str, str]) -> dict[str, str]:
    out = tmp_path / "shell-env.json"
    subprocess.run([*shell, script.replace("OUT", str(out))], env=env, cwd=tmp_path,
                   check=True, timeout=60)
    found: dict[str, str] = json.loads(out.read_text())
    return found


@pytest.mark.parametrize("shell", ["bash", "fish"])
def test_env_output_sets_what_the_launcher_sets(tmp_path: Path, upstream: ScriptedUpstream,
                                                shell: str) -> None:
    if shutil.which(shell) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{shell} is not installed (make test installs it)")
        pytest.skip(f"{shell} is not installed (make test installs it)")
    port = free_port()
    config = env_file(tmp_path, upstream, port)
    env = base_env(tmp_path, ANTHROPIC_API_KEY=ODD_KEY)
    _, seen = launch(tmp_path, "--env-file", str(config), env=env)
    by_launcher = changed(seen["env"], env)

    command = f"{sys.executable} -m claude_proxy env --env-file {config} --shell {shell}"
    dump = f"{sys.executable} -c \"{BASH_DUMP}\" OUT"
    if shell == "bash":
        run = ["bash", "-c"]
        with_env, without = f'eval "$({command})" && {dump}', dump
    else:
        run = ["fish", "--no-config", "-c"]
        with_env, without = f"{command} | source; and {dump}", dump
    after = shell_environment(tmp_path, run, with_env, env)
    before = shell_environment(tmp_path, run, without, env)
    assert changed(after, before) == by_launcher
    assert by_launcher == {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", **EXPECTED}


def test_env_lines_per_shell() -> None:
    env = {"A": "it's", "B": "", "C": None}
    assert shell_lines(env, "bash") == ["export A='it'\"'\"'s'", "export B=''", "unset C"]
    assert shell_lines(env, "zsh") == shell_lines(env, "bash")
    assert shell_lines(env, "fish") == ["set -gx A 'it\\'s'", "set -gx B ''", "set -e C"]
    assert shell_lines(env, "powershell") == [
        "$env:A = 'it''s'", "$env:B = ''", "Remove-Item Env:C -ErrorAction SilentlyContinue"]


ROUTES = """
[providers.up]
openai_base_url = "{url}"
openai_api_key = "{key}"
provider = "openai"
max_retries = 0
context_window = {window}
max_output_tokens = 16000

[providers.up.models."small-model"]
context_window = 32000

[router]
default = "up,main-model"
background = "up,small-model"
subagent = "up,sub-model"
long_context = "up,long-model"
long_context_threshold = 50000
"""


def routes_file(tmp_path: Path, upstream: ScriptedUpstream, window: int = 64000) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(ROUTES.format(url=upstream.base_url, key=UPSTREAM_KEY, window=window))
    return path


def test_env_with_routes_names_the_routes(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    config = routes_file(tmp_path, upstream)
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "env", "--config",
                             str(config), "--port", "9999"], env=clean_env(tmp_path),
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.splitlines() == [
        "export ANTHROPIC_BASE_URL=http://127.0.0.1:9999",
        "export ANTHROPIC_AUTH_TOKEN=claude-proxy",
        "unset ANTHROPIC_API_KEY",
        "export ANTHROPIC_MODEL=route:default",
        "export ANTHROPIC_DEFAULT_OPUS_MODEL=route:default",
        "export ANTHROPIC_DEFAULT_SONNET_MODEL=route:default",
        "export ANTHROPIC_DEFAULT_HAIKU_MODEL=route:background",
        "export CLAUDE_CODE_SUBAGENT_MODEL=route:subagent",
        "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=64000",
        "export CLAUDE_CODE_MAX_OUTPUT_TOKENS=16000",
        "export CLAUDE_CODE_GATEWAY_HINT_HEADERS=1"]


# ------------------------------------------------------------------ routing by route id and agent


def router(**routes: Any) -> Router:
    settings = Settings(openai_api_key="k", big_model="b", middle_model="m", small_model="s")
    return Router({"p": settings}, RouterSettings(**routes) if routes else None)


def test_route_ids_and_the_subagent_rule() -> None:
    body: dict[str, Any] = {"model": "route:default", "messages": [
        {"role": "user", "content": "hi"}]}
    routed = router(default="p,main", background="p,bg", subagent="p,sub", image="p,eye")
    assert routed.candidates(body, 10) == [Candidate("p", "main", "default")]
    assert routed.candidates(body, 10, subagent=True) == [Candidate("p", "sub", "subagent")]
    assert routed.candidates({**body, "model": "route:background"}, 10) == [
        Candidate("p", "bg", "background")]
    assert routed.candidates({**body, "model": "route:subagent"}, 10) == [
        Candidate("p", "sub", "subagent")]
    image = {**body, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://example.com/a.png"}}]}]}
    assert routed.candidates(image, 10, subagent=True) == [Candidate("p", "eye", "image")]
    # without a subagent route, a subagent's haiku request still goes to background
    plain = router(default="p,main", background="p,bg")
    assert plain.candidates({**body, "model": "claude-haiku-4-5"}, 10, subagent=True) == [
        Candidate("p", "bg", "background")]
    # without [router], the tier ids
    tiers = router()
    assert [tiers.candidates({**body, "model": f"route:{tier}"}, 10)[0].model
            for tier in ("big", "middle", "small", "default", "background")] == [
        "b", "m", "s", "b", "s"]
    assert tiers.route_ids() == ["route:big", "route:middle", "route:small"]
    assert routed.route_ids() == ["route:default", "route:background", "route:image",
                                  "route:subagent"]


def test_an_unknown_route_id_is_a_400(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    with routed_server(tmp_path, upstream) as url:
        response = httpx.post(f"{url}/v1/messages", json={
            "model": "route:nowhere", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert response.status_code == 400 and upstream.requests == []
    assert response.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "model 'route:nowhere' names no route of this proxy; routes: default, "
                   "background, think, long_context, image, web_search, subagent; tiers: big, "
                   "middle, small"}}


@contextmanager
def routed_server(tmp_path: Path, upstream: ScriptedUpstream) -> Iterator[str]:
    """A proxy on the ROUTES config, in this process; yields its URL."""
    settings = Settings(log_file=str(tmp_path / "proxy.log"))
    app = create_app(settings, config=load_config_file(routes_file(tmp_path, upstream),
                                                       settings))
    sock = bind_loopback()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server, thread = serve_in_thread(app, sock)
    try:
        assert eventually(lambda: serving(url))
        yield url
    finally:
        stop_server(server, thread)


def test_a_subagents_request_takes_the_subagent_route_and_is_shown(
        tmp_path: Path, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture) -> None:
    session = "0ceee810-dcd5-4aac-a929-728af0803ed6"
    body = {"model": "route:default", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}
    ids: list[str] = []
    with routed_server(tmp_path, upstream) as url, caplog.at_level(
            logging.INFO, logger="claude_proxy.access"):
        for agent in ("a1b2c3d4e5", "bad agent; x", None):
            headers = {"x-claude-code-session-id": session}
            if agent is not None:
                headers["x-claude-code-agent-id"] = agent
            response = httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=30)
            assert response.json()["content"] == [{"type": "text", "text": "scripted default"}]
            ids.append(response.headers["request-id"])
        rows = [httpx.get(f"{url}/ui/api/requests/{i}").json()["row"] for i in ids]

        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "claude_proxy.access"
                    and "POST /v1/messages" in r.getMessage()]

        assert eventually(lambda: len(lines()) == 3)
    assert [r["model"] for r in upstream.requests] == ["sub-model", "sub-model", "main-model"]
    assert [line.split(" provider=")[0].split("/v1/messages ")[1] for line in lines()] == [
        f"session={session} agent=a1b2c3d4e5", f"session={session} agent=?",
        f"session={session} agent=-"]
    assert [line.split(" route=")[1].split(" ")[0] for line in lines()] == [
        "subagent", "subagent", "default"]
    assert [(row["session"], row["agent"], row["route"]) for row in rows] == [
        (session, "a1b2c3d4e5", "subagent"), (session, "?", "subagent"),
        (session, "-", "default")]


def test_models_list_has_the_route_ids(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    with routed_server(tmp_path, upstream) as url:
        page = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in page["data"]][:4] == [
        "route:default", "route:background", "route:long_context", "route:subagent"]
    assert page["data"][0]["display_name"] == "claude-proxy route default"


def test_window_is_the_long_context_routes_when_larger(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """Every model of `up` has 64000 (provider level) but small-model (32000), which serves
    haiku only: not a conversation Claude Code compacts."""
    config = load_config_file(routes_file(tmp_path, upstream), Settings())
    env = claude_code_environment(config, "0.0.0.0", 8082)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "64000"
    bigger = config.models.with_provider("up", "openai", {"context_window": 64000}, {
        "long-model": {"context_window": 200000}, "sub-model": {"context_window": 200000}},
                                         "[providers.up]")
    env = claude_code_environment(replace(config, models=bigger), "::1", 8082)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "200000"
    assert env["ANTHROPIC_BASE_URL"] == "http://[::1]:8082"
    # a subagent's conversation grows under the same figure: never more than its route's
    smaller = bigger.with_provider("up", "openai", {"context_window": 64000}, {
        "long-model": {"context_window": 200000}, "sub-model": {"context_window": 100000}},
                                   "[providers.up]")
    env = claude_code_environment(replace(config, models=smaller), "::1", 8082)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "100000"


# ------------------------------------------------------------------ windows learned at run time


LLAMACPP_32K = {"default_generation_settings": {"n_ctx": 32768}, "build_info": "b0-unknown",
                "chat_template": "{{ messages }}", "total_slots": 1}
"""llama-server's `/props` for `-c 32768`: the only place its window is told."""


def llamacpp_env_file(tmp_path: Path, upstream: ScriptedUpstream, port: int) -> Path:
    """A llama.cpp provider with no configured window (CONTEXT_WINDOW unset)."""
    path = tmp_path / ".env.llamacpp"
    path.write_text(f"OPENAI_BASE_URL={upstream.base_url}\nPROVIDER=llamacpp\nBIG_MODEL=gguf\n"
                    f"MIDDLE_MODEL=gguf\nSMALL_MODEL=gguf\nPORT={port}\nHOST=127.0.0.1\n"
                    "PROVIDER_MAX_OUTPUT_TOKENS=4096\n")
    return path


def run_env(tmp_path: Path, config: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "env", "--env-file",
                             str(config)], env=clean_env(tmp_path), capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stdout.splitlines()


def test_a_discovered_window_reaches_claude_code_when_the_launcher_starts_the_proxy(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.props = LLAMACPP_32K
    config = llamacpp_env_file(tmp_path, upstream, free_port())
    status, seen = launch(tmp_path, "--env-file", str(config), env=base_env(tmp_path))
    assert status == 0
    assert seen["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert seen["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert seen["proxy"]["body"]["providers"]["llamacpp"]["models"]["gguf"]["source"] == (
        "discovered: llama.cpp /props n_ctx")
    # `env` with no proxy running asks llama-server itself
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=32768" in run_env(tmp_path, config)


def test_a_running_proxys_discovered_window_reaches_claude_code_and_env(
        tmp_path: Path, upstream: ScriptedUpstream,
        proxy_factory: Callable[..., ProxyServer]) -> None:
    upstream.props = {**LLAMACPP_32K, "default_generation_settings": {"n_ctx": 24576}}
    running = proxy_factory(provider="llamacpp", big_model="gguf", middle_model="gguf",
                            small_model="gguf")
    assert eventually(lambda: httpx.get(f"{running.url}/health?detail=1", timeout=10).json()[
        "providers"]["llamacpp"]["models"]["gguf"]["context_window"] == 24576)
    # llama-server restarted without /props since: only the running proxy still knows
    upstream.props = None
    config = llamacpp_env_file(tmp_path, upstream, int(running.url.rsplit(":", 1)[1]))
    status, seen = launch(tmp_path, "--env-file", str(config), env=base_env(tmp_path))
    assert status == 0 and seen["env"]["ANTHROPIC_BASE_URL"] == running.url
    assert seen["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "24576"
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=24576" in run_env(tmp_path, config)
    assert serving(running.url)


def test_without_any_window_none_is_set(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    """llama-server without `/props` and nothing configured: Claude Code is told no window
    (rather than a guessed one)."""
    lines = run_env(tmp_path, llamacpp_env_file(tmp_path, upstream, free_port()))
    assert not [line for line in lines if "CLAUDE_CODE_MAX_CONTEXT_TOKENS" in line]
    assert "export CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096" in lines


# ------------------------------------------------------------------ request classes


HINTS = json.loads((Path(__file__).parent / "data" / "fixtures" /
                    "claude-code-2.1.332-hint-headers.json").read_text(encoding="utf-8"))
"""The x-claude-* headers of Claude Code 2.1.332 with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1: a
main loop calling a subagent, then a manual /compact (tests/record_claude_code_requests.py)."""


def hinted(request_class: str) -> dict[str, str]:
    """The first recorded request of this class, its headers as Claude Code sent them."""
    return next(dict(r["headers"]) for r in HINTS["requests"]
                if r["headers"].get("x-claude-code-request-class") == request_class)


def test_the_recorded_classes_choose_the_route() -> None:
    """Claude Code's own headers through the router: main → default, subagent → subagent,
    compaction → long_context (a short request: the class alone decides)."""
    routed = router(default="p,main", background="p,bg", subagent="p,sub",
                    long_context="p,long")
    body: dict[str, Any] = {"model": "route:default", "messages": [
        {"role": "user", "content": "hi"}]}
    chosen = []
    for recorded in HINTS["requests"]:
        headers = recorded["headers"]
        chosen.append((headers["x-claude-code-request-class"], routed.candidates(
            body, 10, subagent="x-claude-code-agent-id" in headers,
            request_class=headers["x-claude-code-request-class"])[0].route))
    assert set(chosen) == {("main", "default"), ("subagent", "subagent"),
                           ("compaction", "long_context")}
    assert routed.candidates(body, 10, request_class="auxiliary")[0].route == "background"
    # a class whose route is not configured changes nothing
    plain = router(default="p,main")
    assert {plain.candidates(body, 10, request_class=c)[0].route for c in (
        "compaction", "auxiliary", "subagent", "workflow", "side_reply", "?")} == {"default"}


def test_request_classes_route_and_are_shown(
        tmp_path: Path, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": "route:default", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}
    main, subagent, compaction = hinted("main"), hinted("subagent"), hinted("compaction")
    auxiliary = {**main, "x-claude-code-request-class": "auxiliary"}
    forged = {**main, "x-claude-code-request-class": "main prompt=x route=long_context",
              "x-claude-code-prompt-id": "a b"}
    sent = [main, subagent, compaction, auxiliary, forged]
    with routed_server(tmp_path, upstream) as url, caplog.at_level(
            logging.INFO, logger="claude_proxy.access"):
        ids = []
        for headers in sent:
            response = httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=30)
            assert response.status_code == 200
            ids.append(response.headers["request-id"])
        rows = [httpx.get(f"{url}/ui/api/requests/{i}").json()["row"] for i in ids]

        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "claude_proxy.access"
                    and "POST /v1/messages" in r.getMessage()]

        assert eventually(lambda: len(lines()) == len(sent))
    assert [r["model"] for r in upstream.requests] == [
        "main-model", "sub-model", "long-model", "small-model", "main-model"]
    prompt = main["x-claude-code-prompt-id"]
    assert compaction.get("x-claude-code-prompt-id") is None  # /compact sends none
    # the new fields come last: the line is as it was up to them
    assert all(re.search(r" cached=\d+(?: cost_usd=\S+)? class=\S+ prompt_id=\S+$", line)
               for line in lines())
    assert [line.split(" class=", 1)[1] for line in lines()] == [
        f"main prompt_id={prompt}", f"subagent prompt_id={prompt}", "compaction prompt_id=-",
        f"auxiliary prompt_id={prompt}", "? prompt_id=?"]
    assert [(row["request_class"], row["prompt_id"], row["route"]) for row in rows] == [
        ("main", prompt, "default"), ("subagent", prompt, "subagent"),
        ("compaction", "-", "long_context"), ("auxiliary", prompt, "background"),
        ("?", "?", "default")]
