"""Context overflows: every way an upstream says "the prompt does not fit", recognised and
answered as Anthropic's own `prompt is too long: N tokens > M maximum` (HTTP 400
`invalid_request_error`), the error that makes Claude Code compact the conversation and go on.

Providers word it differently (OpenAI/Azure/DeepSeek/OpenRouter/vLLM "maximum context length is
… you requested …", Kimi "exceeded model token limit", GLM "Prompt exceeds max length",
DashScope "Range of input length should be [1, N]", SGLang, llama.cpp's
`exceed_context_size_error` with `n_prompt_tokens`/`n_ctx` and its older 500 "Context size has
been exceeded", Ollama "the input length exceeds the context length", NVIDIA NIM's negative
`max_tokens`, a Responses API `response.failed`) and some answer with a 5xx, which would be
retried and failed over. Recognised here, at the upstream layer, an overflow is a 400 at once:
never retried, never a 5xx, never a failover summary. The numbers come from the body when it
has them, else from the proxy's estimate and the model's known window.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from claude_proxy.errors import ProxyError, error_from_payload, error_from_upstream

_HINTS = ("context_length_exceeded", "maximum context length", "context length",
          "context window", "context size", "exceed_context_size", "prompt exceeds max length",
          "token limit", "input length", "prompt is too long", "reduce the length",
          "longer than the model", "exceeds the model", "range of input length",
          "max_tokens must be at least 1, got -")
_NOT_OVERFLOW = ("per min", "per day", "rate limit", "tpm", "rpm")
_SKIPPED_STATUSES = frozenset({401, 402, 403, 404, 408, 429})
_ANTHROPIC = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_N = r"(\d[\d,]*)"
_LIMIT = re.compile(r"(?:maximum context length (?:is|of)|context (?:size|window|length)\s*"
                    r"(?:is|of)?\s*\(?|token limit:?|limit of|should be \[\s*1\s*,)\s*" + _N,
                    re.IGNORECASE)
_REQUESTED = re.compile(r"(?:requested(?: about| a total of)?|resulted in|request has|"
                        r"request \(|input \(|prompt has|\(requested:)\s*" + _N, re.IGNORECASE)
_NEGATIVE_MAX = re.compile(r"max_tokens must be at least 1, got -(\d+)", re.IGNORECASE)


class ContextOverflow(ProxyError):
    """An upstream's overflow, with whatever numbers its body named."""

    def __init__(self, message: str, requested: int | None = None,
                 limit: int | None = None, short_by: int | None = None) -> None:
        super().__init__(400, message, error_type="invalid_request_error")
        self.requested = requested
        self.limit = limit
        self.short_by = short_by
        """NIM's negative max_tokens: the prompt is this many tokens over the window."""


def too_long(requested: int, limit: int) -> ProxyError:
    """Anthropic's own wording, which Claude Code reads to compact."""
    return ProxyError(400, f"prompt is too long: {requested} tokens > {limit} maximum",
                      error_type="invalid_request_error")


def looks_like_overflow(message: str) -> bool:
    lowered = message.lower()
    return (any(hint in lowered for hint in _HINTS)
            and not any(word in lowered for word in _NOT_OVERFLOW))


def recognised(error: ProxyError, data: Any = None) -> ProxyError:
    """`error` as a ContextOverflow when it is one (whatever its status), else unchanged.
    `data`: the parsed error body, for numbers kept outside the message (llama.cpp)."""
    if error.status in _SKIPPED_STATUSES or isinstance(error, ContextOverflow):
        return error
    fields = _error_fields(data)
    if not looks_like_overflow(error.message) and not _overflow_code(fields):
        return error
    requested = _int(fields.get("n_prompt_tokens")) or _number(_REQUESTED, error.message)
    limit = _int(fields.get("n_ctx")) or _number(_LIMIT, error.message)
    anthropic = _ANTHROPIC.search(error.message)
    if anthropic:
        requested, limit = int(anthropic.group(1)), int(anthropic.group(2))
    short_by = _number(_NEGATIVE_MAX, error.message)
    return ContextOverflow(error.message, requested, limit, short_by)


def from_upstream(status: int, body: bytes, headers: dict[str, str]) -> ProxyError:
    """errors.error_from_upstream, with overflows recognised (a llama.cpp 500 included)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    return recognised(error_from_upstream(status, body, headers), data)


def from_payload(error: Any) -> ProxyError:
    """errors.error_from_payload (an error inside a 200: a stream's first event, a failed
    response), with overflows recognised instead of counted as a transient 502."""
    return recognised(error_from_payload(error), error)


def context_overflow(error: ProxyError, estimate: int,
                     window: int | None = None) -> ProxyError | None:
    """The client's 400 for an upstream overflow, or None when `error` is not one. The body's
    numbers win; else the requested size is the proxy's estimate and the limit the model's
    known window (or, unknown, one less than the size)."""
    overflow = recognised(error) if not isinstance(error, ContextOverflow) else error
    if not isinstance(overflow, ContextOverflow):
        return None
    limit = overflow.limit or window
    requested = overflow.requested
    if requested is None and overflow.short_by is not None and limit:
        requested = limit + overflow.short_by
    if requested is None or (limit is not None and requested <= limit):
        requested = max(estimate, (limit or 0) + 1)
    if not limit or limit >= requested:
        limit = max(requested - 1, 1)
    return too_long(requested, limit)


def _error_fields(data: Any) -> dict[str, Any]:
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return {}
    inner = data.get("error")
    return inner if isinstance(inner, dict) else data


def _overflow_code(fields: dict[str, Any]) -> bool:
    return (fields.get("code") == "context_length_exceeded"
            or fields.get("type") == "exceed_context_size_error")


def _number(pattern: re.Pattern[str], message: str) -> int | None:
    match = pattern.search(message)
    return int(match.group(1).replace(",", "")) if match else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
