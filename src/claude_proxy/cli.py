"""The `claude-proxy` command.

    claude-proxy [serve] [--env-file PATH | --env NAME] [--host H] [--port P] [--workers N]
    claude-proxy doctor  [--env-file PATH | --env NAME]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import secrets
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from claude_proxy import __version__
from claude_proxy.app import create_app
from claude_proxy.config import Settings, load_settings
from claude_proxy.logs import configure_logging
from claude_proxy.websearch.backends import configuration_problem

logger = logging.getLogger("claude_proxy")

KEYLESS_PROVIDERS = frozenset({"ollama", "vllm"})
ENV_FILE_VARIABLE = "CLAUDE_PROXY_ENV_FILE"


class ConfigurationError(Exception):
    """A problem that keeps the proxy from starting, worded for the person running it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="claude-proxy",
        description="Anthropic Messages API proxy for OpenAI-compatible upstreams.")
    parser.add_argument("command", nargs="?", choices=("serve", "doctor"), default="serve",
                        help="serve (default) or doctor: check that Claude Code will work")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env-file", metavar="PATH",
                        help="read settings from this file; environment variables still win")
    source.add_argument("--env", metavar="NAME", help="shorthand for --env-file .env.NAME")
    parser.add_argument("--host", help="listen address (HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (PORT, default 8082)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes (default 1); they share one port")
    parser.add_argument("--version", action="version", version=f"claude-proxy {__version__}")
    return parser


def env_file_of(args: argparse.Namespace) -> Path | None:
    if args.env:
        return Path(f".env.{args.env}")
    return Path(args.env_file) if args.env_file else None


def read_settings(env_file: Path | None) -> Settings:
    """Settings, or a ConfigurationError naming the variable that is wrong."""
    try:
        settings = load_settings(env_file)
    except FileNotFoundError as exc:
        raise ConfigurationError(str(exc)) from None
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
                 for err in exc.errors(include_url=False)]
        raise ConfigurationError("invalid configuration:\n" + "\n".join(lines)) from None
    if (not settings.openai_api_key.get_secret_value()
            and settings.provider_name not in KEYLESS_PROVIDERS):
        raise ConfigurationError("OPENAI_API_KEY is not set: put the upstream API key in the "
                                 "environment or in the file given with --env-file")
    search_problem = configuration_problem(settings)
    if search_problem is not None:
        raise ConfigurationError(search_problem)
    return settings


def startup_line(settings: Settings, host: str, port: int, workers: int) -> str:
    """What is active, without any secret."""
    reasoning = (f"dialect {settings.dialect} for "
                 f"{','.join(settings.chat_prefixes + settings.model_prefixes) or 'no model'}, "
                 f"passback {settings.passback}, with tools "
                 f"{'on' if settings.reasoning_with_tools else 'off'}")
    return (f"claude-proxy {__version__} on {host}:{port} ({workers} worker"
            f"{'s' if workers > 1 else ''}) -> {settings.openai_base_url} "
            f"(provider {settings.provider_name}); models opus={settings.model_for_tier('big')} "
            f"sonnet={settings.model_for_tier('middle')} "
            f"haiku={settings.model_for_tier('small')}; reasoning: {reasoning}; client key "
            f"{'required' if settings.anthropic_api_key else 'not required'}; web search "
            f"{web_search_line(settings)}")


def web_search_line(settings: Settings) -> str:
    backend = settings.web_search_backend
    if settings.web_search == "native":
        return f"native (fallback {backend or 'unavailable'})"
    if settings.web_search == "off" or backend is None:
        return "off (answers `unavailable`; set WEB_SEARCH_BACKEND to search)"
    return f"via {backend}"


def tune_garbage_collector() -> None:
    """Move everything loaded at start-up out of the collector's sight and collect less
    often: under many concurrent streams the default thresholds make full collections run
    every few milliseconds, each walking every long-lived object."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)


def worker_app() -> FastAPI:
    """Application factory for `--workers`: each worker process reads the same settings."""
    env_file = os.environ.get(ENV_FILE_VARIABLE)
    settings = read_settings(Path(env_file) if env_file else None)
    configure_logging(settings.log_level, settings.log_file, settings.secrets())
    app = create_app(settings)
    tune_garbage_collector()
    return app


def serve(settings: Settings, env_file: Path | None, args: argparse.Namespace) -> int:
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    configure_logging(settings.log_level, settings.log_file, settings.secrets())
    logger.info(startup_line(settings, host, port, args.workers))
    options = {"host": host, "port": port, "log_config": None,
               "log_level": settings.log_level.lower(), "access_log": False}
    if args.workers <= 1:
        app = create_app(settings)
        tune_garbage_collector()
        uvicorn.run(app, **options)  # type: ignore[arg-type]
        return 0
    if env_file is not None:
        os.environ[ENV_FILE_VARIABLE] = str(env_file.resolve())
    if settings.thinking_signature_secret is None:
        # Workers must agree on the secret, or one could not verify another's thinking blocks.
        os.environ["THINKING_SIGNATURE_SECRET"] = secrets.token_hex(32)
    uvicorn.run("claude_proxy.cli:worker_app", factory=True, workers=args.workers,
                **options)  # type: ignore[arg-type]
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env_file = env_file_of(args)
    try:
        settings = read_settings(env_file)
        if args.workers < 1:
            raise ConfigurationError("--workers must be 1 or more")
    except ConfigurationError as exc:
        print(f"claude-proxy: {exc}", file=sys.stderr)
        return 2
    if args.command == "doctor":
        from claude_proxy.doctor import run_doctor
        return run_doctor(settings)
    return serve(settings, env_file, args)
