"""Anthropic events framed as named SSE events (sse-starlette does the framing).

Every event carries `event: <type>` because the SDKs drop unnamed events. The events produced
from one upstream read are joined into one write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from sse_starlette import ServerSentEvent

SEPARATOR = "\n"


def encode_events(events: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(
        ServerSentEvent(data=orjson.dumps(event).decode(), event=event["type"],
                        sep=SEPARATOR).encode()
        for event in events
    )
