"""The official TypeScript SDK and the Vercel AI SDK as clients of a real proxy (and the Python
SDK's tool runner beside them), driven through `tests/js/clients.mjs`. Their stream
accumulators, tool runners and schema validators judge our answers: structured outputs come
back as the parsed object, and the tool runners, refused their server-held thread, complete a
two-turn loop with the whole history reaching the upstream.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic import beta_tool

from tests.conftest import ProxyServer, SuiteRecord
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion, text_stream

JS = Path(__file__).parent / "js"
CLIENTS = JS / "clients.mjs"
NODE = shutil.which("node")

js_clients = pytest.mark.skipif(
    (NODE is None or not (JS / "node_modules" / "ai").is_dir()) and not os.environ.get("CI"),
    reason="JS clients not installed (make test installs them into .cache/js)")

WEATHER_CALL = {"index": 0, "id": "call_weather_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ANSWER = "It is sunny in Paris."
CITY_SCHEMA_PROPERTIES = {"city": {"type": "string"}, "population": {"type": "number"}}


def run_client(proxy: ProxyServer | str, scenario: str) -> dict[str, Any]:
    """One scenario against the proxy (or another Messages API at that base URL)."""
    assert NODE is not None
    url = proxy if isinstance(proxy, str) else proxy.url
    result = subprocess.run([NODE, str(CLIENTS), scenario], cwd=JS, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                 "PROXY_URL": url})
    assert result.returncode == 0, result.stderr
    output: dict[str, Any] = json.loads(result.stdout)
    return output


def tool_loop(body: dict[str, Any]) -> Reply:
    """The scripted model: calls get_weather, then answers from the tool's result."""
    answered = any(message.get("role") == "tool" for message in body["messages"])
    if body.get("stream"):
        if answered:
            return text_stream(["It is sunny ", "in Paris."])
        return Reply(events=[chunk({"role": "assistant", "content": None,
                                    "tool_calls": [WEATHER_CALL]}),
                             chunk({}, "tool_calls")])
    if answered:
        return completion({"content": ANSWER})
    call = {key: value for key, value in WEATHER_CALL.items() if key != "index"}
    return completion({"content": None, "tool_calls": [call]}, finish="tool_calls")


def thread_refusals() -> int:
    return sum(b"thread_unsupported_request" in piece for piece in SuiteRecord.responses)


def assert_full_history_reached_upstream(upstream: ScriptedUpstream) -> None:
    """Two upstream calls; the second carries the question, the call and the tool's output."""
    assert len(upstream.requests) == 2
    first, second = (request["messages"] for request in upstream.requests)
    assert first == [{"role": "user", "content": "weather in Paris?"}]
    assert [message["role"] for message in second] == ["user", "assistant", "tool"]
    assert second[0] == first[0]
    assert second[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(second[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert second[2]["tool_call_id"] == second[1]["tool_calls"][0]["id"]
    assert second[2]["content"] == "sunny in Paris"


# ------------------------------------------------------------------ TypeScript SDK


@js_clients
def test_ts_stream_accumulates_text_and_tool_use(proxy: ProxyServer,
                                                 upstream: ScriptedUpstream) -> None:
    upstream.queue(Reply(events=[
        chunk({"role": "assistant", "content": "Let me "}), chunk({"content": "check."}),
        chunk({"tool_calls": [WEATHER_CALL]}), chunk({}, "tool_calls"),
        chunk(None, None, {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29})]))
    result = run_client(proxy, "ts-stream")
    message = result["message"]
    assert message["model"] == "claude-sonnet-4-6" and message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_weather_1", "name": "get_weather",
         "input": {"city": "Paris"}}]
    assert message["usage"]["output_tokens"] == 9
    assert result["events"] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]


@js_clients
def test_ts_parse_returns_the_validated_object(proxy: ProxyServer,
                                               upstream: ScriptedUpstream) -> None:
    result = run_client(proxy, "ts-parse")
    assert result["parsed"] == {"city": "example", "population": 1}
    response_format = upstream.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["strict"] is True
    assert response_format["json_schema"]["schema"]["properties"] == CITY_SCHEMA_PROPERTIES


@js_clients
def test_ts_tool_runner_falls_back_from_threads(proxy: ProxyServer,
                                                upstream: ScriptedUpstream) -> None:
    upstream.responder = tool_loop
    refusals = thread_refusals()
    result = run_client(proxy, "ts-tool-runner")
    assert thread_refusals() == refusals + 1  # the threaded first turn was refused
    first, last = result["turns"]
    assert first["stop_reason"] == "tool_use" and first["content"][0]["input"] == {
        "city": "Paris"}
    assert last["stop_reason"] == "end_turn"
    assert last["content"] == [{"type": "text", "text": ANSWER}]
    assert_full_history_reached_upstream(upstream)


# ------------------------------------------------------------------ Python SDK


@beta_tool
def get_weather(city: str) -> str:
    """Weather of a city.

    Args:
        city: the city
    """
    return f"sunny in {city}"


def test_python_tool_runner_falls_back_from_threads(proxy: ProxyServer,
                                                    upstream: ScriptedUpstream) -> None:
    upstream.responder = tool_loop
    refusals = thread_refusals()
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-python", max_retries=0)
    runner = client.beta.messages.tool_runner(
        model="claude-sonnet-4-6", max_tokens=200, tools=[get_weather],
        messages=[{"role": "user", "content": "weather in Paris?"}])
    turns = list(runner)
    assert thread_refusals() == refusals + 1
    assert [turn.stop_reason for turn in turns] == ["tool_use", "end_turn"]
    assert turns[-1].content[0].type == "text" and turns[-1].content[0].text == ANSWER
    assert_full_history_reached_upstream(upstream)


def test_python_parse_returns_the_object(proxy: ProxyServer,
                                         upstream: ScriptedUpstream) -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        city: str
        population: int

    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-python", max_retries=0)
    message = client.messages.parse(model="claude-sonnet-4-6", max_tokens=200,
                                    messages=[{"role": "user", "content": "largest city"}],
                                    output_format=City)
    assert message.parsed_output == City(city="example", population=1)
    assert upstream.requests[0]["response_format"]["json_schema"]["schema"]["properties"] == {
        "city": {"type": "string", "title": "City"},
        "population": {"type": "integer", "title": "Population"}}


# ------------------------------------------------------------------ a call that is no JSON

CUT_CALL = {"id": "call_cut", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
"""A call cut by the output limit: never completed, so its text is no JSON object."""


def cut_call() -> Reply:
    return completion({"content": None, "tool_calls": [CUT_CALL]}, finish="length")


def test_python_sdk_gives_a_cut_call_as_its_text(proxy: ProxyServer,
                                                 upstream: ScriptedUpstream) -> None:
    """A whole Message carries such a call's text as its `input` (docs/tool-calls.md), never
    `{}`: the Python SDK hands it over as it is."""
    upstream.queue(cut_call())
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-python", max_retries=0)
    message = client.messages.create(model="claude-sonnet-4-6", max_tokens=200, messages=[
        {"role": "user", "content": "weather in Paris?"}], tools=[{
            "name": "get_weather", "description": "Weather", "input_schema": {
                "type": "object", "properties": {"city": {"type": "string"}}}}])
    (call,) = message.content
    assert call.type == "tool_use" and call.input == '{"city": "Par'
    assert message.stop_reason == "max_tokens"


@js_clients
def test_ts_sdk_gives_a_cut_call_as_its_text_and_sends_it_back(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """The TypeScript SDK takes the text as the `input`, and the call it sends back reaches
    the upstream as the model wrote it."""
    upstream.queue(cut_call(), completion({"content": ANSWER}))
    result = run_client(proxy, "ts-create-and-answer")
    assert result["message"]["content"] == [
        {"type": "tool_use", "id": "call_cut", "name": "get_weather", "input": '{"city": "Par'}]
    assert result["answer"]["content"] == [{"type": "text", "text": ANSWER}]
    history = upstream.requests[1]["messages"]
    assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'


# ------------------------------------------------------------------ Vercel AI SDK


@js_clients
def test_vercel_output_object_is_the_parsed_object(proxy: ProxyServer,
                                                   upstream: ScriptedUpstream) -> None:
    result = run_client(proxy, "vercel-object")
    assert result["output"] == {"city": "example", "population": 1}
    assert json.loads(result["text"]) == {"city": "example", "population": 1}
    schema = upstream.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"] == CITY_SCHEMA_PROPERTIES and "$schema" not in schema


@js_clients
def test_vercel_stream_text_runs_the_tool_loop(proxy: ProxyServer,
                                               upstream: ScriptedUpstream) -> None:
    upstream.responder = tool_loop
    result = run_client(proxy, "vercel-stream-tools")
    assert result["toolCalls"] == [{"name": "get_weather", "input": {"city": "Paris"}}]
    assert result["toolResults"] == ["sunny in Paris"]
    assert result["text"] == ANSWER and result["finishReason"] == "stop"
    assert "tool-call" in result["parts"] and "text-delta" in result["parts"]
    assert_full_history_reached_upstream(upstream)
