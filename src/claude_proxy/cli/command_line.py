"""The `claude-proxy` command.

    claude-proxy [serve] [--env-file PATH | --env NAME] [--config FILE] [--host H] [--port P]
                         [--workers N] [--watch-config]
    claude-proxy doctor  [--env-file PATH | --env NAME] [--config FILE] [--time-limit SECONDS]
    claude-proxy keys new NAME | usage [...] | statusline   (key_commands.py)
    claude-proxy env     [--env-file PATH | --env NAME] [--config FILE] [--shell SHELL]
    claude-proxy claude  [--env-file PATH | --env NAME] [--config FILE] [--] [ARGS...]
    claude-proxy desktop [--env-file PATH | --env NAME] [--config FILE] [--restore] [--print]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from claude_proxy import __version__
from claude_proxy.cli import key_commands as keys_cli
from claude_proxy.cli.launcher import SHELLS, print_environment, run_claude, serve_arguments
from claude_proxy.cli.supervisor import run_workers
from claude_proxy.config.file import (
    KEYLESS_PROFILES,
    ConfigurationError,
    ProxyConfig,
    load_config_file,
    single_provider_config,
    stray_provider_variables,
)
from claude_proxy.config.settings import ProviderSettings, Settings, load_settings
from claude_proxy.logs import configure_logging
from claude_proxy.routing.reach import check_budgets
from claude_proxy.routing.router import Router
from claude_proxy.server.app import create_app
from claude_proxy.server.drain import graceful_shutdown
from claude_proxy.server.reload import Source
from claude_proxy.state.store import display_url
from claude_proxy.ui.recorder import WORKERS_VARIABLE
from claude_proxy.websearch.table import describe, with_search_table

logger = logging.getLogger("claude_proxy")

ENV_FILE_VARIABLE = "CLAUDE_PROXY_ENV_FILE"
CONFIG_FILE_VARIABLE = "CONFIG_FILE"
ZERO_CONFIGURATION = "zero configuration: the local Ollama server"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="claude-proxy",
        description="Anthropic Messages API proxy for OpenAI-compatible upstreams.")
    parser.add_argument("command", nargs="?",
                        choices=("serve", "doctor", "env", "claude", "desktop"),
                        default="serve",
                        help="serve (default); doctor: check that Claude Code will work; env: "
                             "print the variables that point Claude Code here; claude: run "
                             "Claude Code against this proxy (ARGS go to it unchanged); "
                             "desktop: point Claude Desktop's third-party mode here")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env-file", metavar="PATH",
                        help="read settings from this file; environment variables still win")
    source.add_argument("--env", metavar="NAME", help="shorthand for --env-file .env.NAME")
    parser.add_argument("--config", metavar="FILE",
                        help="a TOML file of several providers and routes (CONFIG_FILE)")
    parser.add_argument("--host", help="listen address (HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (PORT, default 8082)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (default 1); they share one port")
    parser.add_argument("--watch-config", action="store_true",
                        help="reload when the config file or the env file changes, as SIGHUP "
                             "does (WATCH_CONFIG)")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="doctor: seconds each provider's checks may take (default 60)")
    parser.add_argument("--shell", choices=SHELLS, default="bash",
                        help="env: the shell to print for (default bash)")
    parser.add_argument("--restore", action="store_true",
                        help="desktop: put back the configuration found before the first run")
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="desktop: only show what would be written")
    parser.add_argument("--version", action="version", version=f"claude-proxy {__version__}")
    return parser


LAUNCHER_OPTIONS = ("--env-file", "--env", "--config")


def split_claude_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """`claude [OPTIONS] [--] [ARGS...]` → (the launcher's options, Claude Code's ARGS). The
    launcher's options come first; the first other word (or `--`) starts ARGS, which are
    passed on unchanged."""
    own: list[str] = []
    rest = list(argv)
    while rest:
        word = rest[0]
        name = word.split("=", 1)[0]
        if word == "--":
            rest.pop(0)
            break
        if name not in LAUNCHER_OPTIONS:
            break
        own.append(rest.pop(0))
        if "=" not in word and rest:
            own.append(rest.pop(0))
    return own, rest


def env_file_of(args: argparse.Namespace) -> Path | None:
    if args.env:
        return Path(f".env.{args.env}")
    return Path(args.env_file) if args.env_file else None


def read_settings(env_file: Path | None) -> Settings:
    """The environment's settings, or a ConfigurationError naming the variable that is wrong."""
    try:
        return load_settings(env_file)
    except FileNotFoundError as exc:
        raise ConfigurationError(str(exc)) from None
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
                 for err in exc.errors(include_url=False)]
        raise ConfigurationError("invalid configuration:\n" + "\n".join(lines)) from None


def read_config(env_file: Path | None, config_file: str | None = None) -> ProxyConfig:
    """The providers and routes (see `providers_config`), with the search backend's settings
    from the config file's `[web_search]` table applied and checked."""
    return with_search_table(providers_config(env_file, config_file))


def providers_config(env_file: Path | None, config_file: str | None = None) -> ProxyConfig:
    """The providers and routes: from the config file when there is one, else the one
    provider of the environment (or, with nothing configured at all, a local Ollama)."""
    settings = read_settings(env_file)
    path = config_file or settings.config_file
    if path:
        return check_budgets(load_config_file(Path(path), settings))
    if settings.openai_api_key.get_secret_value() or settings.provider_name in KEYLESS_PROFILES:
        return single_provider_config(settings)
    if env_file is None and not settings.model_fields_set & {"openai_base_url", "provider"}:
        local = local_ollama(settings)
        if local is not None:
            return ProxyConfig(local, {"ollama": local}, source=ZERO_CONFIGURATION)
    raise ConfigurationError(
        "OPENAI_API_KEY is not set: configure an upstream in one of three ways: "
        "OPENAI_API_KEY (with OPENAI_BASE_URL, PROVIDER) in the environment; "
        "--env-file FILE (or --env NAME for .env.NAME, e.g. --env kimi); or "
        "--config FILE (CONFIG_FILE) for several providers. No Ollama server answered on "
        f"{ollama_address()} either.")


def ollama_address() -> str:
    return os.environ.get("OLLAMA_HOST", "127.0.0.1:11434").removeprefix("http://")


def local_ollama(settings: Settings) -> Settings | None:
    """Zero configuration: an Ollama server on this machine, serving its first model."""
    base = f"http://{ollama_address()}/v1"
    try:
        listed = httpx.get(f"{base}/models", timeout=2.0).json()
        model = str(listed["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    return settings.model_copy(update={"openai_base_url": base, "provider": "ollama",
                                       "big_model": model, "middle_model": model,
                                       "small_model": model})


def startup_line(config: ProxyConfig, host: str, port: int, workers: int) -> str:
    """What is active, without any secret."""
    settings = config.settings
    head = (f"claude-proxy {__version__} on {host}:{port} ({workers} worker"
            f"{'s' if workers > 1 else ''})")
    keys = f" ({len(config.keys)} team keys)" if config.keys else ""
    tail = (f"client key {'required' if settings.anthropic_api_key or keys else 'not required'}"
            f"{keys}; "
            f"web search: {describe(config)}; {state_note(settings)}; "
            f"{dashboard_note(settings, host, port, workers)}")
    if config.source in ("environment", ZERO_CONFIGURATION):
        only = next(iter(config.providers.values()))
        found = f" ({config.source})" if config.source == ZERO_CONFIGURATION else ""
        return f"{head} -> {provider_summary(only)}{found}; {tail}"
    providers = "; ".join(f"{name} -> {provider_summary(p)}"
                          for name, p in config.providers.items())
    router = Router(config.providers, config.router)
    routes = ", ".join(f"{name}={' | '.join(f'{c.provider},{c.model}' for c in router.route(name))}"
                       for name in router.route_names()) or "none (opus/sonnet/haiku mapping)"
    fallback = " | ".join(f"{c.provider},{c.model}" for c in router.fallbacks()) or "none"
    return (f"{head}; {len(config.providers)} providers from {config.source}: {providers}; "
            f"routes: {routes}; fallback: {fallback}; {tail}")


def state_note(settings: Settings) -> str:
    """Where what the proxy learns is kept (never the Redis password)."""
    if settings.redis_url is None:
        return "state: in-process"
    return (f"state: shared through Redis at {display_url(settings.redis_url.get_secret_value())}"
            f" (prefix {settings.redis_prefix!r})")


def dashboard_note(settings: Settings, host: str, port: int, workers: int) -> str:
    """Where the dashboard is, and that with several workers each page shows one of them
    (all of them with Redis)."""
    if not settings.ui_enabled:
        return "dashboard off (UI_ENABLED=false)"
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    per_worker = f" (each page load shows one of the {workers} workers)" if workers > 1 else ""
    if settings.redis_url is not None:
        per_worker = " (every worker and replica, through Redis)"
    return f"dashboard http://{shown}:{port}/ui{per_worker}"


def provider_summary(settings: ProviderSettings) -> str:
    reasoning = (f"dialect {settings.dialect} for "
                 f"{','.join(settings.chat_prefixes + settings.model_prefixes) or 'no model'}, "
                 f"passback {settings.passback}, with tools "
                 f"{'on' if settings.reasons_with_tools else 'off'}")
    return (f"{settings.openai_base_url} (provider {settings.provider_name}); models "
            f"opus={settings.model_for_tier('big')} sonnet={settings.model_for_tier('middle')} "
            f"haiku={settings.model_for_tier('small')}; reasoning: {reasoning}")


def warn_about_stray_variables(config: ProxyConfig) -> None:
    if config.source in ("environment", ZERO_CONFIGURATION):
        return
    stray = stray_provider_variables(os.environ)
    if stray:
        logger.warning("provider variables in the environment are not used with a config "
                       "file (%s): put them in its [providers.NAME] tables", ", ".join(stray))


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
HEAP_KEPT = 32 * 1024 * 1024
"""Free memory glibc keeps at the top of the heap rather than giving back to the system."""
MMAP_FROM = 16 * 1024 * 1024
"""Allocations from this size get pages of their own (smaller ones come from the heap)."""


def tune_allocator() -> None:
    """Keep freed memory for the next requests instead of returning it to the system at once.

    glibc hands memory back when the top of its heap holds more than twice its (adaptive)
    mmap threshold free, and the proxy's requests are large and outlive each other: Claude
    Code's conversations are hundreds of KB, and the inspector keeps the last requests'
    bodies. Every request then had fresh pages, a fault for each 4 KB: on 800 KB
    conversations 630 faults a request where FLOOR had 300, 1.5 ms of CPU. Fixed thresholds
    (32 MiB kept, 16 MiB before a block is mapped apart) brought them down to FLOOR's. Only
    with glibc, and not when MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ already say
    otherwise."""
    if any(name in os.environ for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_FROM)
    mallopt(M_TRIM_THRESHOLD, HEAP_KEPT)


def tune_process() -> None:
    """The collector and the allocator set for a server, once the app is built."""
    tune_garbage_collector()
    tune_allocator()


def tune_garbage_collector() -> None:
    """Move everything loaded at start-up out of the collector's sight and collect less
    often: under many concurrent streams the default thresholds make full collections run
    every few milliseconds, each walking every long-lived object."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)


def http_protocol() -> Any:
    """uvicorn's httptools protocol sending a response's head with its first body bytes
    (server/http_protocol.py), or uvicorn's own choice where httptools cannot be imported."""
    try:
        from claude_proxy.server.http_protocol import HeadHoldingHttpToolsProtocol
    except ImportError:
        return "auto"
    return HeadHoldingHttpToolsProtocol


def worker_app() -> FastAPI:
    """Application factory for `--workers`: each worker process reads the same settings (and
    reads them again on SIGHUP, which the parent passes on)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the app takes it: a reload, not an end
    named = os.environ.get(ENV_FILE_VARIABLE)
    env_file = Path(named) if named else None
    config = read_config(env_file)
    settings = config.settings
    configure_logging(settings.log_level, settings.log_file, config.secrets())
    app = create_app(settings, config=config, source=Source(partial(read_config, env_file),
                                                           env_file))
    tune_process()
    return app


def serve(config: ProxyConfig, env_file: Path | None, args: argparse.Namespace) -> int:
    settings = config.settings
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    configure_logging(settings.log_level, settings.log_file, config.secrets())
    logger.info(startup_line(config, host, port, args.workers))
    os.environ[WORKERS_VARIABLE] = str(args.workers)
    warn_about_stray_variables(config)
    options = {"host": host, "port": port, "log_config": None,
               "log_level": settings.log_level.lower(), "access_log": False,
               "http": http_protocol(),
               "timeout_graceful_shutdown": graceful_shutdown(settings.drain_delay,
                                                              settings.drain_timeout)}
    if args.workers <= 1:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the app takes it: a reload
        app = create_app(settings, config=config,
                         source=Source(partial(read_config, env_file, args.config), env_file))
        tune_process()
        uvicorn.run(app, **options)
        return 0
    if env_file is not None:
        os.environ[ENV_FILE_VARIABLE] = str(env_file.resolve())
    if config.source not in ("environment", ZERO_CONFIGURATION):
        os.environ[CONFIG_FILE_VARIABLE] = str(Path(config.source).resolve())
    if settings.thinking_signature_secret is None:
        # Workers must agree on the secret, or one could not verify another's thinking blocks.
        os.environ["THINKING_SIGNATURE_SECRET"] = secrets.token_hex(32)
    with metrics_directory():
        run_workers("claude_proxy.cli.command_line:worker_app", args.workers,
                    settings.drain_delay, **options)
    return 0


MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


@contextmanager
def metrics_directory() -> Iterator[Path | None]:
    """Where the workers' metric files go, so that a scrape of /metrics, whichever worker
    answers, sums them all (prometheus_client's multiprocess mode). A directory named by
    PROMETHEUS_MULTIPROC_DIR is emptied of old files at start; otherwise a temporary one is
    made (in the temporary directory, else /dev/shm: a read-only root keeps that writable),
    and removed at exit. Set before the workers start: they read it at import."""
    named = os.environ.get(MULTIPROC_VARIABLE)
    path = Path(named) if named else _temporary_directory()
    if path is None:
        logger.warning("no writable directory for the workers' metrics: each scrape of "
                       "/metrics shows the worker that answers (set %s)", MULTIPROC_VARIABLE)
        yield None
        return
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
    os.environ[MULTIPROC_VARIABLE] = str(path)
    logger.info("workers' metrics summed through %s", path)
    try:
        yield path
    finally:
        if not named:
            shutil.rmtree(path, ignore_errors=True)


def _temporary_directory() -> Path | None:
    for parent in (None, "/dev/shm"):
        try:
            return Path(tempfile.mkdtemp(prefix="claude-proxy-metrics-", dir=parent))
        except OSError:
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in keys_cli.COMMANDS:
        return keys_cli.main(argv)
    claude_args: list[str] = []
    if argv[:1] == ["claude"]:
        own, claude_args = split_claude_arguments(argv[1:])
        argv = ["claude", *own]
    args = build_parser().parse_args(argv)
    if args.watch_config:
        os.environ["WATCH_CONFIG"] = "true"  # the workers read it too
    env_file = env_file_of(args)
    try:
        config = read_config(env_file, args.config)
        if args.workers < 1:
            raise ConfigurationError("--workers must be 1 or more")
    except ConfigurationError as exc:
        print(f"claude-proxy: {exc}", file=sys.stderr)
        return 2
    if args.command == "doctor":
        from claude_proxy.cli.doctor import TIME_LIMIT, run_doctor
        return run_doctor(config, args.time_limit or TIME_LIMIT)
    if args.command in ("env", "claude", "desktop"):
        return launch(config, env_file, args, claude_args)
    return serve(config, env_file, args)


def launch(config: ProxyConfig, env_file: Path | None, args: argparse.Namespace,
           claude_args: list[str]) -> int:
    """`env` prints Claude Code's settings; `claude` runs it with them (launcher.py);
    `desktop` writes Claude Desktop's (desktop.py)."""
    host = args.host or config.settings.host
    port = args.port if args.port is not None else config.settings.port
    if args.command == "env":
        return print_environment(config, host, port, args.shell)
    try:
        if args.command == "desktop":
            from claude_proxy.cli.desktop import run_desktop
            return run_desktop(config, host, port, args.restore, args.print_only)
        return run_claude(config, host, port, claude_args,
                          serve_arguments(env_file, args.config, host, port))
    except ConfigurationError as exc:
        print(f"claude-proxy: {exc}", file=sys.stderr)
        return 2
