"""The data of an upstream's SSE events read from its bytes (upstream/sse_data.py): the same
data, event for event, as httpx-sse's spec-compliant decoders give for the text, however the
body is cut into network reads."""

from __future__ import annotations

from httpx_sse._decoders import SSEDecoder, SSELineDecoder
from hypothesis import given, settings
from hypothesis import strategies as st

from claude_proxy.upstream.sse_data import DataReader

ENDS = st.sampled_from(["\n", "\r\n", "\r"])
VALUES = st.lists(st.sampled_from([*"ab :{}\"é日\u2028", "data"]), max_size=8).map("".join)
LINES = st.one_of(
    st.builds(lambda value, space: f"data:{' ' if space else ''}{value}", VALUES, st.booleans()),
    st.just("data"), st.just(""), st.just(""),
    st.builds(lambda value: f": {value}", VALUES),  # a comment
    st.builds(lambda field, value: f"{field}: {value}",
              st.sampled_from(["event", "id", "retry", "dataX", "Data"]), VALUES))


def whole(text: str) -> list[str]:
    """The oracle: httpx-sse's line and event decoders over the whole text."""
    lines, events = SSELineDecoder(), SSEDecoder()
    found = []
    for line in lines.decode(text):
        event = events.decode(line)
        if event is not None and event.data:
            found.append(event.data)
    return found


def read(body: bytes, cuts: list[int]) -> list[str]:
    reader, found, start = DataReader(), [], 0
    for cut in [*sorted(cuts), len(body)]:
        found += [data.decode() for data in reader.feed(body[start:cut]) if data]
        start = cut
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LINES, ENDS), max_size=25), st.lists(st.integers(0, 400), max_size=8))
def test_any_body_cut_anywhere_gives_the_decoders_data(lines: list[tuple[str, str]],
                                                       cuts: list[int]) -> None:
    text = "".join(line + end for line, end in lines)
    body = text.encode()
    assert read(body, [cut for cut in cuts if cut <= len(body)]) == whole(text)


def test_a_crlf_split_between_two_reads_ends_one_line() -> None:
    reader = DataReader()
    assert reader.feed(b'data: {"a":1}\r') == []
    assert reader.feed(b"\n\r") == []
    assert reader.feed(b"\ndata: 2\r\r") == [b'{"a":1}']
    assert reader.feed(b"") == []
    assert reader.feed(b"x") == [b"2"]


def test_a_leading_byte_order_mark_is_dropped_even_in_pieces() -> None:
    reader = DataReader()
    assert reader.feed(b"\xef") == [] and reader.feed(b"\xbb") == []
    assert reader.feed(b"\xbfdata: 1\n\ndata:2\n\n") == [b"1", b"2"]
