"""The streaming `<think>` splitter: every cut of the stream gives the same result."""

from __future__ import annotations

from typing import Any

import pytest

from claude_proxy.conversion.response_converter import StreamConverter, convert_chunks
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.conversion.think_tags import ThinkTagSplitter
from claude_proxy.upstream.chat_completions import ChatCompletionsParser
from tests.scripted_upstream import chunk, transcript_chunks
from tests.sse_grammar import Event, accumulate, check_grammar

SAMPLE = ("<think>\nCompare a<b, then <thinking> about </thin k>. 👍\n</think>\n\n"
          "Answer: use <b>bold</b> and a < sign.")
SAMPLE_THINKING = "\nCompare a<b, then <thinking> about </thin k>. 👍\n"
SAMPLE_TEXT = "\n\nAnswer: use <b>bold</b> and a < sign."


def split(pieces: list[str], *, implicit: bool = False) -> tuple[str, str]:
    splitter = ThinkTagSplitter(implicit_thinking=implicit)
    out = []
    for piece in pieces:
        out.extend(splitter.feed(piece))
    out.extend(splitter.flush())
    return ("".join(text for kind, text in out if kind == "thinking"),
            "".join(text for kind, text in out if kind == "text"))


def test_whole_sample() -> None:
    assert split([SAMPLE]) == (SAMPLE_THINKING, SAMPLE_TEXT)


def test_every_single_cut_gives_the_same_result() -> None:
    for cut in range(len(SAMPLE) + 1):
        assert split([SAMPLE[:cut], SAMPLE[cut:]]) == (SAMPLE_THINKING, SAMPLE_TEXT), cut


def test_every_pair_of_cuts_gives_the_same_result() -> None:
    for first in range(0, len(SAMPLE) + 1, 3):
        for second in range(first, len(SAMPLE) + 1):
            pieces = [SAMPLE[:first], SAMPLE[first:second], SAMPLE[second:]]
            assert split(pieces) == (SAMPLE_THINKING, SAMPLE_TEXT), (first, second)


def test_one_character_at_a_time() -> None:
    assert split(list(SAMPLE)) == (SAMPLE_THINKING, SAMPLE_TEXT)


def test_closing_tag_only() -> None:
    stream = "The template opened the tag.\nSo I reason.</think>\n\nFinal."
    for cut in range(len(stream) + 1):
        assert split([stream[:cut], stream[cut:]], implicit=True) == (
            "The template opened the tag.\nSo I reason.", "\n\nFinal.")


def test_no_tags_at_all_and_false_alarms() -> None:
    for text in ("plain answer", "a < b", "<", "ends with <thi", "<b>x</b>", "  <thinker>"):
        for cut in range(len(text) + 1):
            assert split([text[:cut], text[cut:]]) == ("", text), (text, cut)


def test_kimi_style_tags_and_interleaved_sections() -> None:
    assert split(["◁think▷k1◁/think▷x", "<think>t2</think>y"]) == ("k1t2", "xy")


def test_unclosed_thinking_at_the_end_stays_thinking() -> None:
    assert split(["<think>cut off by max_tokens"]) == ("cut off by max_tokens", "")


# ---------------------------------------------------------------- in the converter


def converter(**options: Any) -> StreamConverter:
    """`options` are the Chat Completions parser's."""
    return StreamConverter("claude-sonnet-4-6", input_tokens=1,
                           sign=ThinkingSigner("k").sign, parser=ChatCompletionsParser(**options))


def blocks(chunks: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    events = [Event(e["type"], e) for e in convert_chunks(chunks, converter(**options))]
    check_grammar(events)
    return list(accumulate(events)["content"])


def content_chunks(text: str, size: int) -> list[dict[str, Any]]:
    return [chunk({"content": text[i:i + size]}) for i in range(0, len(text), size)] + [
        chunk({}, "stop")]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_converter_moves_tagged_text_into_a_thinking_block(size: int) -> None:
    content = blocks(content_chunks(SAMPLE, size), think_tags=True)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in content] == [
        ("thinking", SAMPLE_THINKING), ("text", SAMPLE_TEXT)]


def test_inline_thinking_removed_when_thinking_is_off() -> None:
    content = blocks(content_chunks(SAMPLE, 4), think_tags=True, show_inline_thinking=False)
    assert content == [{"type": "text", "text": SAMPLE_TEXT}]


def test_reasoning_field_first_means_content_is_the_answer() -> None:
    # Groq's parsed format: reasoning in a field, then an untagged answer.
    content = blocks([chunk({"reasoning": "thought"}), chunk({"content": "answer"}),
                      chunk({}, "stop")], think_tags=True)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in content] == [
        ("thinking", "thought"), ("text", "answer")]


@pytest.mark.parametrize("stem", ["groq-r1distill-think-tags", "together-deepseek-r1-think-tags"])
def test_recorded_think_tag_streams(stem: str) -> None:
    chunks = transcript_chunks(stem)
    full = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                   for c in chunks)
    opening, closing = full.index("<think>"), full.index("</think>")
    content = blocks(chunks, think_tags=True)
    assert [b["type"] for b in content] == ["thinking", "text"]
    assert content[0]["thinking"] == full[opening + len("<think>"):closing]
    assert content[1]["text"] == full[closing + len("</think>"):]
