"""The Responses API and opaque reasoning through a real proxy: the anthropic SDK in front,
the scripted upstream behind, replaying the real OpenAI and OpenRouter recordings byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from claude_proxy.conversion.signatures import Origin, ThinkingSigner
from tests.conftest import UPSTREAM_KEY, ProxyServer, clean_env
from tests.scripted_upstream import (
    OPAQUE,
    Reply,
    ScriptedUpstream,
    error_reply,
    recorded_turns,
    responses_stream,
    transcript_chunks,
)
from tests.sse_grammar import check_grammar, parse_sse

SECRET = "responses-proxy-secret"
SIGNER = ThinkingSigner(SECRET)
STEM = "openai-responses-stream-reasoning-encrypted-tools"
CALCULATOR = {"name": "calculator", "description": "A minimal calculator.",
              "input_schema": {"type": "object", "properties": {
                  "a": {"type": "number"}, "b": {"type": "number"},
                  "op": {"type": "string"}}, "required": ["a", "b", "op"]}}
ADAPTIVE = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}


def responses_proxy(factory: Callable[..., ProxyServer], model: str = "gpt-5.1-codex-max",
                    **overrides: Any) -> ProxyServer:
    return factory(provider="openai", middle_model=model, thinking_signature_secret=SECRET,
                   **overrides)


def sdk(proxy: ProxyServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)


def ask(proxy: ProxyServer, messages: list[dict[str, Any]], stream: bool = True,
        **fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 64000,
                               "messages": messages, "tools": [CALCULATOR], **ADAPTIVE}
    request.update(fields)
    client = sdk(proxy)
    if stream:
        with client.messages.stream(**request) as answer:
            return answer.get_final_message().model_dump(exclude_none=True)
    return client.messages.create(**request).model_dump(exclude_none=True)


def recorded(number: int, kind: str) -> dict[str, Any]:
    for line in recorded_turns(STEM)[number]:
        event = json.loads(line)
        if event["type"] == "response.output_item.done" and event["item"]["type"] == kind:
            return dict(event["item"])
    raise AssertionError(kind)


def blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [block for block in message["content"] if block["type"] == kind]


# ---------------------------------------------------------------- OpenAI tool loop


def test_tool_loop_carries_the_encrypted_reasoning_back_byte_for_byte(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"SCENARIO:replay:{STEM} compute (12 + 7) * 3 * 10"}]
    for _turn in range(4):
        answer = ask(proxy, messages)
        messages.append({"role": "assistant", "content": answer["content"]})
        for tool in blocks(answer, "tool_use"):
            messages.append({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": tool["id"],
                "content": str(eval_calculator(tool["input"]))}]})
    assert answer["content"] == [{"type": "text", "text": "The final result is **570**."}]
    assert upstream.paths == ["/v1/responses"] * 4
    first = upstream.requests[0]
    assert first["model"] == "gpt-5.1-codex-max"
    assert first["reasoning"] == {"effort": "high", "summary": "auto"}
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert "temperature" not in first and first["stream"] is True
    reasoning, call = recorded(0, "reasoning"), recorded(0, "function_call")
    second = upstream.requests[1]["input"]
    assert second[1:] == [
        {"type": "reasoning", "id": reasoning["id"],
         "encrypted_content": reasoning["encrypted_content"], "summary": []},
        {"type": "function_call", "call_id": call["call_id"], "name": "calculator",
         "arguments": call["arguments"], "id": call["id"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "19"}]
    # The later turns had no reasoning: their calls go without item ids.
    last = upstream.requests[3]["input"]
    assert [item.get("type") for item in last].count("reasoning") == 1
    assert [item.get("id") for item in last if item.get("type") == "function_call"] == [
        call["id"], None, None]


def eval_calculator(arguments: dict[str, Any]) -> int:
    a, b = int(arguments["a"]), int(arguments["b"])
    return {"add": a + b, "multiply": a * b}[arguments["op"]]


def test_streaming_events_of_the_recorded_turn(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory)
    response = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 1000, "stream": True, **ADAPTIVE,
        "tools": [CALCULATOR],
        "messages": [{"role": "user", "content": f"SCENARIO:replay:{STEM}"}]})
    events = parse_sse(response.content)
    check_grammar(events)
    thinking = "".join(e.data["delta"]["thinking"] for e in events
                       if e.data.get("delta", {}).get("type") == "thinking_delta")
    assert thinking == recorded(0, "reasoning")["summary"][0]["text"]
    signatures = [e.data["delta"]["signature"] for e in events
                  if e.data.get("delta", {}).get("type") == "signature_delta"]
    assert len(signatures) == 1  # sent once, whole
    envelope = SIGNER.verify(thinking, signatures[0])
    assert envelope is not None and envelope.origin.provider == "openai"
    assert envelope.origin.model == "gpt-5.1-codex-max"
    assert UPSTREAM_KEY not in signatures[0]
    assert events[-2].data["delta"]["stop_reason"] == "tool_use"


def test_non_streaming_recorded_reply(proxy_factory: Callable[..., ProxyServer],
                                      upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory, model="gpt-5-mini")
    stem = "openai-responses-nonstream-encrypted"
    body = json.loads((OPAQUE / f"{stem}.json").read_text())
    message = ask(proxy, [{"role": "user", "content": f"SCENARIO:replay:{stem}"}], stream=False,
                  max_tokens=4000)
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["thinking"] == body["output"][0]["summary"][0]["text"]
    assert message["content"][1]["text"] == body["output"][1]["content"][0]["text"]
    assert message["usage"]["output_tokens"] == 163
    assert "stream" not in upstream.requests[0]


def test_tampered_or_foreign_envelope_is_not_forwarded(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory)
    answer = ask(proxy, [{"role": "user", "content": f"SCENARIO:replay:{STEM}"}])
    thinking, tool = answer["content"]
    signature = thinking["signature"]
    fingerprint = SIGNER.key_fingerprint(UPSTREAM_KEY)
    item = SIGNER.verify(thinking["thinking"], signature).opaque  # type: ignore[union-attr]
    variants = {
        "tampered": signature[:-3] + ("AAA" if not signature.endswith("AAA") else "BBB"),
        "other text": SIGNER.sign("other", item),
        "other provider": SIGNER.sign(thinking["thinking"], item,
                                      origin=Origin("azure", "gpt-5.1-codex-max", fingerprint)),
        "other model": SIGNER.sign(thinking["thinking"], item,
                                   origin=Origin("openai", "gpt-5", fingerprint)),
        "other key": SIGNER.sign(thinking["thinking"], item, origin=Origin(
            "openai", "gpt-5.1-codex-max", SIGNER.key_fingerprint("sk-another-key"))),
        "other secret": ThinkingSigner("not-ours").sign(thinking["thinking"], item, origin=Origin(
            "openai", "gpt-5.1-codex-max", fingerprint)),
    }
    for name, forged in variants.items():
        upstream.reset()
        ask(proxy, [{"role": "user", "content": f"SCENARIO:replay:{STEM}"},
                    {"role": "assistant", "content": [dict(thinking, signature=forged), tool]},
                    {"role": "user", "content": [{"type": "tool_result",
                                                  "tool_use_id": tool["id"], "content": "19"}]}])
        sent = upstream.requests[0]["input"]
        assert [i.get("type") for i in sent] == [None, "function_call", "function_call_output"], (
            name)
        assert "id" not in sent[1] and "gAAAA" not in json.dumps(sent), name


# ---------------------------------------------------------------- scripted answers


def text_events(text: str) -> list[dict[str, Any]]:
    return [{"type": "response.created", "response": {"status": "in_progress"}},
            {"type": "response.output_item.added", "item": {"type": "message", "id": "msg_1"}},
            {"type": "response.output_text.delta", "item_id": "msg_1", "delta": text}]


def test_incomplete_becomes_max_tokens(proxy_factory: Callable[..., ProxyServer],
                                       upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory)
    upstream.queue(responses_stream(*text_events("cut"), {
        "type": "response.incomplete", "response": {
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 9, "output_tokens": 16,
                      "output_tokens_details": {"reasoning_tokens": 15}}}}))
    message = ask(proxy, [{"role": "user", "content": "hi"}], max_tokens=1)
    assert message["stop_reason"] == "max_tokens" and message["content"][0]["text"] == "cut"
    assert upstream.requests[0]["max_output_tokens"] == 16  # Claude Code's 1-token probes


def test_failed_before_the_first_byte_is_an_http_error(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory, max_retries=0)
    upstream.queue(responses_stream(
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.in_progress", "response": {"status": "in_progress"}},
        {"type": "response.failed", "response": {"status": "failed", "error": {
            "code": "rate_limit_exceeded", "message": "Rate limit reached for gpt-5"}}}))
    response = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 429
    assert response.json() == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "Rate limit reached for gpt-5"}}


def test_error_event_mid_stream(proxy_factory: Callable[..., ProxyServer],
                                upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory)
    upstream.queue(responses_stream(*text_events("partial"), {
        "type": "error", "error": {"type": "server_error", "code": "server_error",
                                   "message": "The server had an error"}}))
    response = httpx.post(f"{proxy.url}/v1/messages", timeout=30, json={
        "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]})
    events = parse_sse(response.content)
    check_grammar(events)
    assert response.status_code == 200
    assert [e.name for e in events][-2:] == ["content_block_stop", "error"]
    assert events[-1].data == {"type": "error", "error": {
        "type": "overloaded_error", "message": "The server had an error"}}


def test_refused_summary_is_retried_without_and_remembered(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory, model="o3")
    refusal = error_reply(400, "Your organization must be verified to generate reasoning "
                               "summaries. Please go to: https://platform.openai.com/settings")
    upstream.queue(refusal, responses_stream(*text_events("one"), {
        "type": "response.completed", "response": {}}), responses_stream(
        *text_events("two"), {"type": "response.completed", "response": {}}))
    assert ask(proxy, [{"role": "user", "content": "hi"}])["content"][0]["text"] == "one"
    assert ask(proxy, [{"role": "user", "content": "hi"}])["content"][0]["text"] == "two"
    assert [r["reasoning"] for r in upstream.requests] == [
        {"effort": "high", "summary": "auto"}, {"effort": "high"}, {"effort": "high"}]


def test_responses_api_false_keeps_chat_completions(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = responses_proxy(proxy_factory, model="gpt-5", responses_api=False)
    ask(proxy, [{"role": "user", "content": "hi"}])
    assert upstream.paths == ["/v1/chat/completions"]
    assert upstream.requests[0]["reasoning_effort"] == "high"


def test_azure_posts_to_v1_responses_with_the_deployment(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    base = f"http://127.0.0.1:{upstream.port}/openai/deployments/gpt5-prod"
    proxy = proxy_factory(provider="azure", azure_api_version="2024-12-01-preview",
                          openai_base_url=base, middle_model="gpt-5-mini",
                          thinking_signature_secret=SECRET)
    upstream.queue(responses_stream(*text_events("azure"), {
        "type": "response.completed", "response": {}}))
    assert ask(proxy, [{"role": "user", "content": "hi"}])["content"][0]["text"] == "azure"
    assert upstream.paths == ["/openai/v1/responses"]
    assert upstream.requests[0]["model"] == "gpt5-prod"
    assert upstream.headers[0]["api-key"] == UPSTREAM_KEY


# ---------------------------------------------------------------- OpenRouter reasoning_details


def gemini_interactions() -> list[dict[str, Any]]:
    data = yaml.safe_load((OPAQUE / "openrouter-gemini31-encrypted-tool-passback.yaml").read_text())
    return list(data["interactions"])


def test_openrouter_reasoning_details_round_trip(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    model = "google/gemini-3.1-flash-lite-preview"
    proxy = proxy_factory(provider="openrouter", middle_model=model, reasoning_with_tools=True,
                          thinking_signature_secret=SECRET)
    first, second = gemini_interactions()
    upstream.queue(*(Reply(raw_pieces=[i["response"]["body"].encode()],
                           content_type="text/event-stream") for i in (first, second)))
    weather = {"name": "weather", "description": "Get weather information for a location",
               "input_schema": {"type": "object", "properties": {"location": {
                   "type": "string", "description": "the city"}}, "required": ["location"]}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What's the weather in Florence,Italy?"}]
    answer = ask(proxy, messages, tools=[weather], system="You are a helpful assistant")
    assert [b["type"] for b in answer["content"]] == ["thinking", "tool_use"]
    assert answer["content"][0]["thinking"] == ""
    tool = answer["content"][1]
    messages += [{"role": "assistant", "content": answer["content"]},
                 {"role": "user", "content": [{"type": "tool_result",
                                               "tool_use_id": tool["id"], "content": "40 C"}]}]
    final = ask(proxy, messages, tools=[weather], system="You are a helpful assistant")
    assert "".join(b["text"] for b in blocks(final, "text")) == (
        "The current weather in Florence, Italy, is 40°C.")
    recorded_request = json.loads(second["request"]["body"])
    sent = upstream.requests[1]["messages"]
    assert sent[2]["tool_calls"] == recorded_request["messages"][2]["tool_calls"]
    assert sent[2]["reasoning_details"] == recorded_request["messages"][2]["reasoning_details"]
    # Another model (or key) behind the same provider gets nothing of it.
    upstream.reset()
    upstream.queue(Reply(raw_pieces=[second["response"]["body"].encode()],
                         content_type="text/event-stream"))
    other = proxy_factory(provider="openrouter", middle_model="google/gemini-3-pro-preview",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    ask(other, messages, tools=[weather])
    assert "reasoning_details" not in upstream.requests[0]["messages"][1]


# ---------------------------------------------------------------- <think> without configuration


@pytest.mark.parametrize("stem", ["groq-r1distill-think-tags", "together-deepseek-r1-think-tags"])
def test_think_tags_found_under_an_unrelated_model_name(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        stem: str) -> None:
    proxy = proxy_factory(provider="vllm", middle_model="my-served-alias",
                          thinking_signature_secret=SECRET)
    full = "".join((c.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                   for c in transcript_chunks(stem))
    message = ask(proxy, [{"role": "user", "content": f"SCENARIO:replay:{stem}"}], tools=[])
    opening, closing = full.index("<think>"), full.index("</think>")
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["thinking"] == full[opening + len("<think>"):closing]
    assert message["content"][1]["text"] == full[closing + len("</think>"):]
    assert "<think>" not in message["content"][1]["text"]
    disabled = ask(proxy, [{"role": "user", "content": f"SCENARIO:replay:{stem}"}], tools=[],
                   thinking={"type": "disabled"})
    assert disabled["content"] == [{"type": "text", "text": full[closing + len("</think>"):]}]


# ---------------------------------------------------------------- doctor


def doctor_responder(body: dict[str, Any]) -> Reply:
    """A /responses upstream for an organisation not verified for reasoning summaries."""
    output: list[dict[str, Any]] = [{"type": "message", "id": "msg_d", "content": [
        {"type": "output_text", "text": "ok"}]}]
    if "summary" in body.get("reasoning", {}):
        return error_reply(400, "Your organization must be verified to generate reasoning "
                                "summaries. Please go to: https://platform.openai.com/settings")
    if body.get("reasoning"):
        output.insert(0, {"type": "reasoning", "id": "rs_d", "summary": [],
                          "encrypted_content": "gAAAAB" + "x" * 94})
    if body.get("tools"):
        output = [{"type": "function_call", "id": "fc_d", "call_id": "call_d",
                   "name": "get_time", "arguments": "{}"}]
    return Reply(body={"object": "response", "status": "completed", "error": None,
                       "output": output})


def test_doctor_reports_summaries_refused_and_encrypted_reasoning(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.responder = doctor_responder
    env = clean_env(tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=upstream.base_url,
                    PROVIDER="openai", BIG_MODEL="gpt-5", MIDDLE_MODEL="gpt-5",
                    SMALL_MODEL="gpt-5")
    result = subprocess.run([sys.executable, "-m", "claude_proxy", "doctor"], env=env,
                            capture_output=True, text=True, timeout=60)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "reachable      ok    Responses API" in out
    assert ("summaries      warn  refused (Your organization must be verified to generate "
            "reasoning summaries.") in out
    assert ("encrypted      ok    1 reasoning item(s), 100 chars (carried back in the thinking "
            "signature)") in out
    assert "tools          ok    accepted; the model called get_time" in out
    assert set(upstream.paths) == {"/v1/responses"}


def test_recorded_gpt5_tool_turn_and_the_request_that_sent_it_back(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """pydantic-ai's gpt-5 cassette (stored parsed, so served re-serialised): the proxy's
    second request carries what the recorded second request carried, reasoning item first."""
    data = yaml.safe_load((OPAQUE / "openai-responses-nonstream-tool-passback.yaml").read_text())
    first, second = data["interactions"]
    upstream.queue(Reply(body=first["response"]["parsed_body"]),
                   Reply(body=second["response"]["parsed_body"]))
    recorded = first["request"]["parsed_body"]
    plan = {"name": "update_plan", "input_schema": recorded["tools"][0]["parameters"]}
    proxy = responses_proxy(proxy_factory, model="gpt-5")
    messages: list[dict[str, Any]] = [{"role": "user",
                                       "content": recorded["input"][0]["content"]}]
    answer = ask(proxy, messages, stream=False, max_tokens=4000, tools=[plan],
                 system=recorded["instructions"])
    assert [b["type"] for b in answer["content"]] == ["thinking", "tool_use"]
    summary = first["response"]["parsed_body"]["output"][0]["summary"]
    assert answer["content"][0]["thinking"] == "\n\n".join(part["text"] for part in summary)
    tool = answer["content"][1]
    messages += [{"role": "assistant", "content": answer["content"]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool["id"],
                                               "content": "plan updated"}]}]
    final = ask(proxy, messages, stream=False, max_tokens=4000, tools=[plan],
                system=recorded["instructions"])
    assert blocks(final, "text")[0]["text"].startswith("Softly")
    sent = upstream.requests[1]
    assert sent["instructions"] == recorded["instructions"]
    expected = [dict(item) for item in second["request"]["parsed_body"]["input"]]
    expected[1]["summary"] = []  # the summary text is shown, not carried back
    assert sent["input"] == expected
