"""Logging set-up: console plus a rotating file, with secrets redacted at every level."""

from __future__ import annotations

import logging
import logging.handlers
import re
from pathlib import Path

_HEADER_SECRET = re.compile(
    r"(?i)((?:authorization|x-api-key|api-key)['\"]?\s*[:=]\s*['\"]?)(?:bearer\s+)?[^\s'\",}]+")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_KEY_LIKE = re.compile(r"\b(sk-[A-Za-z0-9_-]{6})[A-Za-z0-9_-]+")
REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter values (test keys like "k") would shred every log line
LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, REDACTED)
    text = _HEADER_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _KEY_LIKE.sub(lambda m: m.group(1) + "…" + REDACTED, text)


class RedactingFilter(logging.Filter):
    """Rewrites every record so that configured keys and auth headers never reach a handler."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = sorted(secrets, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "redacted", False):  # already done by the other handler
            return True
        record.redacted = True
        message = record.getMessage()
        record.msg = redact(message, self._secrets)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(
                logging.Formatter().formatException(record.exc_info), self._secrets)
            record.exc_info = None
        return True


def configure_logging(level: str, log_file: str | None, secrets: list[str]) -> None:
    """Attach console and file handlers to the root logger (uvicorn's loggers included)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(LOG_FORMAT)
    redactor = RedactingFilter(secrets)
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            log_file, maxBytes=10 * 1024 * 1024, backupCount=5, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(redactor)
        root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    for noisy in ("httpx", "httpcore", "sse_starlette", "hpack"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
