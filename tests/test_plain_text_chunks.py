"""A stream's plain text chunks are read by the Chat Completions parser's fast path
(`_plain_text`): whatever the chunks around them, the deltas are exactly those the whole path
gives (checked against a parser whose fast path is off)."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from claude_proxy.upstream.chat_completions import ChatCompletionsParser


class WholePath(ChatCompletionsParser):
    def _plain_text(self, chunk: dict[str, Any]) -> str | None:
        return None


TEXTS = st.sampled_from(["tok ", "", "<think>", "a</think>b", " <thi", "nk>x", "\n", "{\"name\""])
DELTAS = st.one_of(
    st.builds(lambda text: {"content": text}, TEXTS),
    st.builds(lambda text: {"role": "assistant", "content": text}, TEXTS),
    st.builds(lambda text: {"content": text, "reasoning_content": None}, TEXTS),
    st.builds(lambda text: {"reasoning_content": text}, TEXTS),
    st.builds(lambda text: {"content": text, "refusal": None}, TEXTS),
    st.builds(lambda text: {"content": "tok ", "reasoning_content": text}, TEXTS),
    st.just({"reasoning_details": [{"type": "reasoning.encrypted", "data": "e", "index": 0}]}),
    st.just({"reasoning_details": [{"type": "reasoning.text", "text": "r", "index": 0}]}),
    st.just({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                             "function": {"name": "Read", "arguments": "{}"}}]}),
    st.just({}), st.just(None))
CHOICES = st.builds(
    lambda delta, finish, usage: {"index": 0, "delta": delta, "finish_reason": finish,
                                  **({"usage": {"prompt_tokens": 1}} if usage else {})},
    DELTAS, st.sampled_from([None, None, None, "", "stop", "tool_calls"]),
    st.integers(0, 5).map(lambda n: n == 0))
CHUNKS = st.one_of(
    st.builds(lambda choice: {"id": "c", "object": "chat.completion.chunk", "choices": [choice]},
              CHOICES),
    st.builds(lambda choice: {"choices": [choice], "usage": None}, CHOICES),
    st.builds(lambda choice: {"choices": [choice], "usage": {"prompt_tokens": 3}}, CHOICES),
    st.builds(lambda choice: {"choices": [choice], "x_groq": {"usage": {"prompt_tokens": 2}}},
              CHOICES),
    st.just({"choices": []}), st.just({"error": {"message": "boom"}}),
    st.just({"choices": "no"}), st.just({"choices": [{"index": 0, "delta": {"content": "x"},
                                                       "usage": {"prompt_tokens": 4}}]}))
OPTIONS = st.fixed_dictionaries({
    "think_tags": st.booleans(), "leading_think_tags": st.booleans(),
    "show_inline_thinking": st.booleans()})


def _plain(delta: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


OFF: dict[str, Any] = {"think_tags": False, "leading_think_tags": False,
                       "show_inline_thinking": True}


@settings(max_examples=400, deadline=None)
@given(st.lists(CHUNKS, max_size=12), OPTIONS)
@example([_plain({"reasoning_details": [{"type": "reasoning.encrypted", "data": "e",
                                         "index": 0}]}), _plain({"content": "tok "})], OFF)
@example([_plain({"content": "tok ", "reasoning_content": "r"})], OFF)
@example([{"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]}], OFF)
def test_any_stream_gives_the_whole_paths_deltas(chunks: list[dict[str, Any]],
                                                 options: dict[str, Any]) -> None:
    fast, whole = ChatCompletionsParser(**options), WholePath(**options)
    assert [fast.parse(chunk) for chunk in chunks] + [fast.flush()] == \
        [whole.parse(chunk) for chunk in chunks] + [whole.flush()]


def test_a_plain_text_chunk_takes_the_fast_path() -> None:
    parser = ChatCompletionsParser(leading_think_tags=True)
    parser.parse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]})
    chunk = {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": None}]}
    assert parser._plain_text(chunk) == " there"
