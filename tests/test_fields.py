"""The field table (`conversion/fields.py`): one test per row, against a real proxy and the
scripted upstream. Each request field is sent on its own beside a minimal request; what the
upstream receives (or the client's 400) shows its treatment. Every `anthropic-beta` value is
accepted. Unknown names are logged once."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.conversion.caching import session_cache_key
from claude_proxy.conversion.fields import BETA_VALUES, REQUEST_FIELDS, Treatment, markdown_tables
from claude_proxy.conversion.request_converter import anonymous_user
from claude_proxy.conversion.structured import apply_structured_output, schema_instruction
from tests.conftest import ProxyServer, load_fixture
from tests.scripted_upstream import Reply, ScriptedUpstream, completion, error_reply

MINIMAL: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 100,
                           "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
CLEAN_SCHEMA = {key: value for key, value in SCHEMA.items() if key != "$schema"}
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                         "properties": {"city": {"type": "string"}}}}
THREAD_REFUSAL = {"type": "error", "error": {
    "type": "invalid_request_error",
    "message": "thread: server-held threads are not supported by this proxy; send the whole "
               "conversation without `thread`",
    "details": {"error_code": "thread_unsupported_request", "unsupported": ["thread"]}}}


@dataclass
class Sent:
    response: httpx.Response
    upstream: dict[str, Any] | None
    baseline: dict[str, Any]
    """What the upstream got for MINIMAL alone."""

    def added(self) -> dict[str, Any]:
        """The upstream fields that differ from the baseline's."""
        assert self.response.status_code == 200, self.response.text
        assert self.upstream is not None
        return {key: value for key, value in self.upstream.items()
                if self.baseline.get(key) != value}


@dataclass
class Case:
    fields: dict[str, Any]
    check: Callable[[Sent], None]
    profile: str = "openai"


def check_safeguards(sent: Sent) -> None:
    """Nothing goes upstream; the answer says nobody judged (tests/test_safeguards.py)."""
    unchanged(sent)
    assert sent.response.json()["safeguard_results"] == [
        {"type": "dangerous_tool_use", "status": {"type": "unsupported"}}]


def check_context_management(sent: Sent) -> None:
    """Claude Code's no-op edit: nothing changes, and the answer says nothing was done
    (tests/test_context_management.py)."""
    unchanged(sent)
    assert sent.response.json()["context_management"] == {"applied_edits": []}


def unchanged(sent: Sent) -> None:
    """Ignored: accepted, and the upstream request is exactly the baseline's."""
    assert sent.added() == {} and sent.upstream == sent.baseline


def adds(**expected: Any) -> Callable[[Sent], None]:
    def check(sent: Sent) -> None:
        assert sent.added() == expected

    return check


def refused(message: str) -> Callable[[Sent], None]:
    def check(sent: Sent) -> None:
        assert sent.response.status_code == 400
        assert sent.response.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": message}}
        assert sent.upstream is None

    return check


def check_model(sent: Sent) -> None:
    assert sent.added() == {"model": "big-upstream"}
    assert sent.response.json()["model"] == "claude-opus-4-7"


def check_messages(sent: Sent) -> None:
    assert sent.added() == {"messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_01", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "sunny"}]}


def check_stream(sent: Sent) -> None:
    assert sent.added() == {"stream": True, "stream_options": {"include_usage": True}}
    assert sent.response.headers["content-type"].startswith("text/event-stream")
    assert "event: message_stop" in sent.response.text


def check_stop_sequences(sent: Sent) -> None:
    """Matched by the proxy: not sent as `stop`; the upstream streams (to be cancelled)."""
    assert sent.added() == {"stream": True, "stream_options": {"include_usage": True}}
    message = sent.response.json()
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert message["content"] == [{"type": "text", "text": "scripted default"}]


def check_structured(sent: Sent) -> None:
    assert sent.added() == {"response_format": {"type": "json_schema", "json_schema": {
        "name": "response", "schema": CLEAN_SCHEMA, "strict": True}}}
    text = sent.response.json()["content"][0]["text"]
    assert json.loads(text) == {"city": "example", "population": 1}


def check_effort(sent: Sent) -> None:
    """gpt-5 goes to /responses: the effort is `reasoning.effort` (the default is medium)."""
    assert sent.response.status_code == 200 and sent.upstream is not None
    assert sent.upstream["reasoning"] == {"effort": "low", "summary": "auto"}


def check_thread(sent: Sent) -> None:
    assert sent.response.status_code == 400
    assert sent.response.json() == THREAD_REFUSAL
    assert sent.upstream is None


MESSAGES = [{"role": "user", "content": "first"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01",
                                               "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                          "content": "sunny"}]}]

CASES: dict[str, Case] = {
    "model": Case({"model": "claude-opus-4-7"}, check_model),
    "messages": Case({"messages": MESSAGES}, check_messages),
    "max_tokens": Case({"max_tokens": 10**9}, adds(max_tokens=16384)),
    "system": Case({"system": [{"type": "text", "text": "be brief"}]},
                   adds(messages=[{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "hi"}])),
    "stream": Case({"stream": True}, check_stream),
    "stop_sequences": Case({"stop_sequences": ["END"]}, check_stop_sequences),
    "temperature": Case({"temperature": 0.25}, adds(temperature=0.25)),
    "top_p": Case({"top_p": 0.5}, adds(top_p=0.5)),
    "top_k": Case({"top_k": 40}, adds(top_k=40), profile="vllm"),
    "metadata": Case({"metadata": {"user_id": "user-7"}},
                     adds(user=anonymous_user("user-7"), prompt_cache_key=session_cache_key(
                         None, {"metadata": {"user_id": "user-7"}}))),
    "tools": Case({"tools": [TOOL]}, adds(tools=[{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])),
    "tool_choice": Case({"tools": [TOOL], "tool_choice": {
        "type": "any", "disable_parallel_tool_use": True}},
        lambda sent: (sent.added()["tool_choice"] == "required"
                      and sent.added()["parallel_tool_calls"] is False) or pytest.fail(
                          str(sent.added()))),
    "thinking": Case({"thinking": {"type": "enabled", "budget_tokens": 2000}},
                     adds(chat_template_kwargs={"enable_thinking": True, "thinking": True}),
                     profile="vllm"),
    "output_config.effort": Case({"model": "gpt-5", "thinking": {"type": "adaptive"},
                                  "output_config": {"effort": "low"}},
                                 check_effort),
    "output_config.format": Case({"output_config": {"format": {
        "type": "json_schema", "schema": SCHEMA}}}, check_structured),
    "output_config.task_budget": Case({"output_config": {"task_budget": {
        "type": "tokens", "total": 50000}}}, unchanged),
    "output_format": Case({"output_format": {"type": "json_schema", "schema": SCHEMA}},
                          check_structured),
    "safeguards": Case({"safeguards": [{"type": "dangerous_tool_use"}]}, check_safeguards),
    "context_management": Case({"context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"}]}}, check_context_management),
    "cache_control": Case({"cache_control": {"type": "ephemeral"}}, unchanged),
    "service_tier": Case({"service_tier": "standard_only"}, unchanged),
    "speed": Case({"speed": "fast"}, unchanged),
    "inference_geo": Case({"inference_geo": "us"}, unchanged),
    "diagnostics": Case({"diagnostics": {"previous_message_id": "msg_01"}}, unchanged),
    "container": Case({"container": "container_01"}, unchanged),
    "fallbacks": Case({"fallbacks": "default"}, unchanged),
    "fallback_credit_token": Case({"fallback_credit_token": "fct_01"}, unchanged),
    "billing_policy": Case({"billing_policy": {"type": "billing_policy", "bill_to": "self"}},
                           unchanged),
    "user_profile_id": Case({"user_profile_id": "uprof_01"}, unchanged),
    "workspace_id": Case({"workspace_id": "wrkspc_01"}, unchanged),
    "thread": Case({"thread": {"type": "continue", "previous_message_id": "msg_01"}},
                   check_thread),
    "mcp_servers": Case({"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse",
                                          "name": "example"}]},
                        refused(f"mcp_servers: not supported by this proxy "
                                f"({REQUEST_FIELDS['mcp_servers'].how})")),
    "compaction": Case({"compaction": {"type": "compaction"}},
                       refused(f"compaction: not supported by this proxy "
                               f"({REQUEST_FIELDS['compaction'].how})")),
}


@pytest.fixture(scope="module")
def proxies(proxy: ProxyServer,
            proxy_factory: Callable[..., ProxyServer]) -> dict[str, ProxyServer]:
    return {"openai": proxy, "vllm": proxy_factory(provider="vllm")}


def send(proxy: ProxyServer, upstream: ScriptedUpstream, body: dict[str, Any],
         headers: dict[str, str] | None = None) -> tuple[httpx.Response, dict[str, Any] | None]:
    before = len(upstream.requests)
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers or {},
                          timeout=30)
    sent = upstream.requests[before:]
    assert len(sent) <= 1
    return response, (sent[0] if sent else None)


def send_all(proxy: ProxyServer, upstream: ScriptedUpstream,
             body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """Like `send`, for a request the proxy may send upstream more than once."""
    before = len(upstream.requests)
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response, upstream.requests[before:]


def test_every_field_row_has_a_test() -> None:
    assert set(CASES) == set(REQUEST_FIELDS)


@pytest.mark.parametrize("name", list(REQUEST_FIELDS))
def test_field_row(name: str, proxies: dict[str, ProxyServer],
                   upstream: ScriptedUpstream) -> None:
    case = CASES[name]
    proxy = proxies[case.profile]
    _, baseline = send(proxy, upstream, MINIMAL)
    assert baseline is not None
    response, sent = send(proxy, upstream, {**MINIMAL, **case.fields})
    expected_status = 400 if REQUEST_FIELDS[name].treatment is Treatment.REFUSED else 200
    assert response.status_code == expected_status, response.text
    case.check(Sent(response, sent, baseline))


def test_top_k_is_left_out_for_upstreams_without_it(proxy: ProxyServer,
                                                    upstream: ScriptedUpstream) -> None:
    response, sent = send(proxy, upstream, {**MINIMAL, "top_k": 40})
    assert response.status_code == 200 and sent is not None and "top_k" not in sent


def test_a_refused_top_k_is_dropped_and_remembered(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    upstream.queue(error_reply(400, "Unrecognized request argument supplied: top_k"))
    body = {**MINIMAL, "model": "top-k-refuser", "top_k": 40}
    for _ in range(2):
        response, _ = send_all(proxies["vllm"], upstream, body)
        assert response.json()["content"][0]["text"] == "scripted default"
    assert [request.get("top_k") for request in upstream.requests] == [40, None, None]


@pytest.mark.parametrize(("fields", "name"), [
    ({"output_config": {"format": {"type": "regex", "pattern": "a+"}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
    ({"output_format": {"type": "json_schema", "schema": "not an object"}}, "output_format"),
])
def test_other_output_formats_are_refused(fields: dict[str, Any], name: str, proxy: ProxyServer,
                                          upstream: ScriptedUpstream) -> None:
    response, sent = send(proxy, upstream, {**MINIMAL, **fields})
    assert response.status_code == 400 and sent is None
    assert response.json()["error"]["message"] == (
        f'{name}: only {{"type": "json_schema", "schema": {{…}}}} is supported')


def test_thread_refusal_comes_before_other_refusals(proxy: ProxyServer,
                                                    upstream: ScriptedUpstream) -> None:
    response, sent = send(proxy, upstream, {**MINIMAL, "mcp_servers": [],
                                            "thread": {"type": "create"}})
    assert response.status_code == 400 and response.json() == THREAD_REFUSAL
    assert sent is None


@pytest.mark.parametrize("value", list(BETA_VALUES))
def test_beta_row_is_accepted(value: str, proxy: ProxyServer,
                              upstream: ScriptedUpstream) -> None:
    """The header alone never changes the request: the fields it enables carry the
    treatment."""
    _, baseline = send(proxy, upstream, MINIMAL)
    response, sent = send(proxy, upstream, MINIMAL,
                          {"anthropic-beta": f"claude-code-20250219,{value}"})
    assert response.status_code == 200 and response.json()["content"][0]["text"] == (
        "scripted default")
    assert sent == baseline


@pytest.mark.parametrize("fixture", ["claude-code-2.1.328-first-request.json",
                                     "claude-code-2.1.328-tool-loop-second-request.json"])
def test_what_claude_code_sends_is_in_the_table(fixture: str, proxy: ProxyServer,
                                                upstream: ScriptedUpstream) -> None:
    recorded = load_fixture(fixture)
    body = recorded["body"]
    assert set(body) - {"output_config"} <= set(REQUEST_FIELDS)
    assert {f"output_config.{key}" for key in body["output_config"]} <= set(REQUEST_FIELDS)
    betas = recorded["headers"]["anthropic-beta"].split(",")
    assert set(betas) <= set(BETA_VALUES)
    assert all(BETA_VALUES[b].treatment is not Treatment.REFUSED for b in betas)
    response, sent = send(proxy, upstream, {**body, "stream": False},
                          {"anthropic-beta": recorded["headers"]["anthropic-beta"]})
    assert response.status_code == 200 and sent is not None
    assert response.json()["content"][-1]["text"] == "scripted default"


def test_unknown_fields_and_betas_are_logged_once(proxy: ProxyServer, upstream: ScriptedUpstream,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    field = f"brand_new_{uuid.uuid4().hex[:8]}"
    beta = f"brand-new-{uuid.uuid4().hex[:8]}-2027-01-01"
    with caplog.at_level(logging.INFO, logger="claude_proxy.fields"):
        for _ in range(3):
            response, sent = send(proxy, upstream, {**MINIMAL, field: {"x": 1},
                                                    "output_config": {field: 1}},
                                  {"anthropic-beta": beta})
            assert response.status_code == 200 and sent is not None and field not in sent
    lines = [r.getMessage() for r in caplog.records if r.name == "claude_proxy.fields"]
    assert [line for line in lines if field in line or beta in line] == [
        f"request field '{field}' is not in the field table; ignored (let us know what it "
        f"should do)",
        f"request field 'output_config.{field}' is not in the field table; ignored (let us "
        f"know what it should do)",
        f"anthropic-beta value '{beta}' is not in the field table; accepted, its fields "
        f"follow the table"]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name ==
               "claude_proxy.fields")


def test_the_docs_have_the_code_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    assert markdown_tables() in page, (
        "docs/api.md's field tables differ from the code's: paste the output of "
        "`python -m claude_proxy.conversion.fields`")


# ------------------------------------------------------------------ structured outputs


STRUCTURED = {**MINIMAL, "system": "You extract facts.",
              "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
REFUSED_SCHEMA = ("Invalid parameter: 'response_format' of type 'json_schema' is not supported "
                  "with this model.")
REFUSED_OBJECT = "response_format json_object is unavailable for this model"


def test_structured_output_steps_down_when_refused(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """json_schema refused → json_object + the schema in the system prompt, remembered for the
    model; json_object refused too → the prompt alone. The answer is the JSON each time."""
    proxy = proxy_factory()
    prompted = {"role": "system",
                "content": f"You extract facts.\n\n{schema_instruction(SCHEMA)}"}
    upstream.queue(error_reply(400, REFUSED_SCHEMA))
    first = httpx.post(f"{proxy.url}/v1/messages", json=STRUCTURED, timeout=30)
    assert json.loads(first.json()["content"][0]["text"]) == {"city": "example",
                                                              "population": 1}
    refused_request, fallback = upstream.requests
    assert refused_request["response_format"]["type"] == "json_schema"
    assert fallback["response_format"] == {"type": "json_object"}
    assert fallback["messages"][0] == prompted

    second = httpx.post(f"{proxy.url}/v1/messages", json=STRUCTURED, timeout=30)
    assert second.status_code == 200 and len(upstream.requests) == 3
    assert upstream.requests[2]["response_format"] == {"type": "json_object"}

    # Held to nothing but the prompt, the (scripted) model answers with the JSON it was asked for.
    upstream.queue(error_reply(400, REFUSED_OBJECT),
                   completion({"content": '{"city": "Lyon", "population": 2}'}))
    third = httpx.post(f"{proxy.url}/v1/messages", json=STRUCTURED, timeout=30)
    assert third.json()["content"] == [{"type": "text",
                                        "text": '{"city": "Lyon", "population": 2}'}]
    prompt_only = upstream.requests[4]
    assert "response_format" not in prompt_only and prompt_only["messages"][0] == prompted


def test_count_tokens_counts_the_schema(proxy: ProxyServer) -> None:
    """The schema counts as much as its text in the system prompt would."""
    def count(body: dict[str, Any]) -> int:
        response = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=body)
        assert response.status_code == 200
        return int(response.json()["input_tokens"])

    base = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}
    with_schema = count({**base, "output_config": {"format": {"type": "json_schema",
                                                               "schema": SCHEMA}}})
    assert with_schema == count({**base, "system": schema_instruction(SCHEMA)})
    assert with_schema > count(base) + 40


@pytest.mark.parametrize(("messages", "system"), [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
     "Be brief."),
    ([{"role": "system", "content": [{"type": "text", "text": "Be brief.",
                                      "cache_control": {"type": "ephemeral"}}]},
      {"role": "user", "content": "hi"}], "parts"),
])
def test_the_schema_prompt_joins_the_one_system_message(messages: list[dict[str, Any]],
                                                        system: str | None) -> None:
    """Whatever shape the system message has (none, a string, parts kept for caching), the
    schema text joins it: never a second system message, which some templates refuse."""
    body = {"model": "m", "messages": [dict(message) for message in messages]}
    apply_structured_output(body, SCHEMA, "json_object")
    instruction = schema_instruction(SCHEMA)
    assert body["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    content = body["messages"][0]["content"]
    if system is None:
        assert content == instruction
    elif system == "parts":
        assert content == [*messages[0]["content"], {"type": "text", "text": instruction}]
    else:
        assert content == f"{system}\n\n{instruction}"


def test_structured_output_on_the_responses_api(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """OpenAI reasoning models go to /responses, where the schema is `text.format`."""
    proxy = proxy_factory(provider="openai", middle_model="gpt-5")
    answer = '{"city": "Lyon", "population": 2}'
    upstream.queue(Reply(body={
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status":
                    "completed", "content": [{"type": "output_text", "text": answer,
                                              "annotations": []}]}],
        "usage": {"input_tokens": 30, "output_tokens": 9, "total_tokens": 39}}))
    response = httpx.post(f"{proxy.url}/v1/messages", json=STRUCTURED, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": answer}]
    assert upstream.paths == ["/v1/responses"]
    assert upstream.requests[0]["text"]["format"] == {
        "type": "json_schema", "name": "response", "schema": CLEAN_SCHEMA, "strict": True}
