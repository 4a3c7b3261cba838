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

_HEADS: dict[str, bytes] = {}
"""`event: <type>\ndata: ` per event type (the proxy's own few), made once."""
HEADS_KEPT = 64
"""More types than the API has: a relayed stream's unknown ones are not kept."""
PIECES_HELD = 48
"""Pieces (three per event) joined at a time. orjson (3.13) returns each event's JSON in a
buffer of 4 KiB whatever its length, freed only with the bytes: a batch of 2,000 events (an
upstream read of a fast 20,000-chunk stream) held 8 MiB of them until its one join, which
raised the server's peak RSS by that much. Joined every 16 events, at most 64 KiB are held;
a batch of fewer (nearly all) is still joined once."""


def encode_event(event: dict[str, Any]) -> bytes:
    return encode_events((event,))


def encode_events(events: Iterable[dict[str, Any]]) -> bytes:
    """The events' SSE bytes: each event's head, JSON and blank line, joined once (per batch
    0.4 µs for one text delta, 1.8 µs for eight, against 0.5 and 2.3 µs formatting each
    event's bytes apart, in a loop); a long batch in parts of PIECES_HELD pieces."""
    pieces: list[bytes] = []
    parts: list[bytes] = []
    for event in events:
        kind = event["type"]
        head = _HEADS.get(kind)
        if head is None:
            head = b"event: " + kind.encode() + b"\ndata: "
            if len(_HEADS) < HEADS_KEPT:
                _HEADS[kind] = head
        pieces += (head, orjson.dumps(event), b"\n\n")
        if len(pieces) >= PIECES_HELD:
            parts.append(b"".join(pieces))
            pieces.clear()
    if parts:
        parts.append(b"".join(pieces))
        return b"".join(parts)
    return b"".join(pieces)


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
