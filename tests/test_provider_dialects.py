"""The 2026 providers' own dialects, end to end: a scripted upstream that behaves like the
provider (refuses what it refuses, with its 400 body; answers in its wire format), the exact
request the proxy sends it, and the answer checked through the anthropic SDK.

The provider facts, with their sources, are the fixtures in tests/data/dialects/ (see
docs/provider-dialects.md)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest

from claude_proxy.conversion.signatures import ThinkingSigner
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk

DIALECTS = Path(__file__).parent / "data" / "dialects"
SECRET = "dialects-signature-secret"
SIGNER = ThinkingSigner(SECRET)
BASH = {"name": "Bash", "description": "Run a command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
ADAPTIVE_HIGH = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((DIALECTS / f"{name}.json").read_text(encoding="utf-8"))


def start(factory: Callable[..., ProxyServer], provider: str, model: str,
          **overrides: Any) -> anthropic.Anthropic:
    proxy = factory(provider=provider, middle_model=model, thinking_signature_secret=SECRET,
                    reasoning_with_tools=True, **overrides)
    return anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)


def ask(client: anthropic.Anthropic, messages: list[dict[str, Any]], *, stream: bool = True,
        **fields: Any) -> Any:
    request: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 4096,
                               "messages": messages, **fields}
    if not stream:
        return client.messages.create(**request)
    with client.messages.stream(**request) as answer:
        return answer.get_final_message()


def blocks(message: Any) -> list[dict[str, Any]]:
    """The answer's content as the client sends it back next turn."""
    return [block.model_dump(exclude_none=True) for block in message.content]


def refuse(spec: dict[str, Any]) -> Reply:
    return Reply(status=spec["status"], body=spec["body"])


def tool_call_reply(call_id: str, command: str, reasoning: dict[str, Any] | None = None,
                    extra: dict[str, Any] | None = None) -> Reply:
    """A streamed answer: optional reasoning delta, then one Bash call."""
    call: dict[str, Any] = {"index": 0, "id": call_id, "type": "function", "function": {
        "name": "Bash", "arguments": json.dumps({"command": command})}}
    if extra is not None:
        call["extra_content"] = extra
    events: list[str | dict[str, Any]] = []
    if reasoning is not None:
        events.append(chunk({"role": "assistant", **reasoning}))
    events += [chunk({"tool_calls": [call]}), chunk({}, "tool_calls")]
    return Reply(events=events)


def tool_results(message: Any, output: str) -> dict[str, Any]:
    calls = [block for block in message.content if block.type == "tool_use"]
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                         "content": output} for call in calls]}


# ---------------------------------------------------------------- Kimi K3


@pytest.mark.parametrize(("fields", "effort"), [
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, "low"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"}}, "high"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "high"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "xhigh"}}, "max"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "max"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "low"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "high"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "max"),
    ({"thinking": {"type": "disabled"}}, "low"),
])
def test_kimi_k3_gets_reasoning_effort_and_no_thinking_object(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        fields: dict[str, Any], effort: str) -> None:
    recorded = fixture("kimi-k3-reasoning-effort")
    upstream.queue(Reply(events=list(recorded["response_chunks"])))
    client = start(proxy_factory, "kimi", "kimi-k3")
    message = ask(client, [{"role": "user", "content": "the formula?"}], **fields)
    sent = upstream.requests[0]
    assert sent["reasoning_effort"] == effort
    assert "thinking" not in sent
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The squares of Fibonacci numbers."
    assert SIGNER.verify(message.content[0].thinking, message.content[0].signature)
    assert message.content[1].text == "a(n) = F(n+1)^2"


def test_kimi_k2_keeps_its_thinking_switch(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    client = start(proxy_factory, "kimi", "kimi-k2.6")
    ask(client, [{"role": "user", "content": "hi"}], **ADAPTIVE_HIGH)
    assert upstream.requests[0]["thinking"] == {"type": "enabled"}
    assert "reasoning_effort" not in upstream.requests[0]


# ---------------------------------------------------------------- GLM-5.x


def glm_responder(calls: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Reply]:
    """GLM-5.3 on z.ai: refuses thinking disabled; answers a tool call, then text."""
    recorded = fixture("glm-5-thinking")

    def respond(body: dict[str, Any]) -> Reply:
        calls.append(copy.deepcopy(body))
        if body.get("thinking", {}).get("type") == "disabled":
            return refuse(recorded["refusal"])
        if not any(message["role"] == "tool" for message in body["messages"]):
            return tool_call_reply("call_glm_1", "ls",
                                   {"reasoning_content": "Let me look at the files."})
        return Reply(events=list(recorded["response_chunks"]))
    return respond


def test_glm5_always_thinking_is_never_sent_thinking_disabled(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = glm_responder(calls)
    client = start(proxy_factory, "glm", "glm-5.3")
    message = ask(client, [{"role": "user", "content": "run ls"}], tools=[BASH],
                  thinking={"type": "disabled"})
    assert len(calls) == 1, "no refused request, no retry"
    assert "thinking" not in calls[0]
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.content[1].input == {"command": "ls"}


def test_glm5_preserved_thinking_gets_its_reasoning_back(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = glm_responder(calls)
    client = start(proxy_factory, "glm", "glm-5.3")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "run ls"}]
    first = ask(client, messages, tools=[BASH], **ADAPTIVE_HIGH)
    messages += [{"role": "assistant", "content": blocks(first)}, tool_results(first, "a.txt")]
    final = ask(client, messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [c["thinking"] for c in calls] == [{"type": "enabled", "clear_thinking": False}] * 2
    assistant = calls[1]["messages"][1]
    assert assistant == {"role": "assistant", "content": None,
                         "reasoning_content": "Let me look at the files.",
                         "tool_calls": [{"id": "call_glm_1", "type": "function", "function": {
                             "name": "Bash", "arguments": '{"command":"ls"}'}}]}
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == "Listing."


# ---------------------------------------------------------------- forced tool_choice


def forced_responder(provider: str, calls: list[dict[str, Any]]
                     ) -> Callable[[dict[str, Any]], Reply]:
    """DeepSeek V4 (thinks unless told `disabled`) or Qwen on DashScope (thinks when
    `enable_thinking`): a forced tool_choice while thinking is refused with the real 400."""
    name = "deepseek-v4-forced-tool-choice" if provider == "deepseek" else (
        "dashscope-forced-tool-choice")
    recorded = fixture(name)

    def respond(body: dict[str, Any]) -> Reply:
        calls.append(copy.deepcopy(body))
        thinking = (body.get("thinking", {}).get("type") != "disabled" if provider == "deepseek"
                    else body.get("enable_thinking") is True)
        choice = body.get("tool_choice")
        if thinking and (choice == "required" or isinstance(choice, dict)):
            return refuse(recorded["refusal"])
        return tool_call_reply("call_00_forced", "date")
    return respond


@pytest.mark.parametrize(("provider", "model", "off"), [
    ("deepseek", "deepseek-v4-flash", {"thinking": {"type": "disabled"}}),
    ("dashscope", "qwen3.8-max", {"enable_thinking": False}),
])
@pytest.mark.parametrize(("choice", "sent_choice"), [
    ({"type": "any"}, "required"),
    ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
])
def test_forced_tool_turns_thinking_off_for_that_request(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream, provider: str,
        model: str, off: dict[str, Any], choice: dict[str, Any], sent_choice: Any) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = forced_responder(provider, calls)
    client = start(proxy_factory, provider, model)
    message = ask(client, [{"role": "user", "content": "what day is it?"}], tools=[BASH],
                  tool_choice=choice, **ADAPTIVE_HIGH)
    assert len(calls) == 1
    assert calls[0]["tool_choice"] == sent_choice
    for key, value in off.items():
        assert calls[0][key] == value
    assert [(b.type, b.input) for b in message.content] == [("tool_use", {"command": "date"})]
    # Not forced: thinking stays on.
    upstream.responder = forced_responder(provider, calls)
    ask(client, [{"role": "user", "content": "what day is it?"}], tools=[BASH],
        tool_choice={"type": "auto"}, **ADAPTIVE_HIGH)
    assert calls[-1].get("thinking", {}).get("type") == "enabled" or calls[-1].get(
        "enable_thinking") is True


# ---------------------------------------------------------------- MiniMax


def minimax_detail(text: str) -> dict[str, Any]:
    return {"type": "reasoning.text", "id": "reasoning-text-1",
            "format": "MiniMax-response-v1", "index": 0, "text": text}


def minimax_responder(calls: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Reply]:
    """MiniMax M3: with reasoning_split the reasoning streams as incremental
    reasoning_details (JSON answers carry it whole), without it as <think> in the content;
    three Bash calls, then the documented answer."""
    recorded = fixture("minimax-reasoning-details")

    def respond(body: dict[str, Any]) -> Reply:
        calls.append(copy.deepcopy(body))
        if body.get("reasoning_split") is not True:
            return Reply(events=[*(chunk({"content": piece})
                                   for piece in recorded["unsplit_content_chunks"]),
                                 chunk({}, "stop")])
        step = sum(1 for message in body["messages"] if message["role"] == "tool") + 1
        if step > 3:
            return Reply(events=list(recorded["response_chunks"]))
        call = {"index": 0, "id": f"call_function_{step}", "type": "function", "function": {
            "name": "Bash", "arguments": json.dumps({"command": f"echo {step}"})}}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "", "tool_calls": [call],
                       "reasoning_details": [minimax_detail(f"Step {step}: run it.")]}
            return Reply(body={"id": "mm", "object": "chat.completion", "model": "MiniMax-M3",
                               "choices": [{"index": 0, "finish_reason": "tool_calls",
                                            "message": message}]})
        return Reply(events=[
            chunk({"content": "", "role": "assistant", "name": "MiniMax AI",
                   "reasoning_details": [minimax_detail(f"Step {step}:")]}),
            chunk({"content": "", "reasoning_details": [minimax_detail(" run it.")]}),
            chunk({"tool_calls": [call]}), chunk({}, "tool_calls")])
    return respond


def test_minimax_reasoning_details_round_trip_over_three_tool_turns(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = minimax_responder(calls)
    client = start(proxy_factory, "minimax", "MiniMax-M3")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "echo 1, 2, 3"}]
    for step in (1, 2, 3):
        answer = ask(client, messages, stream=step != 2, tools=[BASH], **ADAPTIVE_HIGH)
        assert [b.type for b in answer.content] == ["thinking", "tool_use"]
        assert answer.content[0].thinking == f"Step {step}: run it."
        messages += [{"role": "assistant", "content": blocks(answer)},
                     tool_results(answer, str(step))]
    final = ask(client, messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in final.content] == [
        ("thinking", "The user is asking how I am, which is a simple greeting."),
        ("text", "I'm well, thanks!")]
    assert all(call["reasoning_split"] is True for call in calls)
    sent = [m for m in calls[-1]["messages"] if m["role"] == "assistant"]
    assert [m["reasoning_details"] for m in sent] == [
        [minimax_detail(f"Step {step}: run it.")] for step in (1, 2, 3)]
    assert [m["tool_calls"][0]["id"] for m in sent] == [f"call_function_{s}" for s in (1, 2, 3)]
    assert all("reasoning_content" not in m for m in sent)


def test_minimax_think_tags_without_reasoning_split_become_thinking(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = minimax_responder(calls)
    client = start(proxy_factory, "minimax", "MiniMax-M3", reasoning_dialect="thinking")
    message = ask(client, [{"role": "user", "content": "hi"}], **ADAPTIVE_HIGH)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in message.content] == [("thinking", "\nThe user wants me to say hi.\n"),
                                          ("text", "\n\nHi! How can I help you today?")]


# ---------------------------------------------------------------- Gemini 3


def gemini_responder(calls: list[dict[str, Any]], issued: set[str]
                     ) -> Callable[[dict[str, Any]], Reply]:
    """Gemini 3 on the OpenAI-compatible endpoint: every earlier tool-call turn must carry a
    signature it issued (or the documented skip value) on its first call, else the real 400;
    three Bash calls each with a fresh signature, in the documented chunk (no `index`, the
    finish reason in the same chunk) or as one JSON body, then the answer."""
    recorded = fixture("gemini-thought-signature")

    def respond(body: dict[str, Any]) -> Reply:
        calls.append(copy.deepcopy(body))
        for message in body["messages"]:
            if message["role"] == "assistant" and message.get("tool_calls"):
                extra = message["tool_calls"][0].get("extra_content", {})
                signature = extra.get("google", {}).get("thought_signature")
                if signature not in issued | {recorded["skip_value"]}:
                    return refuse(recorded["refusal"])
        step = sum(1 for message in body["messages"] if message["role"] == "tool") + 1
        if step > 3:
            return Reply(events=[chunk({"role": "assistant", "content": "All done."}),
                                 chunk({}, "stop")])
        signature = f"CiQBsig{step}" + "A" * 40
        issued.add(signature)
        answer = copy.deepcopy(recorded["response_chunks"][0])
        call = answer["choices"][0]["delta"]["tool_calls"][0]
        call.update(id=f"function-call-{step}", extra_content={
            "google": {"thought_signature": signature}}, function={
            "name": "Bash", "arguments": json.dumps({"command": f"echo {step}"})})
        if body.get("stream"):
            return Reply(events=[answer])
        choice = answer["choices"][0]
        choice["message"] = choice.pop("delta")
        return Reply(body={**answer, "object": "chat.completion"})
    return respond


def test_gemini_thought_signatures_round_trip_over_three_tool_turns(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    issued: set[str] = set()
    upstream.responder = gemini_responder(calls, issued)
    client = start(proxy_factory, "gemini", "gemini-3.8-flash")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "echo 1, 2, 3"}]
    for step in (1, 2, 3):
        answer = ask(client, messages, stream=step != 2, tools=[BASH], **ADAPTIVE_HIGH)
        assert [b.type for b in answer.content] == ["thinking", "tool_use"]
        assert answer.content[0].thinking == ""  # the signature is no text for the user
        assert "CiQBsig" not in answer.content[0].signature
        messages += [{"role": "assistant", "content": blocks(answer)},
                     tool_results(answer, str(step))]
    final = ask(client, messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [b.text for b in final.content if b.type == "text"] == ["All done."]
    assert len(calls) == 4 and all(c["reasoning_effort"] == "high" for c in calls)
    sent = [m for m in calls[-1]["messages"] if m["role"] == "assistant"]
    assert [m["tool_calls"] for m in sent] == [[{
        "id": f"function-call-{step}", "type": "function",
        "function": {"name": "Bash", "arguments": json.dumps({"command": f"echo {step}"},
                                                             separators=(",", ":"))},
        "extra_content": {"google": {"thought_signature": f"CiQBsig{step}" + "A" * 40}}}]
        for step in (1, 2, 3)]
    assert all("reasoning_details" not in m for m in sent)


def test_gemini_history_without_a_signature_takes_the_skip_value(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    calls: list[dict[str, Any]] = []
    upstream.responder = gemini_responder(calls, set())
    client = start(proxy_factory, "gemini", "gemini-3.8-flash")
    other_model_turn = {"role": "assistant", "content": [
        {"type": "text", "text": "Running two."},
        {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "echo a"}},
        {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "echo b"}}]}
    messages = [{"role": "user", "content": "echo a and b"}, other_model_turn,
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a"},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "b"}]},
                {"role": "assistant", "content": "Both ran."},
                {"role": "user", "content": "and now?"}]
    answer = ask(client, messages, tools=[BASH], **ADAPTIVE_HIGH)
    assert [b.type for b in answer.content] == ["thinking", "tool_use"]
    first, second = calls[0]["messages"][1]["tool_calls"]
    assert first["extra_content"] == {"google": {
        "thought_signature": "skip_thought_signature_validator"}}
    assert "extra_content" not in second


def test_gemini_refuses_a_tool_turn_without_signature(upstream: ScriptedUpstream) -> None:
    """The scripted Gemini itself: what it refuses, the way Google does (so the tests above
    would fail against a proxy that dropped the signature)."""
    import httpx
    upstream.responder = gemini_responder([], set())
    recorded = fixture("gemini-thought-signature")
    body = copy.deepcopy(recorded["request"])
    del body["messages"][1]["tool_calls"][0]["extra_content"]
    response = httpx.post(f"{upstream.base_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json() == recorded["refusal"]["body"]


# ---------------------------------------------------------------- with the real Claude Code


def claude_code_gemini(calls: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Reply]:
    """Gemini 3 for Claude Code's tool loop: one signed Bash call, then (only if the call
    came back with its signature) an answer quoting the output."""
    recorded = fixture("gemini-thought-signature")
    signature = "CiQBcc" + "B" * 60

    def respond(body: dict[str, Any]) -> Reply:
        calls.append(copy.deepcopy(body))
        last = body["messages"][-1]
        if last["role"] != "tool":
            answer = copy.deepcopy(recorded["response_chunks"][0])
            call = answer["choices"][0]["delta"]["tool_calls"][0]
            call.update(id="function-call-cc", extra_content={
                "google": {"thought_signature": signature}}, function={
                "name": "Bash", "arguments": json.dumps({
                    "command": "echo hi-from-gemini", "description": "Print a greeting"})})
            return Reply(events=[answer])
        sent = body["messages"][-2]["tool_calls"][0].get("extra_content")
        if sent != {"google": {"thought_signature": signature}}:
            return refuse(recorded["refusal"])
        first_line = last["content"].splitlines()[0]
        return Reply(events=[chunk({"role": "assistant", "content": "It printed: "}),
                             chunk({"content": first_line}), chunk({}, "stop")])
    return respond


@pytest.mark.claude_code
def test_claude_code_gives_gemini_its_signature_back(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    from tests.test_claude_code import CLAUDE_BIN, run_claude
    if not CLAUDE_BIN.exists():
        pytest.skip("Claude Code not installed (make test installs it)")
    proxy = proxy_factory(provider="gemini", middle_model="gemini-3.8-flash",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    calls: list[dict[str, Any]] = []
    upstream.responder = claude_code_gemini(calls)
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    assert lines[-1]["is_error"] is False, lines[-1]
    assert lines[-1]["result"] == "It printed: hi-from-gemini"
    assert len(calls) == 2 and calls[0]["reasoning_effort"] == "high"  # adaptive, Sonnet at high
