"""Logging set-up: stdout always, the log file when it can be opened, and a LOG_FILE that
cannot be opened is one WARNING, never an exception (it used to kill the container)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_proxy.logs import RotatingLog, configure_logging


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """configure_logging replaces the root handlers: keep the suite's own and put them back."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    root.handlers = []
    yield root
    for handler in root.handlers:
        handler.close()
    root.handlers = saved
    root.setLevel(level)


def stdout_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Captured stdout lines without the timestamp (everything before the level)."""
    return [line.split(" ", 2)[2] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(("relative", "reason"), [
    # Root can write anywhere (CI runs as root): these two fail for every user.
    ("", "Is a directory: {tmp}"),
    ("a-file/claude-proxy.log", "File exists: {tmp}/a-file"),
])
def test_a_log_file_that_cannot_be_opened_is_one_warning_and_stdout_goes_on(
        relative: str, reason: str, tmp_path: Path, root_logger: logging.Logger,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / relative
    configure_logging("INFO", str(path), ["sk-secret-value-123"])
    logging.getLogger("claude_proxy").info("still serving with sk-secret-value-123")
    pid = os.getpid()
    assert stdout_lines(capsys) == [
        f"WARNING [{pid}] claude_proxy: LOG_FILE {path} cannot be opened "
        f"({reason.format(tmp=tmp_path)}): "
        "logging to stdout only",
        f"INFO [{pid}] claude_proxy: still serving with [REDACTED]",
    ]
    assert len(root_logger.handlers) == 1


def test_a_writable_log_file_gets_the_same_lines_as_stdout(
        tmp_path: Path, root_logger: logging.Logger,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new-folder" / "claude-proxy.log"
    configure_logging("INFO", str(path), [])
    logging.getLogger("claude_proxy").info("one line")
    for handler in root_logger.handlers:
        handler.flush()
    assert stdout_lines(capsys) == [f"INFO [{os.getpid()}] claude_proxy: one line"]
    assert [line.split(" ", 2)[2] for line in path.read_text().splitlines()] == [
        f"INFO [{os.getpid()}] claude_proxy: one line"]


def test_the_log_file_rotates_at_its_size_and_keeps_every_line_once(tmp_path: Path) -> None:
    """RotatingLog counts what it writes instead of asking the file before each line."""
    path = tmp_path / "claude-proxy.log"
    path.write_text("x" * 100 + "\n", encoding="utf-8")  # an earlier run's line counts too
    handler = RotatingLog(str(path), max_bytes=1000, backups=2)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("test.rotation")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        for number in range(40):
            logger.info("line %02d %s", number, "y" * 40)  # 49 bytes with its newline
    finally:
        logger.removeHandler(handler)
        handler.close()
    files = [path.with_name(path.name + suffix) for suffix in (".2", ".1", "")]
    assert [f.stat().st_size for f in files] == [101 + 18 * 49, 20 * 49, 2 * 49]
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    assert lines == ["x" * 100] + [f"line {n:02d} {'y' * 40}" for n in range(40)]
