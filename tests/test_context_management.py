"""Context management: the edits the proxy honours (conversion/context_edits.py) on a recorded
Claude Code session, every knob; and through the real proxy, `applied_edits` on the message
and streamed on `message_delta` (beside `delta` and `usage`), `[]` when nothing was done, the
input estimate in `message_start`, and the 400 for a malformed field."""

from __future__ import annotations

import copy
import json
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.conversion import context_edits
from claude_proxy.conversion.context_edits import CLEARED, apply, check
from claude_proxy.errors import ProxyError
from tests.conftest import ProxyServer, load_fixture
from tests.scripted_upstream import ScriptedUpstream, completion, text_stream
from tests.sse_grammar import accumulate, check_grammar, parse_sse

OUTPUT = "x" * 400
"""Each step's tool output, long enough that clearing it saves something."""


def session() -> dict[str, Any]:
    """The last request of a recorded 10-turn Claude Code session (9 Bash calls, each
    answered), with each tool's output lengthened to OUTPUT."""
    body = copy.deepcopy(load_fixture("claude-code-2.1.328-session-10-turns.json")
                         ["turns"][-1]["body"])
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block["type"] == "tool_result":
                block["content"] = f"{block['content']}\n{OUTPUT}"
    return body


def with_edits(body: dict[str, Any], *edits: dict[str, Any]) -> dict[str, Any]:
    return {**body, "context_management": {"edits": list(edits)}}


def results(body: dict[str, Any]) -> list[str]:
    return [block["content"] for message in body["messages"] if message["role"] == "user"
            for block in message["content"] if block["type"] == "tool_result"]


def inputs(body: dict[str, Any]) -> list[Any]:
    return [block["input"] for message in body["messages"] if message["role"] == "assistant"
            for block in message["content"] if block["type"] == "tool_use"]


CLEAR = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 5}}
STEP_TOKENS = (len("step-1\n") + len(OUTPUT) - len(CLEARED) + 3) // 4


# ---------------------------------------------------------------- the pure function


def test_claude_codes_own_edit_does_nothing() -> None:
    body = session()
    assert body["context_management"] == {
        "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    edited = apply(body, 50_000, needs_reasoning=False)
    assert edited.applied == [] and edited.body is body


def test_clear_tool_uses_keeps_the_last_three() -> None:
    body = with_edits(session(), CLEAR)
    original = copy.deepcopy(body)
    edited = apply(body, 1_000, needs_reasoning=False)
    assert results(edited.body) == [CLEARED] * 6 + [f"step-{n}\n{OUTPUT}" for n in (7, 8, 9)]
    assert inputs(edited.body) == inputs(original)  # inputs stay without clear_tool_inputs
    chars = 6 * (len("step-1\n") + len(OUTPUT) - len(CLEARED))
    assert edited.applied == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 6,
                               "cleared_input_tokens": -(-chars // 4)}]
    assert body == original  # the client's body is never changed


@pytest.mark.parametrize(("trigger", "fires"), [
    ({"type": "tool_uses", "value": 8}, True),
    ({"type": "tool_uses", "value": 9}, False),
    ({"type": "input_tokens", "value": 29_999}, True),
    ({"type": "input_tokens", "value": 30_000}, False),
])
def test_trigger(trigger: dict[str, Any], fires: bool) -> None:
    edited = apply(with_edits(session(), {**CLEAR, "trigger": trigger}), 30_000,
                   needs_reasoning=False)
    assert bool(edited.applied) is fires


def test_default_trigger_is_100k_input_tokens() -> None:
    edit = {"type": "clear_tool_uses_20250919"}
    assert apply(with_edits(session(), edit), 100_000, needs_reasoning=False).applied == []
    assert apply(with_edits(session(), edit), 100_001, needs_reasoning=False).applied


def test_keep() -> None:
    edited = apply(with_edits(session(), {**CLEAR, "keep": {"type": "tool_uses", "value": 7}}),
                   0, needs_reasoning=False)
    assert results(edited.body)[:3] == [CLEARED, CLEARED, f"step-3\n{OUTPUT}"]
    assert edited.applied[0]["cleared_tool_uses"] == 2


def test_exclude_tools() -> None:
    edited = apply(with_edits(session(), {**CLEAR, "exclude_tools": ["Bash"]}), 0,
                   needs_reasoning=False)
    assert edited.applied == [] and CLEARED not in results(edited.body)


@pytest.mark.parametrize(("clear_inputs", "cleared"), [
    (True, True), (["Bash"], True), (["Read"], False), (False, False)])
def test_clear_tool_inputs(clear_inputs: Any, cleared: bool) -> None:
    edited = apply(with_edits(session(), {**CLEAR, "clear_tool_inputs": clear_inputs}), 0,
                   needs_reasoning=False)
    first = inputs(edited.body)[0]
    assert (first == {}) is cleared
    assert inputs(edited.body)[-1] == {"command": "echo step-9",
                                       "description": "Print step 9"}


def test_clear_at_least() -> None:
    enough = 6 * STEP_TOKENS
    for floor, fires in ((enough - 6, True), (enough + 10, False)):
        edit = {**CLEAR, "clear_at_least": {"type": "input_tokens", "value": floor}}
        edited = apply(with_edits(session(), edit), 0, needs_reasoning=False)
        assert bool(edited.applied) is fires, floor


def test_cleared_results_are_not_cleared_twice() -> None:
    once = apply(with_edits(session(), CLEAR), 0, needs_reasoning=False).body
    again = apply(once, 0, needs_reasoning=False)
    assert again.applied == [] and results(again.body) == results(once)


def thinking_session() -> dict[str, Any]:
    body = session()
    for number, message in enumerate(m for m in body["messages"] if m["role"] == "assistant"):
        message["content"].insert(0, {"type": "thinking", "thinking": f"plan {number} " * 10,
                                      "signature": "sig"})
    return body


def test_clear_thinking_keeps_the_last_turns() -> None:
    body = with_edits(thinking_session(), {"type": "clear_thinking_20251015",
                                           "keep": {"type": "thinking_turns", "value": 2}})
    edited = apply(body, 0, needs_reasoning=False)
    kinds = [[b["type"] for b in m["content"]] for m in edited.body["messages"]
             if m["role"] == "assistant"]
    assert kinds == [["text", "tool_use"]] * 7 + [["thinking", "text", "tool_use"]] * 2
    assert edited.applied == [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 7,
                               "cleared_input_tokens": (7 * 70 + 3) // 4}]


def test_clear_thinking_is_left_to_upstreams_that_need_reasoning_back() -> None:
    body = with_edits(thinking_session(), {"type": "clear_thinking_20251015",
                                           "keep": {"type": "thinking_turns", "value": 1}})
    edited = apply(body, 0, needs_reasoning=True)
    assert edited.applied == [] and edited.body is body


@pytest.mark.parametrize("keep", [None, "all", {"type": "all"}])
def test_clear_thinking_keeps_all_by_default(keep: Any) -> None:
    edit = {"type": "clear_thinking_20251015", **({"keep": keep} if keep else {})}
    body = with_edits(thinking_session(), edit)
    assert apply(body, 0, needs_reasoning=False).applied == []


@pytest.mark.parametrize(("config", "message"), [
    ("all", "context_management: Input should be a valid dictionary"),
    ({"edits": {}}, "context_management.edits: Input should be a valid list"),
    ({"edits": [{"type": "compact_20260112"}]},
     "context_management.edits.0.type: 'compact_20260112' is not supported by this proxy "
     "(supported: clear_tool_uses_20250919, clear_thinking_20251015)"),
    ({"edits": [{**CLEAR, "trigger": {"type": "turns", "value": 3}}]},
     "context_management.edits.0.trigger: Input should be an object with type "
     "'input_tokens' or 'tool_uses'"),
    ({"edits": [{**CLEAR, "keep": {"type": "tool_uses", "value": -1}}]},
     "context_management.edits.0.keep.value: Input should be a non-negative integer"),
    ({"edits": [{**CLEAR, "exclude_tools": "Bash"}]},
     "context_management.edits.0.exclude_tools: Input should be a list of tool names"),
    ({"edits": [{**CLEAR, "clear_tool_inputs": "yes"}]},
     "context_management.edits.0.clear_tool_inputs: Input should be a boolean or a list of "
     "tool names"),
    ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "turns"}}]},
     "context_management.edits.0.keep: Input should be an object with type "
     "'thinking_turns' or 'all'"),
    ({"edits": [{"type": "clear_thinking_20251015",
                 "keep": {"type": "thinking_turns", "value": 0}}]},
     "context_management.edits.0.keep.value: Input should be greater than 0"),
    ({"edits": [CLEAR, {"type": "clear_thinking_20251015", "keep": "all"}]},
     "context_management.edits.1: clear_thinking_20251015 must be listed first in `edits`"),
])
def test_malformed_context_management(config: Any, message: str) -> None:
    with pytest.raises(ProxyError) as raised:
        check({"context_management": config})
    assert raised.value.status == 400 and raised.value.message == message


def test_every_recorded_request_is_well_formed() -> None:
    for name in ("claude-code-2.1.332-first-request.json",
                 "claude-code-2.1.332-subagent-request.json",
                 "claude-code-2.1.332-tool-loop-second-request.json"):
        check(load_fixture(name)["body"])


def test_which_upstreams_need_reasoning_back(proxy: ProxyServer) -> None:
    from claude_proxy.config.settings import Settings
    assert not context_edits.needs_reasoning(Settings(provider="openai"))
    assert context_edits.needs_reasoning(Settings(provider="deepseek"))
    assert context_edits.needs_reasoning(Settings(provider="gemini"))


# ---------------------------------------------------------------- through the proxy


def stream(proxy: ProxyServer, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                                dict[str, Any]]:
    """message_start's message, the message_delta, and the accumulated message."""
    response = httpx.post(f"{proxy.url}/v1/messages", json={**body, "stream": True},
                          timeout=30)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    check_grammar(events)
    start = events[0].data["message"]
    end = next(event.data for event in events if event.name == "message_delta")
    return start, end, accumulate(events)


def test_claude_codes_request_gets_empty_applied_edits(proxy: ProxyServer,
                                                       upstream: ScriptedUpstream) -> None:
    body = load_fixture("claude-code-2.1.332-first-request.json")["body"]
    upstream.queue(text_stream(["hi"]))
    start, end, message = stream(proxy, body)
    assert end["context_management"] == {"applied_edits": []}
    assert message["context_management"] == {"applied_edits": []}
    assert start["usage"]["input_tokens"] > 1000  # the estimate: never 0 (compaction reads it)
    assert "context_management" not in upstream.requests[0]


def test_cleared_history_reaches_the_upstream(proxy: ProxyServer,
                                              upstream: ScriptedUpstream) -> None:
    body = {key: value for key, value in session().items() if key != "context_management"}
    upstream.queue(text_stream(["done"]), text_stream(["done"]))
    plain_start, plain_end, _ = stream(proxy, body)
    assert "context_management" not in plain_end
    start, end, _ = stream(proxy, with_edits(body, {**CLEAR, "clear_tool_inputs": True}))
    applied = end["context_management"]["applied_edits"]
    assert [(e["type"], e["cleared_tool_uses"]) for e in applied] == [
        ("clear_tool_uses_20250919", 6)]
    tool_messages = [m["content"] for m in upstream.requests[1]["messages"]
                     if m["role"] == "tool"]
    assert tool_messages[:6] == [CLEARED] * 6 and tool_messages[6].startswith("step-7")
    calls = [call for m in upstream.requests[1]["messages"] for call in m.get("tool_calls", [])]
    assert [json.loads(c["function"]["arguments"]) for c in calls[:1]] == [{}]
    assert start["usage"]["input_tokens"] == (plain_start["usage"]["input_tokens"]
                                              - applied[0]["cleared_input_tokens"])


def test_non_streamed_message_carries_applied_edits(proxy: ProxyServer,
                                                    upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "done"}))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    message = client.beta.messages.create(
        model="claude-sonnet-4-6", max_tokens=100, messages=session()["messages"],
        context_management={"edits": [CLEAR]},  # type: ignore[list-item]
        betas=["context-management-2025-06-27"])
    assert message.context_management is not None
    [edit] = message.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919" and edit.cleared_tool_uses == 6


def test_sdk_stream_reads_applied_edits(proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["done"]))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    with client.beta.messages.stream(
            model="claude-sonnet-4-6", max_tokens=100, messages=session()["messages"],
            context_management={"edits": [CLEAR]},  # type: ignore[list-item]
            betas=["context-management-2025-06-27"]) as running:
        message = running.get_final_message()
    assert message.context_management is not None
    assert message.context_management.applied_edits[0].cleared_tool_uses == 6


def test_malformed_context_management_gets_a_400(proxy: ProxyServer,
                                                 upstream: ScriptedUpstream) -> None:
    response = httpx.post(f"{proxy.url}/v1/messages", json={
        "model": "claude-sonnet-4-6", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": [{"type": "compact_20260112"}]}}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": "context_management.edits.0.type: 'compact_20260112' is not supported by "
                   "this proxy (supported: clear_tool_uses_20250919, clear_thinking_20251015)"}
    assert upstream.requests == []
