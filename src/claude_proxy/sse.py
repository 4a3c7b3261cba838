"""Anthropic events as SSE bytes.

Every event carries `event: <type>`, because the SDKs drop unnamed events. orjson never puts a
newline in its output, so one `data:` line per event is the exact SSE framing; encoding by hand
keeps this hot path to one bytes join per batch. The response (keep-alive pings, disconnects)
is `event_stream.EventStream`; web-search streams still use sse-starlette's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson


def encode_event(event: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event))


def encode_events(events: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(map(encode_event, events))


def decode_frames(frames: Iterable[bytes],
                  containing: bytes | None = None) -> Iterator[dict[str, Any]]:
    """The events of frames `encode_events` made (each `data:` line is one whole event);
    with `containing`, only those whose line holds it (the others are not parsed)."""
    for frame in frames:
        if containing is not None and containing not in frame:
            continue
        for line in frame.split(b"\n"):
            if line.startswith(b"data: ") and (containing is None or containing in line):
                yield orjson.loads(line[6:])
