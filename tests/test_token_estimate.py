"""The plain token estimate (routing/tokens.py): four bytes of the prompt's JSON a token, made
at C speed; base64 payloads are not prompt text, media count a fixed amount, text documents
count their text, and a recorded Claude Code conversation grows it by what was added."""

from __future__ import annotations

import json
from typing import Any

import orjson
from bench.conversation import grown, read_turn

from claude_proxy.conversion.usage import estimate_tokens
from claude_proxy.routing.tokens import TOKENS_PER_MEDIA_BLOCK, estimate_request_tokens

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo" * 5000}}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


def test_a_string_prompt_is_its_json_bytes_over_four() -> None:
    body = {"messages": [{"role": "user", "content": "héllo wörld " * 100}]}
    assert estimate_request_tokens(body) == estimate_tokens(len(orjson.dumps(body["messages"])))


def test_image_data_is_not_text_but_the_image_counts() -> None:
    body = user(IMAGE, {"type": "text", "text": "what is in this picture?"})
    data = IMAGE["source"]["data"]  # type: ignore[index]
    json_bytes = len(orjson.dumps(body["messages"])) - len(data)
    assert estimate_request_tokens(body) == estimate_tokens(json_bytes) + TOKENS_PER_MEDIA_BLOCK


def test_signatures_are_not_text() -> None:
    short = {"type": "thinking", "thinking": "hmm", "signature": "c2ln"}
    long = {"type": "thinking", "thinking": "hmm", "signature": "c2ln" * 10_000}
    body = {"messages": [{"role": "assistant", "content": [short]}]}
    longer = {"messages": [{"role": "assistant", "content": [long]}]}
    assert estimate_request_tokens(body) == estimate_request_tokens(longer)


def test_a_text_document_counts_its_text_and_no_media() -> None:
    words = "a quoted \"text\" with spaces " * 200
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                               "data": words}}
    assert estimate_request_tokens(user(document)) > len(words) // 4
    assert estimate_request_tokens(user(document)) < TOKENS_PER_MEDIA_BLOCK


def test_a_text_that_names_a_payload_key_is_still_text() -> None:
    trap = {"type": "text", "text": '"data":"AAAA' + "A" * 4000 + '" "type":"image"'}
    estimate = estimate_request_tokens(user(trap))
    assert estimate == estimate_tokens(len(orjson.dumps(user(trap)["messages"])))


def test_a_body_deeper_than_orjson_goes_is_estimated() -> None:
    block: dict[str, Any] = {"type": "x", "content": []}
    for _ in range(300):
        block = {"type": "x", "content": [block]}
    assert estimate_request_tokens(user(block)) > 300


def test_a_file_read_turn_adds_about_its_own_size() -> None:
    body = grown(200)
    before = estimate_request_tokens(body)
    body["messages"].extend(read_turn(999))
    added = len(orjson.dumps(read_turn(999)))
    assert abs(estimate_request_tokens(body) - before - added / 4) <= 2


def test_the_clients_own_compact_json_gives_the_same_estimate() -> None:
    body = grown(200)
    body["system"] = "A system prompt as a string, with a \"quote\" and a line\nbreak: é"
    expected = estimate_request_tokens(body)
    written_by_node = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert estimate_request_tokens(body, raw=orjson.dumps(body)) == expected
    assert estimate_request_tokens(body, raw=written_by_node) == expected


def test_json_with_spaces_or_escapes_is_not_measured_by_its_length() -> None:
    body = user({"type": "text", "text": "日本語のテキスト " * 500})
    expected = estimate_request_tokens(body)
    escaped = json.dumps(body).encode()  # Python's default: spaces, \uXXXX for every character
    assert len(escaped) > 1.9 * len(orjson.dumps(body))
    assert estimate_request_tokens(body, raw=escaped) == expected
    spaced = json.dumps(body, ensure_ascii=False).encode()
    assert estimate_request_tokens(body, raw=spaced) == expected


def test_payloads_in_the_clients_json_are_left_out_as_well() -> None:
    body = user(IMAGE, {"type": "text", "text": "what is in this picture?"})
    assert estimate_request_tokens(body, raw=orjson.dumps(body)) == estimate_request_tokens(body)
    assert estimate_request_tokens(body) < 2 * TOKENS_PER_MEDIA_BLOCK
