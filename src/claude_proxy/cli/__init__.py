"""The commands: `claude-proxy` (serve), `doctor`, `env`, `claude`, `keys`."""

from claude_proxy.cli.command_line import main

__all__ = ["main"]
