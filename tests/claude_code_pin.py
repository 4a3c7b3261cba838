"""Which Claude Code the end-to-end tests run: `$CLAUDE_BIN`, else the Makefile's pin
(`CLAUDE_CODE_VERSION`), installed per version under `.cache/claude-code-<version>` so that
pins (and `make test-claude-latest`'s `latest`) never share a folder."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PIN = re.compile(r"^CLAUDE_CODE_VERSION\s*:?=\s*(\S+)\s*$", re.MULTILINE)
BINARY = "node_modules/@anthropic-ai/claude-code-linux-x64/claude"


def pinned_version() -> str:
    """The version `make test` installs (one place: the Makefile)."""
    found = _PIN.search((ROOT / "Makefile").read_text(encoding="utf-8"))
    assert found is not None, "Makefile: CLAUDE_CODE_VERSION := X.Y.Z not found"
    return found.group(1)


def default_claude_bin() -> Path:
    """`$CLAUDE_BIN` (relative to the repository when not absolute), else the pin's binary."""
    configured = os.environ.get("CLAUDE_BIN")
    path = Path(configured) if configured else (
        Path(".cache") / f"claude-code-{pinned_version()}" / BINARY)
    return path if path.is_absolute() else ROOT / path


def environment(url: str, home: Path, tmp: Path) -> dict[str, str]:
    """Claude Code's environment for a run against the proxy at `url`: isolated HOME and
    TMPDIR, no traffic but the proxy's, no retries."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "TMPDIR": str(tmp), "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "sk-claude-code-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}


def newest_claude_bin() -> Path:
    """`$CLAUDE_BIN_NEWEST`, else what `make test-claude-latest` installed."""
    configured = os.environ.get("CLAUDE_BIN_NEWEST")
    path = Path(configured) if configured else Path(".cache") / "claude-code-latest" / BINARY
    return path if path.is_absolute() else ROOT / path


def version_of(binary: Path) -> str | None:
    """The version in the package.json beside a native binary (None when not installed)."""
    try:
        return str(json.loads((binary.parent / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def claude_binaries() -> dict[str, Path]:
    """The Claude Code releases the "pinned and newest" tests run: the pin, and the newest
    when one is installed that is another release (today's pin is npm's latest, and running
    the same binary twice proves nothing)."""
    pinned, newest = default_claude_bin(), newest_claude_bin()
    found = {"pinned": pinned}
    if os.access(newest, os.X_OK) and version_of(newest) != version_of(pinned):
        found["newest"] = newest
    return found
