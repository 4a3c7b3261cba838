"""Logging set-up: stdout plus an optional rotating file, with secrets redacted at every level
and every control character escaped, so that no value a client sent can begin a line.

Logging never stops the proxy: a LOG_FILE that cannot be opened (a read-only folder, a volume
owned by another user in a container) is one WARNING on stdout, and the proxy goes on without
the file."""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
from pathlib import Path

_HEADER_SECRET = re.compile(
    r"(?i)((?:authorization|x-api-key|api-key)['\"]?\s*[:=]\s*['\"]?)(?:bearer\s+)?[^\s'\",}]+")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_KEY_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_-]{6})[A-Za-z0-9_-]+")
REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter values (test keys like "k") would shred every log line
LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


_PATTERN_WORDS = ("authorization", "api-key", "bearer")
"""Every match of the patterns below contains one of these (lowercased) or `sk-`: a line with
none of them (every access line) skips the three regular expressions (~9 µs a line)."""


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    if "sk-" not in text:
        lowered = text.lower()
        if not any(word in lowered for word in _PATTERN_WORDS):
            return text
    text = _HEADER_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _KEY_LIKE.sub(lambda m: m.group(1) + "…" + REDACTED, text)


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""What must not reach a log line as it is: C0 and C1 control characters (line breaks, NUL,
terminal escapes), Unicode's line and paragraph separators, bidirectional overrides (which
reorder what a reader sees), and lone surrogates (which no UTF-8 file can hold)."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(text: str) -> str:
    """`text` with each character `_UNSAFE` matches written as an escape (`\\n`, `\\r`,
    `\\t`, else `\\u0000`): one line, whatever a client put into the values it quotes."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda match: _NAMED.get(match.group()) or f"\\u{ord(match.group()):04x}",
                       text)


def _traceback_lines(text: str) -> str:
    """A traceback's lines, each escaped and indented: the exception's message may quote a
    client's value, which then cannot begin a line either."""
    return "\n".join("  " + escaped(line) for line in text.split("\n"))


class RedactingFilter(logging.Filter):
    """Rewrites every record so that configured keys and auth headers never reach a handler,
    and its message is one line (`escaped`), every logger's (uvicorn's too) at every call
    site: none can forget."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = sorted(secrets, key=len, reverse=True)

    def add(self, secrets: list[str]) -> None:
        """Secrets configured since (a reload): redacted from now on too."""
        self._secrets = sorted(set(self._secrets) | set(secrets), key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "redacted", False):  # already done by the other handler
            return True
        record.redacted = True
        message = record.getMessage()
        record.msg = escaped(redact(message, self._secrets))
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = _traceback_lines(redact(
                logging.Formatter().formatException(record.exc_info), self._secrets))
            record.exc_info = None
        return True


class OnceFormatter(logging.Formatter):
    """Formats a record once for all the handlers that share it (stdout and the file): the
    line is kept on the record. Safe because the redacting filter has already made the
    record's message final before any handler formats it."""

    def format(self, record: logging.LogRecord) -> str:
        line: str | None = getattr(record, "formatted_line", None)
        if line is None:
            line = super().format(record)
            record.formatted_line = line
        return line


class RotatingLog(logging.handlers.RotatingFileHandler):
    """The standard rotating file, minus its per-record overhead: the standard handler formats
    every record twice and stats, seeks and tells the file before each write to decide on a
    rollover (three syscalls and a second format per access-log line). This one formats
    once and counts what it wrote; like the standard one, it only knows its own writes."""

    def __init__(self, filename: str, max_bytes: int, backups: int) -> None:
        super().__init__(filename, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        # Opened for appending: the position is the file's current size.
        self._size = self.stream.tell() if self.stream is not None else 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            if self._size and self._size + len(line) >= self.maxBytes:
                self.doRollover()
                self._size = 0
            if self.stream is None:
                self.stream = self._open()
            self.stream.write(line)
            self.stream.flush()
            self._size += len(line)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def open_log_file(log_file: str) -> logging.Handler | None:
    """The rotating file handler (10 MB, 5 kept), or None after one WARNING when the file
    cannot be opened: a missing log file must never keep the proxy from serving."""
    try:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        return RotatingLog(log_file, max_bytes=10 * 1024 * 1024, backups=5)
    except OSError as error:
        logging.getLogger("claude_proxy").warning(
            "LOG_FILE %s cannot be opened (%s: %s): logging to stdout only", log_file,
            error.strerror or type(error).__name__, error.filename or log_file)
        return None


def configure_logging(level: str, log_file: str | None, secrets: list[str]) -> None:
    """Attach stdout and file handlers to the root logger (uvicorn's loggers included)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    formatter = OnceFormatter(LOG_FORMAT)
    redactor = RedactingFilter(secrets)

    def attach(handler: logging.Handler) -> None:
        handler.setFormatter(formatter)
        handler.addFilter(redactor)
        root.addHandler(handler)

    attach(logging.StreamHandler(sys.stdout))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    for noisy in ("httpx", "httpcore", "sse_starlette", "hpack"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    file_handler = open_log_file(log_file) if log_file else None
    if file_handler is not None:
        attach(file_handler)


def redact_also(secrets: list[str]) -> None:
    """Secrets a reload brought (a new key): every handler's redaction takes them too."""
    for handler in logging.getLogger().handlers:
        for found in handler.filters:
            if isinstance(found, RedactingFilter):
                found.add(secrets)
