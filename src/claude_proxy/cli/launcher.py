"""Claude Code in one command: `claude-proxy claude` and `claude-proxy env`.

Claude Code manages its context by its own idea of the model's window. Pointed at this proxy
by hand it sees model names it knows (and assumes 200 k or 1 M tokens), or names it does not
know. The launcher gives it model ids that name this proxy's routes (`route:default`, …; see
routing/router.py), which Claude Code treats as custom models, and tells it the real window
and output limit of those routes, so that it compacts on time by itself.

`claude-proxy env` prints the same settings for a shell; `claude-proxy claude` sets them for
one Claude Code run, starting the proxy in the background when none answers at its address.

Windows a server tells only at run time (llama.cpp's `/props`, vLLM's and OpenRouter's model
lists, Ollama's loaded context: routing/discovery.py) are learned first (`learn_windows`): from
the running proxy's `/health?detail=1`, else by asking the upstreams here, so that they reach
Claude Code exactly as configured windows do.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType

import httpx

from claude_proxy.config.file import ConfigurationError, ProxyConfig
from claude_proxy.config.model_table import ModelFacts
from claude_proxy.routing.catalog import (
    candidate_windows,
    output_limit,
    route_candidates,
    smallest,
)
from claude_proxy.routing.discovery import discover
from claude_proxy.routing.router import Candidate, Router, route_id

CLAUDE_BIN_VARIABLE = "CLAUDE_BIN"
NO_CLIENT_KEY = "claude-proxy"
"""What Claude Code sends as its key when the proxy requires none (it insists on one)."""
SHELLS = ("bash", "zsh", "fish", "powershell")
START_TIMEOUT = 60.0
"""Seconds a background proxy may take to answer /health before the launcher gives up."""
STOP_TIMEOUT = 10.0
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


# ------------------------------------------------------------------ what Claude Code is told


Environment = dict[str, str | None]
"""Variable → value, or None: the variable is removed."""


def claude_code_environment(config: ProxyConfig, host: str, port: int) -> Environment:
    """The variables that point Claude Code at this proxy, in the order they are printed.

    - ANTHROPIC_BASE_URL: this proxy; ANTHROPIC_AUTH_TOKEN: its client key (sent as
      `Authorization: Bearer`, which Claude Code uses without asking to approve a key), and
      ANTHROPIC_API_KEY removed: Claude Code would ask, in interactive mode, whether to use it
      (default "no"), and a real Anthropic key in the shell must not be sent here. Removed, not
      emptied, so that a proxy started later from the same shell still reads its client key
      from its env file.
    - ANTHROPIC_MODEL and ANTHROPIC_DEFAULT_OPUS/SONNET/HAIKU_MODEL: route ids. The main model
      must be set as well: Claude Code appends `[1m]` to a custom opus id and then assumes a
      1 M window.
    - CLAUDE_CODE_SUBAGENT_MODEL: `route:subagent` when that route is configured.
    - CLAUDE_CODE_MAX_CONTEXT_TOKENS / CLAUDE_CODE_MAX_OUTPUT_TOKENS: the smallest window and
      output limit among the candidates of the main route (see `main_window`).
    - CLAUDE_CODE_GATEWAY_HINT_HEADERS=1: Claude Code then labels each request with its class
      (`x-claude-code-request-class`: main, subagent, compaction, auxiliary, …) and its user
      turn (`x-claude-code-prompt-id`), which the router and the access line read.
    """
    router = Router(config.providers, config.router)
    ids = model_ids(router)
    env: Environment = {"ANTHROPIC_BASE_URL": base_url_of(host, port),
                        "ANTHROPIC_AUTH_TOKEN": client_key(config),
                        "ANTHROPIC_API_KEY": None,
                        "ANTHROPIC_MODEL": ids["opus"],
                        "ANTHROPIC_DEFAULT_OPUS_MODEL": ids["opus"],
                        "ANTHROPIC_DEFAULT_SONNET_MODEL": ids["sonnet"],
                        "ANTHROPIC_DEFAULT_HAIKU_MODEL": ids["haiku"]}
    if "subagent" in ids:
        env["CLAUDE_CODE_SUBAGENT_MODEL"] = ids["subagent"]
    window = main_window(config, router)
    if window is not None:
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(window)
    env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(main_output_limit(config, router))
    env["CLAUDE_CODE_GATEWAY_HINT_HEADERS"] = "1"
    return env


def model_ids(router: Router) -> dict[str, str]:
    """Claude Code's model slots → route ids. With a `[router]` table: `route:default` for
    the main loop, opus and sonnet, `route:background` for haiku (when configured),
    `route:subagent` for subagents (when configured); without one, the three tiers."""
    if router.settings is None:
        return {"opus": route_id("big"), "sonnet": route_id("middle"),
                "haiku": route_id("small")}
    ids = {"opus": route_id("default"), "sonnet": route_id("default"),
           "haiku": route_id("background" if router.route("background") else "default")}
    if router.route("subagent"):
        ids["subagent"] = route_id("subagent")
    return ids


def main_window(config: ProxyConfig, router: Router) -> int | None:
    """The window Claude Code should compact by (one figure for every model it uses):

    - the smallest known window among the main route's candidates;
    - when a `long_context` route is configured and its smallest window is larger, that one
      (the proxy sends long requests there, so the main loop may grow up to it);
    - no larger than the smallest window of the `subagent` route, when configured: a
      subagent's conversation grows under the same figure.
    None: no window is known."""
    window = smallest(windows(config, route_candidates(router, "default")))
    if router.route("long_context"):
        longest = smallest(windows(config, route_candidates(router, "long_context")))
        if longest is not None and (window is None or longest > window):
            window = longest
    if router.route("subagent"):
        window = smallest([window, *windows(config, route_candidates(router, "subagent"))])
    return window


def main_output_limit(config: ProxyConfig, router: Router) -> int:
    """The smallest output limit among the main route's candidates (catalog.output_limit)."""
    return output_limit(router, config.models, route_candidates(router, "default"))


def windows(config: ProxyConfig, candidates: Iterable[Candidate]) -> list[int | None]:
    return candidate_windows(config.models, candidates)


def client_key(config: ProxyConfig) -> str:
    key = config.settings.anthropic_api_key
    return key.get_secret_value() if key and key.get_secret_value() else NO_CLIENT_KEY


def base_url_of(host: str, port: int) -> str:
    return f"http://{client_host(host)}:{port}"


def client_host(host: str) -> str:
    """Where a client on this machine reaches a proxy listening on `host`."""
    if host in WILDCARD_HOSTS:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# ------------------------------------------------------------------ claude-proxy env


def shell_lines(env: Mapping[str, str | None], shell: str) -> list[str]:
    """One line per variable, quoted for `shell`; None removes the variable."""
    return [shell_line(name, value, shell) for name, value in env.items()]


def shell_line(name: str, value: str | None, shell: str) -> str:
    if shell == "fish":
        return f"set -e {name}" if value is None else f"set -gx {name} {fish_quote(value)}"
    if shell == "powershell":
        if value is None:
            return f"Remove-Item Env:{name} -ErrorAction SilentlyContinue"
        return f"$env:{name} = '{value.replace(chr(39), chr(39) * 2)}'"
    return f"unset {name}" if value is None else f"export {name}={shlex.quote(value)}"


def fish_quote(value: str) -> str:
    """fish's single quotes: only `\\` and `'` are special inside them."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def print_environment(config: ProxyConfig, host: str, port: int, shell: str) -> int:
    base_url = base_url_of(host, port)
    learn_windows(config, base_url, running=answers(base_url))
    for line in shell_lines(claude_code_environment(config, host, port), shell):
        print(line)
    return 0


# ------------------------------------------------------------------ windows learned at run time


def learn_windows(config: ProxyConfig, base_url: str, running: bool) -> None:
    """Record in `config.models` the windows and output limits known only at run time: from
    the running proxy at `base_url` (what it discovered at its start, the very figures its
    pre-flight holds requests to), else from the upstreams asked here (a proxy that does not
    answer `/health?detail=1` with this key, or none running)."""
    if not (running and windows_from_proxy(config, base_url)):
        asyncio.run(discover(config))


def windows_from_proxy(config: ProxyConfig, base_url: str) -> bool:
    """The proxy's `/health?detail=1` windows, for the providers this configuration has;
    False when it cannot be read (another key, another program, an older proxy)."""
    key = client_key(config)
    try:
        response = httpx.get(f"{base_url}/health", params={"detail": "1"}, timeout=5.0,
                             headers={"x-api-key": key, "authorization": f"Bearer {key}"})
        providers = response.json()["providers"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False
    if not isinstance(providers, dict):
        return False
    for name, detail in providers.items():
        models = detail.get("models") if isinstance(detail, dict) else None
        if name not in config.providers or not isinstance(models, dict):
            continue
        for model, figures in models.items():
            facts = reported_facts(figures)
            if facts is not None:
                config.models.discover(name, model, facts)
    return True


def reported_facts(figures: object) -> ModelFacts | None:
    """One model's figures as `/health?detail=1` reports them, as ModelFacts (attributed to
    the proxy's own source, e.g. `discovered: llama.cpp /props n_ctx`); None when unknown."""
    if not isinstance(figures, dict):
        return None
    known = {key: figures[key] for key in ("context_window", "max_output_tokens")
             if isinstance(figures.get(key), int) and not isinstance(figures[key], bool)
             and figures[key] > 0}
    if not known:
        return None
    source = f"running proxy: {figures.get('source') or 'unknown'}"
    return ModelFacts(**known, sources={key: source for key in known})


# ------------------------------------------------------------------ claude-proxy claude


def claude_binary(environ: Mapping[str, str]) -> str:
    """CLAUDE_BIN, else `claude` on PATH."""
    configured = environ.get(CLAUDE_BIN_VARIABLE)
    if configured:
        return configured
    found = shutil.which("claude", path=environ.get("PATH"))
    if found is None:
        raise ConfigurationError("Claude Code not found: install it (npm install -g "
                                 "@anthropic-ai/claude-code) or set CLAUDE_BIN to its path")
    return found


def answers(base_url: str) -> bool:
    """Whether a claude-proxy (anything that answers /health with status ok) is there."""
    try:
        response = httpx.get(f"{base_url}/health", timeout=2.0)
        return response.status_code == 200 and response.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


class BackgroundProxy:
    """`claude-proxy serve` for one Claude Code session, with its output in a temporary file
    (the terminal belongs to Claude Code), in its own session so that Ctrl-C in Claude Code
    does not stop it."""

    def __init__(self, serve_args: Sequence[str], base_url: str) -> None:
        self.base_url = base_url
        self.output = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the child
            prefix="claude-proxy-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "claude_proxy", "serve", *serve_args],
            stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self) -> None:
        """Poll /health until it answers (bounded); a proxy that exits or never answers is a
        ConfigurationError carrying the end of its output."""
        give_up = time.monotonic() + START_TIMEOUT
        while not answers(self.base_url):
            if self.process.poll() is not None or time.monotonic() > give_up:
                self.stop()
                raise ConfigurationError(f"the proxy did not start at {self.base_url}:\n"
                                         f"{self.tail()}")
            time.sleep(0.1)

    def tail(self, lines: int = 20) -> str:
        text = Path(self.output.name).read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGINT, not SIGTERM: a session's proxy serves nobody else, so it stops at once
        rather than draining for a load balancer (server/drain.py)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.output.close()
        Path(self.output.name).unlink(missing_ok=True)


def serve_arguments(env_file: Path | None, config_file: str | None, host: str,
                    port: int) -> list[str]:
    """The background proxy's command line: the same configuration, on loopback when the
    configured address is every interface (a session's proxy is for this machine only)."""
    args = ["--env-file", str(env_file)] if env_file is not None else []
    if config_file:
        args += ["--config", config_file]
    bind = "127.0.0.1" if host in WILDCARD_HOSTS else host
    return [*args, "--host", bind, "--port", str(port)]


def run_claude(config: ProxyConfig, host: str, port: int, claude_args: Sequence[str],
               serve_args: Sequence[str]) -> int:
    """Claude Code against this proxy; its exit status is the command's. The proxy is up
    (started here when none answers) before Claude Code is told its windows: they are the
    ones the proxy learned."""
    binary = claude_binary(os.environ)
    base_url = base_url_of(host, port)
    background = None
    if not answers(base_url):
        background = BackgroundProxy(serve_args, base_url)
        background.wait_ready()
    try:
        learn_windows(config, base_url, running=True)
        child = dict(os.environ)
        for name, value in claude_code_environment(config, host, port).items():
            if value is None:
                child.pop(name, None)
            else:
                child[name] = value
        return run_child([binary, *claude_args], child)
    finally:
        if background is not None:
            background.stop()


def run_child(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run Claude Code in the foreground. Ctrl-C belongs to it (the terminal sends it to the
    whole process group, and Claude Code decides what it means), so the launcher only waits;
    SIGTERM and SIGHUP are passed on."""
    try:
        child = subprocess.Popen(list(command), env=dict(env))
    except OSError as exc:
        raise ConfigurationError(f"cannot run Claude Code ({command[0]}): {exc}") from None

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {signum: signal.signal(signum, handler) for signum, handler in (
        (signal.SIGINT, lambda _s, _f: None), (signal.SIGTERM, forward),
        (signal.SIGHUP, forward))}
    try:
        status = child.wait()
        return 128 - status if status < 0 else status  # killed by a signal: as a shell says
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
