"""The `claude-proxy` command: load settings (optionally from an env file) and serve."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn
from pydantic import ValidationError

from claude_proxy import __version__
from claude_proxy.app import create_app
from claude_proxy.config import Settings, load_settings
from claude_proxy.logs import configure_logging

logger = logging.getLogger("claude_proxy")

KEYLESS_PROVIDERS = frozenset({"ollama", "vllm"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="claude-proxy",
        description="Anthropic Messages API proxy for OpenAI-compatible upstreams.")
    parser.add_argument("--env-file", metavar="PATH",
                        help="read settings from this file (e.g. .env.kimi); "
                             "environment variables still win")
    parser.add_argument("--host", help="listen address (HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (PORT, default 8082)")
    parser.add_argument("--version", action="version", version=f"claude-proxy {__version__}")
    return parser


def settings_problem(settings: Settings) -> str | None:
    """What keeps these settings from serving, in words that name the variable."""
    if (not settings.openai_api_key.get_secret_value()
            and settings.provider_name not in KEYLESS_PROVIDERS):
        return ("OPENAI_API_KEY is not set: put the upstream API key in the environment or "
                "in the file given with --env-file")
    return None


def describe_validation(exc: ValidationError) -> str:
    lines = [f"  {'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
             for err in exc.errors(include_url=False)]
    return "invalid configuration:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.env_file)
    except FileNotFoundError as exc:
        print(f"claude-proxy: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"claude-proxy: {describe_validation(exc)}", file=sys.stderr)
        return 2
    problem = settings_problem(settings)
    if problem:
        print(f"claude-proxy: {problem}", file=sys.stderr)
        return 2
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    configure_logging(settings.log_level, settings.log_file, settings.secrets())
    logger.info("claude-proxy %s on %s:%d → %s (provider %s; models %s / %s / %s)",
                __version__, host, port, settings.openai_base_url, settings.provider_name,
                settings.model_for_tier("big"), settings.model_for_tier("middle"),
                settings.model_for_tier("small"))
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None,
                log_level=settings.log_level.lower(), access_log=False)
    return 0
