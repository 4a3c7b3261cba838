"""The Responses API without a server: the request builder, the event parser fed with the
real recordings, and the opaque-reasoning envelope."""

from __future__ import annotations

import json
from typing import Any

import pytest

from claude_proxy.config.settings import Settings
from claude_proxy.conversion.response_converter import (
    StreamConverter,
    collect_message,
    convert_chunks,
)
from claude_proxy.conversion.signatures import Origin, ThinkingSigner
from claude_proxy.upstream import chat_completions, responses
from tests.scripted_upstream import OPAQUE, recorded_turns
from tests.sse_grammar import Event, check_grammar

SIGNER = ThinkingSigner("responses-unit-secret")
ORIGIN = Origin("openai", "gpt-5.1-codex-max", SIGNER.key_fingerprint("sk-one"))
STEM = "openai-responses-stream-reasoning-encrypted-tools"


def converter() -> StreamConverter:
    def sign(thinking: str, opaque: list[dict[str, Any]] | None = None, /) -> str:
        return SIGNER.sign(thinking, opaque, origin=ORIGIN)
    return StreamConverter("claude-sonnet-4-6", input_tokens=5, sign=sign,
                           message_id="msg_unit", parser=responses.ResponsesParser())


def run(events: list[dict[str, Any]]) -> dict[str, Any]:
    out = convert_chunks(events, converter())
    check_grammar([Event(event["type"], event) for event in out])
    return collect_message(out)


def turn(number: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in recorded_turns(STEM)[number]]


def done_item(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(e["item"] for e in events
                if e["type"] == "response.output_item.done" and e["item"]["type"] == kind)


# ---------------------------------------------------------------- parser


def test_recorded_stream_reasoning_summary_and_tool_call() -> None:
    events = turn(0)
    message = run(events)
    reasoning = done_item(events, "reasoning")
    call = done_item(events, "function_call")
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
    thinking, tool = message["content"]
    assert thinking["thinking"] == reasoning["summary"][0]["text"]
    assert (tool["id"], tool["name"], tool["input"]) == (
        "call_AB6AaRZ1FYZB2RwS6A5vbdqn", "calculator", {"a": 12, "b": 7, "op": "add"})
    envelope = SIGNER.verify(thinking["thinking"], thinking["signature"])
    assert envelope is not None and envelope.origin == ORIGIN
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    assert added["encrypted_content"] != reasoning["encrypted_content"]  # partial copy
    assert envelope.opaque == [
        {"type": "reasoning", "id": reasoning["id"],
         "encrypted_content": reasoning["encrypted_content"]},
        {"type": "function_call", "id": call["id"], "call_id": call["call_id"]}]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 134, "output_tokens": 28,
                                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def test_recorded_stream_text_turn() -> None:
    message = run(turn(3))
    assert message["content"] == [{"type": "text", "text": "The final result is **570**."}]
    assert message["stop_reason"] == "end_turn"


def test_summary_parts_are_joined_by_a_blank_line() -> None:
    events = [{"type": "response.output_item.added", "item": {"type": "reasoning", "id": "rs_1"}},
              {"type": "response.reasoning_summary_part.added", "summary_index": 0},
              {"type": "response.reasoning_summary_text.delta", "delta": "**One**"},
              {"type": "response.reasoning_summary_part.added", "summary_index": 1},
              {"type": "response.reasoning_summary_text.delta", "delta": "**Two**"},
              {"type": "response.output_item.done", "item": {
                  "type": "reasoning", "id": "rs_1", "encrypted_content": "enc"}},
              {"type": "response.output_text.delta", "delta": "answer"},
              {"type": "response.completed", "response": {"usage": None}}]
    message = run(events)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in message["content"]] == [
        ("thinking", "**One**\n\n**Two**"), ("text", "answer")]


def test_encrypted_reasoning_without_summary_is_an_empty_thinking_block() -> None:
    events = [{"type": "response.output_item.done", "item": {
                  "type": "reasoning", "id": "rs_2", "encrypted_content": "gAAAA-opaque"}},
              {"type": "response.output_text.delta", "delta": "hi"},
              {"type": "response.completed", "response": {}}]
    thinking, text = run(events)["content"]
    assert thinking["thinking"] == "" and text["text"] == "hi"
    envelope = SIGNER.verify("", thinking["signature"])
    assert envelope is not None and envelope.opaque[0]["encrypted_content"] == "gAAAA-opaque"


@pytest.mark.parametrize(("reason", "stop"), [("max_output_tokens", "max_tokens"),
                                              ("content_filter", "refusal")])
def test_incomplete(reason: str, stop: str) -> None:
    message = run([{"type": "response.output_text.delta", "delta": "cut"},
                   {"type": "response.incomplete", "response": {
                       "incomplete_details": {"reason": reason},
                       "usage": {"input_tokens": 10, "output_tokens": 16,
                                 "input_tokens_details": {"cached_tokens": 4},
                                 "output_tokens_details": {"reasoning_tokens": 12}}}}])
    assert message["stop_reason"] == stop
    assert message["usage"]["cache_read_input_tokens"] == 4
    assert message["usage"]["input_tokens"] == 6 and message["usage"]["output_tokens"] == 16


@pytest.mark.parametrize(("event", "status", "message"), [
    ({"type": "error", "code": "rate_limit_exceeded", "message": "slow down"}, 429,
     "slow down"),
    ({"type": "error", "error": {"type": "invalid_request_error", "code": None,
                                 "message": "bad input"}}, 400, "bad input"),
    ({"type": "response.failed", "response": {"status": "failed", "error": {
        "code": "server_error", "message": "boom"}}}, 500, "boom"),
])
def test_errors_nested_or_not(event: dict[str, Any], status: int, message: str) -> None:
    payload = responses.error_of(event)
    assert payload == {"message": message, "code": status}


def test_recorded_json_reply_through_the_same_parser() -> None:
    body = json.loads((OPAQUE / "openai-responses-nonstream-encrypted.json").read_text())
    message = run(list(responses.response_events(body)))
    thinking, text = message["content"]
    assert thinking["thinking"] == body["output"][0]["summary"][0]["text"]
    assert text["text"] == body["output"][1]["content"][0]["text"]
    envelope = SIGNER.verify(thinking["thinking"], thinking["signature"])
    assert envelope is not None
    assert envelope.opaque[0]["encrypted_content"] == body["output"][0]["encrypted_content"]
    assert message["usage"]["input_tokens"] == 865 and message["usage"]["output_tokens"] == 163


# ---------------------------------------------------------------- request builder


def settings(**overrides: Any) -> Settings:
    return Settings(openai_api_key="k", provider="openai", **overrides)


TOOLS = [{"name": "calculator", "description": "Adds.",
          "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}}}]


def test_request_shape() -> None:
    request = {"model": "gpt-5", "max_tokens": 1, "system": "Be brief.", "temperature": 0.3,
               "top_p": 0.9, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "calculator",
                                                "disable_parallel_tool_use": True},
               "thinking": {"type": "adaptive"}, "output_config": {"effort": "low"},
               "stream": True, "messages": [{"role": "user", "content": "add"}]}
    upstream = responses.convert_request(request, settings(reasoning_verbosity="low"))
    assert upstream.api == "responses" and upstream.thinking
    assert upstream.body == {
        "model": "gpt-5", "instructions": "Be brief.",
        "input": [{"role": "user", "content": "add"}],
        "tools": [{"type": "function", "name": "calculator", "description": "Adds.",
                   "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}],
        "tool_choice": {"type": "function", "name": "calculator"},
        "parallel_tool_calls": False,
        "max_output_tokens": 16,
        "reasoning": {"effort": "low", "summary": "auto"}, "text": {"verbosity": "low"},
        "store": False, "include": ["reasoning.encrypted_content"], "stream": True}


def test_refused_summary_and_refused_reasoning() -> None:
    request = {"model": "o3", "max_tokens": 100000, "thinking": {"type": "adaptive"},
               "messages": [{"role": "user", "content": "hi"}]}
    plain = responses.convert_request(request, settings(), without_summary=True).body
    assert plain["reasoning"] == {"effort": "medium"} and plain["max_output_tokens"] == 32768
    assert "reasoning" not in responses.convert_request(request, settings(),
                                                        without_reasoning=True).body
    assert responses.refused_summary(
        "Your organization must be verified to generate reasoning summaries.")


def test_history_restores_reasoning_in_place_and_pairs_the_call() -> None:
    events = turn(0)
    message = run(events)
    thinking, tool = message["content"]
    history = [{"role": "user", "content": "compute"},
               {"role": "assistant", "content": [thinking, tool]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool["id"],
                                             "content": "19"}]}]

    def opaque_for(block: dict[str, Any]) -> list[dict[str, Any]]:
        envelope = SIGNER.verify(block.get("thinking", ""), block.get("signature", ""))
        return envelope.opaque if envelope and envelope.origin == ORIGIN else []

    items = responses.input_items(history, opaque_for)
    reasoning = done_item(events, "reasoning")
    assert items == [
        {"role": "user", "content": "compute"},
        {"type": "reasoning", "id": reasoning["id"],
         "encrypted_content": reasoning["encrypted_content"], "summary": []},
        {"type": "function_call", "call_id": "call_AB6AaRZ1FYZB2RwS6A5vbdqn",
         "name": "calculator", "arguments": '{"a":12,"b":7,"op":"add"}',
         "id": done_item(events, "function_call")["id"]},
        {"type": "function_call_output", "call_id": "call_AB6AaRZ1FYZB2RwS6A5vbdqn",
         "output": "19"}]
    # Nothing restored → the call goes without its fc_ id (never an orphan pairing).
    bare = responses.input_items(history, lambda block: [])
    assert [item.get("type") for item in bare] == [None, "function_call",
                                                   "function_call_output"]
    assert "id" not in bare[1]


def test_azure_endpoint_uses_the_deployment() -> None:
    azure = Settings(openai_api_key="k", provider="azure", azure_api_version="2024-12-01-preview",
                     openai_base_url="https://res.openai.azure.com/openai/deployments/my-gpt5")
    assert responses.endpoint(azure) == responses.Endpoint(
        "https://res.openai.azure.com/openai/v1/responses", "my-gpt5")
    body = responses.convert_request({"model": "claude-sonnet-4-6", "max_tokens": 10,
                                      "messages": [{"role": "user", "content": "x"}]}, azure).body
    assert body["model"] == "my-gpt5"


# ---------------------------------------------------------------- envelope


def test_envelope_round_trip_tamper_and_size() -> None:
    body = json.loads((OPAQUE / "openai-responses-nonstream-encrypted.json").read_text())
    item = {"type": "reasoning", "id": body["output"][0]["id"],
            "encrypted_content": body["output"][0]["encrypted_content"]}
    signature = SIGNER.sign("text", [item], origin=ORIGIN)
    envelope = SIGNER.verify("text", signature)
    assert envelope is not None and envelope.opaque == [item] and envelope.origin == ORIGIN
    assert SIGNER.verify("text!", signature) is None
    assert ThinkingSigner("another-secret").verify("text", signature) is None
    prefix, packed, mac = signature.split(".")
    assert SIGNER.verify("text", f"{prefix}.{packed[:-2]}AA.{mac}") is None
    assert SIGNER.verify("text", "EqQBCkYIBxgCKkB...anthropic") is None
    assert "sk-one" not in signature
    # 1,572 characters of encrypted content: the whole signature stays near that size.
    assert len(signature) < len(item["encrypted_content"]) * 1.2


# ---------------------------------------------------------------- Chat Completions opaque state


def chat_blocks(chunks: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    def sign(thinking: str, opaque: list[dict[str, Any]] | None = None, /) -> str:
        return SIGNER.sign(thinking, opaque, origin=ORIGIN)
    out = convert_chunks(chunks, StreamConverter(
        "claude-sonnet-4-6", input_tokens=1, sign=sign,
        parser=chat_completions.ChatCompletionsParser(**options)))
    check_grammar([Event(event["type"], event) for event in out])
    return list(collect_message(out)["content"])


def test_openrouter_signed_text_fragments_merge_into_one_entry() -> None:
    from tests.scripted_upstream import transcript_chunks
    chunks = transcript_chunks("openrouter-claude-sonnet45-reasoning")
    details = [d for c in chunks for choice in c.get("choices") or []
               for d in (choice.get("delta") or {}).get("reasoning_details") or []]
    thinking = chat_blocks(chunks)[0]
    envelope = SIGNER.verify(thinking["thinking"], thinking["signature"])
    assert envelope is not None
    signature = next(d["signature"] for d in details if d.get("signature"))
    assert envelope.opaque == [{"type": "reasoning.text",
                                "text": "".join(d.get("text", "") for d in details),
                                "signature": signature, "format": "anthropic-claude-v1",
                                "index": 0}]
    assert thinking["thinking"] == envelope.opaque[0]["text"]


def content_chunks(*pieces: str) -> list[dict[str, Any]]:
    return [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
            for p in pieces] + [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]


@pytest.mark.parametrize(("pieces", "expected"), [
    (["\n <th", "ink>a</th", "ink>b"], [("thinking", "a"), ("text", "b")]),
    (["◁think▷k◁/think▷x"], [("thinking", "k"), ("text", "x")]),
    (["<", "b>bold</b>"], [("text", "<b>bold</b>")]),
    (["answer <think>not at the start</think>"],
     [("text", "answer <think>not at the start</think>")]),
    (["<thi"], [("text", "<thi")]),
])
def test_leading_think_tag_without_configuration(pieces: list[str],
                                                  expected: list[tuple[str, str]]) -> None:
    blocks = chat_blocks(content_chunks(*pieces), leading_think_tags=True)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in blocks] == expected


def test_leading_think_tag_after_a_reasoning_field_stays_text() -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"reasoning": "r"}, "finish_reason": None}]},
              *content_chunks("<think>x</think>y")]
    blocks = chat_blocks(chunks, leading_think_tags=True)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in blocks] == [
        ("thinking", "r"), ("text", "<think>x</think>y")]


@pytest.mark.parametrize(("message", "refused"), [
    ("Your organization must be verified to generate reasoning summaries.",
     ["reasoning.summary"]),
    ("Unsupported parameter: 'reasoning.effort' is not supported with this model.",
     ["reasoning"]),
    ("Item 'rs_1' of type 'reasoning' was provided without its required following item.", []),
    ("Invalid type for 'input[2].content': expected text.", []),
])
def test_which_400s_refuse_added_fields(message: str, refused: list[str]) -> None:
    extras = {"reasoning": {"effort": "high", "summary": "auto"}, "text.verbosity": "low"}
    assert responses.refused_fields(message, extras) == refused


def test_thinking_off_asks_for_no_reasoning_and_carries_none() -> None:
    request = {"model": "gpt-5", "max_tokens": 500, "thinking": {"type": "disabled"},
               "messages": [{"role": "user", "content": "hi"}]}
    upstream = responses.convert_request(request, settings())
    assert upstream.body == {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}],
                             "max_output_tokens": 500, "store": False}
    assert not upstream.thinking and upstream.extras == {}
