"""Anthropic-shaped errors, and the mapping from upstream failures to them.

Every error the proxy returns is `{"type":"error","error":{"type":…,"message":…}}` with the
matching HTTP status, so Anthropic clients (and Claude Code's retry logic) react as they would to
the real API.
"""

from __future__ import annotations

from typing import Any

import orjson

_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

MAX_UPSTREAM_MESSAGE_CHARS = 2000


def error_type_for_status(status: int) -> str:
    """The Anthropic `error.type` for an HTTP status (unlisted 4xx are invalid requests)."""
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


class ProxyError(Exception):
    """An error answered to the client with `status` and an Anthropic error body."""

    payload: Any = None
    """The upstream's error object, when one came inside an answer (error_from_payload): its
    fields may say more than its message (llama.cpp's `n_prompt_tokens` and `n_ctx`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or error_type_for_status(status)
        self.headers = headers or {}
        self.details = details

    def body(self) -> dict[str, Any]:
        """The JSON error body; also the payload of an SSE `error` event."""
        return error_body(self.error_type, self.message, self.details)


def error_body(error_type: str, message: str,
               details: dict[str, Any] | None = None) -> dict[str, Any]:
    """`error.details` (e.g. `{"error_code": "thread_unsupported_request", …}`) is what the
    SDKs read to choose a fallback, so it is sent when known."""
    error: dict[str, Any] = {"type": error_type, "message": message}
    if details is not None:
        error["details"] = details
    return {"type": "error", "error": error}


def upstream_error_message(body: bytes) -> str:
    """The human message inside an upstream error body, whatever its shape."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", errors="replace").strip()
        return text[:MAX_UPSTREAM_MESSAGE_CHARS] or "upstream returned an empty error body"
    return _message_from_json(data)[:MAX_UPSTREAM_MESSAGE_CHARS]


def _message_from_json(data: Any) -> str:
    if isinstance(data, list) and data:
        return _message_from_json(data[0])
    if not isinstance(data, dict):
        return str(data)
    error = data.get("error", data)
    if isinstance(error, str) and error:
        return error
    if isinstance(error, dict):
        message = error.get("message") or error.get("msg") or error.get("detail")
        metadata = error.get("metadata")
        raw = metadata.get("raw") if isinstance(metadata, dict) else None
        if isinstance(message, str) and message:
            if isinstance(raw, str) and raw and raw not in message:
                return f"{message} ({raw})"
            return message
    for key in ("message", "detail"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return orjson.dumps(data).decode()


def error_from_upstream(status: int, body: bytes, headers: dict[str, str]) -> ProxyError:
    """Turn an upstream non-2xx answer into the client's error, keeping status and retry-after."""
    forwarded: dict[str, str] = {name: headers[name] for name in ("retry-after", "retry-after-ms")
                 if name in headers}
    return ProxyError(status, upstream_error_message(body), headers=forwarded)


def error_from_payload(error: Any) -> ProxyError:
    """An `{"error": …}` object sent with a 200 (inside a stream or as the whole body).

    Its numeric `code`, when it is an HTTP status, is kept; anything else counts as a
    transient upstream failure, which Claude Code retries.
    """
    if isinstance(error, dict):
        message = _message_from_json({"error": error})
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code <= 599 else 502
        failure = ProxyError(status, message,
                             error_type="overloaded_error" if status >= 500 else None)
        failure.payload = error
        return failure
    return ProxyError(502, str(error), error_type="overloaded_error")
