"""The `data` of each event of an upstream's SSE body, read from its bytes as they come.

The proxy reads nothing of an upstream event but its data (every wire format it speaks puts
the event's type in the JSON too). httpx-sse's decoders, used until the fifth round of issue
45, turned each read into text, split it into lines and built an event object per event, in
Python: on a 20,000-chunk stream, 12 % of the proxy's samples (py-spy), for what the block
machine never reads. This reads the bytes with `split` and `startswith` only, and hands on
each event's data as bytes, which orjson parses as they are.

It follows the SSE grammar (the HTML standard's "event stream interpretation"): lines end
with CRLF, LF or CR, also when the two bytes of a CRLF come in two reads; a UTF-8 byte order
mark at the very start is dropped; a line starting with `:` is a comment; a field's value
loses one leading space; the values of several `data` lines are joined by LF; a blank line
ends the event; fields other than `data`, and an event the body ends before its blank line,
are dropped. An event stream is UTF-8 by definition, whatever its content type says.
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"


class DataReader:
    """Feed it each read of the body; it returns the data of the events each completes."""

    __slots__ = ("_data", "_pending", "_started")

    def __init__(self) -> None:
        self._pending = b""
        """The start of a line the next read ends (and a CR that may be half a CRLF)."""
        self._data: list[bytes] = []
        """The `data` values of the event being read."""
        self._started = False

    def feed(self, read: bytes) -> list[bytes]:
        if not self._started:
            if len(self._pending) + len(read) < len(_BOM) and _BOM.startswith(
                    self._pending + read):
                self._pending += read  # too short yet to tell a mark from data
                return []
            read, self._pending, self._started = self._pending + read, b"", True
            if read.startswith(_BOM):
                read = read[len(_BOM):]
        text = self._pending + read if self._pending else read
        held = b""
        if b"\r" in text:
            if text.endswith(b"\r"):  # perhaps the first half of a CRLF: its line waits
                text, held = text[:-1], b"\r"
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = text.split(b"\n")
        self._pending = lines.pop() + held
        found: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    found.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data"):
                value = line[4:]
                if value.startswith(b":"):
                    data.append(value[2:] if value.startswith(b": ") else value[1:])
                elif not value:
                    data.append(b"")  # `data` alone: an empty value
        return found
