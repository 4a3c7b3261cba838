"""Local model servers as they really behave (llama.cpp's llama-server, strict chat templates,
vLLM): stop sequences, permanent configuration errors, strict alternation, a tool call cut by
the output limit, the `llamacpp` profile, and the upstream's words in the log.

The upstream replays what a real llama-server answered (`tests/data/llamacpp/*.http`: status,
headers and body exactly as recorded); clients are the anthropic SDK and raw HTTP.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from claude_proxy.conversion.stop_sequences import StopMatcher
from tests.conftest import UPSTREAM_KEY, ProxyServer, clean_env, load_fixture
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    http_recording,
    recorded_body,
    text_stream,
)
from tests.sse_grammar import accumulate, check_grammar, parse_sse
from tests.test_streaming import ask, sdk


def streamed(proxy: ProxyServer, body: dict[str, Any]) -> dict[str, Any]:
    """The Message a streamed answer adds up to, its SSE grammar checked."""
    response = httpx.post(f"{proxy.url}/v1/messages", json={**body, "stream": True},
                          timeout=30)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    check_grammar(events)
    return accumulate(events)


def answer(proxy: ProxyServer, body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The Message, streamed (raw SSE, grammar checked) or not (the SDK)."""
    if stream:
        return streamed(proxy, body)
    return sdk(proxy).messages.create(**body).model_dump()


# ---------------------------------------------------------------- stop sequences

SEQUENCES = ["\n\nUser:", "###", "END"]


@pytest.mark.parametrize(("sequences", "pieces", "relayed", "matched"), [
    (["aab"], ["a", "a", "a", "b"], "a", "aab"),  # a held "aa" may still be the start
    (["END"], ["E", "N", "x"], "ENx", None),  # held, then given up: nothing lost
    (["abc", "b"], ["abc"], "a", "b"),  # "b" was complete before "abc" was
    (["bc", "abc"], ["xabc"], "x", "abc"),  # both complete together: the longer
    (["", "x"], ["a", "x"], "a", "x"),  # an empty sequence matches nothing
])
def test_stop_matcher(sequences: list[str], pieces: list[str], relayed: str,
                      matched: str | None) -> None:
    matcher = StopMatcher(sequences)
    out, found = "", None
    for piece in pieces:
        text, found = matcher.feed(piece)
        out += text
        if found is not None:
            break
    out += matcher.flush() if found is None else ""
    assert (out, found) == (relayed, matched)


def stalled_after(pieces: list[str], matched_at: int) -> Reply:
    """A text stream that stops sending after the piece that completes a match (and waits
    until the proxy hangs up): only a proxy that ends the answer there can finish."""
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    events.append(chunk({}, "stop"))
    return Reply(events=events, stall_at=matched_at + 2)


@pytest.mark.parametrize(("pieces", "matched_at", "text", "sequence"), [
    # "END" split over three chunks; "EN" is held back until the "D" decides.
    (["Here is the ans", "wer. E", "N", "D and more"], 3, "Here is the answer. ", "END"),
    # "###" arrives one character a chunk; the other sequences never complete.
    (["Title\n\nUse", "r #", "#", "# body"], 3, "Title\n\nUser ", "###"),
    # Two could match: the one completed first wins ("\n\nUser:" ends before "END").
    (["a\n\nUser:END"], 0, "a", "\n\nUser:"),
])
@pytest.mark.parametrize("stream", [True, False])
def test_stop_sequence_ends_the_answer_names_it_and_cancels_the_upstream(
        proxy: ProxyServer, upstream: ScriptedUpstream, stream: bool, pieces: list[str],
        matched_at: int, text: str, sequence: str) -> None:
    upstream.queue(stalled_after(pieces, matched_at))
    message = answer(proxy, ask(stop_sequences=SEQUENCES), stream)
    assert message["content"] == [{"type": "text", "text": text, **(
        {"citations": None} if not stream else {})}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", sequence)
    assert upstream.wait_until_idle(), "the upstream stream was not cancelled"
    sent = upstream.requests[0]
    assert "stop" not in sent and sent["stream"] is True


def test_streamed_text_is_held_back_only_while_it_may_start_a_sequence(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(stalled_after(["Here is the ans", "wer. E", "N", "D and more"], 3))
    response = httpx.post(f"{proxy.url}/v1/messages",
                          json=ask(stream=True, stop_sequences=SEQUENCES), timeout=30)
    events = parse_sse(response.content)
    deltas = [e.data["delta"]["text"] for e in events if e.name == "content_block_delta"]
    assert deltas == ["Here is the ans", "wer. "]
    assert events[-2].data["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_held_back_text_is_relayed_when_no_sequence_completes(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(text_stream(["almost EN", "d ##", "!"]))
    message = streamed(proxy, ask(stop_sequences=SEQUENCES))
    assert message["content"] == [{"type": "text", "text": "almost ENd ##!"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)


def llamacpp_stop(body: dict[str, Any]) -> Reply:
    """Like the recorded llama-server: given `stop`, it cuts the text and says only "stop"
    (stop_seq.http, replayed exactly); without, the model goes on ("Writ" + "e …")."""
    if "stop" in body:
        return http_recording("stop_seq")
    return text_stream(["Writ", "e a story", " about the sea."])


@pytest.mark.parametrize("stream", [True, False])
def test_llamacpp_stop_sequence_is_named(proxy: ProxyServer, upstream: ScriptedUpstream,
                                         stream: bool) -> None:
    upstream.responder = llamacpp_stop
    message = answer(proxy, ask(stop_sequences=["e"]), stream)
    assert message["content"][0]["text"] == "Writ"
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "e")
    assert len(upstream.requests) == 1 and "stop" not in upstream.requests[0]


def test_recorded_llamacpp_cut_alone_cannot_name_the_sequence(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """What the recording shows: with only `finish_reason: "stop"` nothing says a sequence
    matched; the proxy does not invent one."""
    upstream.queue(http_recording("stop_seq"))
    message = sdk(proxy).messages.create(**ask()).model_dump()
    assert message["content"][0]["text"] == "Writ"
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert json.loads(recorded_body("stop_seq"))["usage"]["completion_tokens"] == \
        message["usage"]["output_tokens"]


@pytest.mark.parametrize("field", ["stop_reason", "matched_stop"])
def test_vllm_stops_itself_and_names_the_string(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        field: str) -> None:
    proxy = proxy_factory(provider="vllm")
    final = chunk({}, "stop")
    final["choices"][0][field] = "END"
    upstream.queue(Reply(events=[chunk({"role": "assistant", "content": "abc"}), final]))
    message = sdk(proxy).messages.create(**ask(stop_sequences=["END", "STOP"])).model_dump()
    assert message["content"][0]["text"] == "abc"
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert upstream.requests[0]["stop"] == ["END", "STOP"]


# ---------------------------------------------------------------- configuration errors

JINJA_ADVICE = "start llama-server with --jinja"
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize("stream", [False, True])
def test_llamacpp_without_jinja_is_a_400_at_once(
        proxy: ProxyServer, upstream: ScriptedUpstream, stream: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    upstream.responder = lambda body: http_recording("nojinja-tools")
    with caplog.at_level(logging.WARNING, logger="claude_proxy"):
        response = httpx.post(f"{proxy.url}/v1/messages",
                              json=ask(tools=[TOOL], stream=stream), timeout=30)
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "the upstream server cannot take this request as it is set up: tools param "
                   "requires --jinja flag (500). To fix: start llama-server with --jinja "
                   "(tools are rendered by the chat template only then)."}}
    assert len(upstream.requests) == 1  # MAX_RETRIES=2, yet no retry
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(line.startswith("upstream failed (500 invalid_request_error): 'the upstream "
                               "server cannot take this request as it is set up: tools param "
                               "requires --jinja flag (500).") and line.endswith("not retried")
               for line in warnings), warnings
    assert any(JINJA_ADVICE in line for line in warnings), warnings


@pytest.mark.parametrize(("status", "message", "advice"), [
    (400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
          "to be set", "start vLLM with --enable-auto-tool-choice"),
    (400, "registry.ollama.ai/library/gemma3:270m does not support tools",
     "choose a model that can call tools"),
    (400, '"nomic-embed-text" does not support chat', "configure a chat model"),
    (500, "image input is not supported - hint: if this is unexpected, you may need to "
          "provide the mmproj", "start llama-server with the model's --mmproj"),
    (500, "Unsupported param: tool_choice", JINJA_ADVICE),
])
def test_not_supported_answers_say_what_to_change(
        proxy: ProxyServer, upstream: ScriptedUpstream, status: int, message: str,
        advice: str) -> None:
    upstream.responder = lambda body: error_reply(status, message)
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(proxy).messages.create(**ask(tools=[TOOL]))
    error = raised.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"] and advice in error["message"]
    assert len(upstream.requests) == 1


def test_each_failed_attempt_logs_the_upstream_words_redacted_and_capped(
        proxy: ProxyServer, upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    words = f"model is loading (key {UPSTREAM_KEY}) " + "x" * 3000
    upstream.responder = lambda body: error_reply(503, words)
    with caplog.at_level(logging.WARNING, logger="claude_proxy.upstream"):
        response = httpx.post(f"{proxy.url}/v1/messages", json=ask(), timeout=30)
    assert response.status_code == 503
    lines = [r.getMessage() for r in caplog.records if r.name == "claude_proxy.upstream"]
    assert len(lines) == 3 == len(upstream.requests)  # two retries, then the last failure
    shown = "model is loading (key [REDACTED]) "
    expected = f"'{shown}" + "x" * (300 - len(shown)) + "…'"  # the first 300 characters
    assert lines[0] == f"upstream failed (503 overloaded_error): {expected}; retry 1 in 0.00s"
    assert lines[2] == f"upstream failed (503 overloaded_error): {expected}; not retried"
    assert all(UPSTREAM_KEY not in line for line in lines)


# ---------------------------------------------------------------- strict alternation


def alternates(messages: list[dict[str, Any]]) -> bool:
    """Gemma 3's template (`(message['role'] == 'user') != (loop.index0 % 2 == 0)` raises):
    after an optional first system message, user and assistant strictly alternate from user,
    and a `tool` message, neither, is refused wherever it stands."""
    if messages and messages[0]["role"] == "system":
        messages = messages[1:]
    expected = "user"
    for message in messages:
        if message["role"] != expected:
            return False
        expected = "assistant" if expected == "user" else "user"
    return True


def strict_template(inner: Callable[[dict[str, Any]], Reply],
                    refused: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Reply]:
    """An upstream that refuses, with the recorded llama-server answer, every conversation
    whose roles do not alternate."""
    def respond(body: dict[str, Any]) -> Reply:
        if not alternates(body["messages"]):
            refused.append(body)
            return http_recording("gemma3tmpl-toolresult")
        return inner(body)
    return respond


def test_strict_template_gets_a_folded_conversation_once_learned(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(lambda body: text_stream(["done"]), refused)
    body = load_fixture("claude-code-2.1.328-tool-loop-second-request.json")["body"]
    body = {**body, "model": "gemma-3-strict-a", "thinking": {"type": "disabled"}}
    for _ in range(2):
        message = streamed(proxy, body)
        assert message["content"] == [{"type": "text", "text": "done"}]
    assert len(refused) == 1 and len(upstream.requests) == 3  # refused, folded, folded
    folded = upstream.requests[1]["messages"]
    assert upstream.requests[2]["messages"] == folded
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    environment = body["messages"][1]["content"]
    assert folded[1]["content"].endswith(
        f"\n\n<system-reminder>\n{environment}\n</system-reminder>")
    call = refused[0]["messages"][-2]["tool_calls"][0]["function"]
    assert folded[2]["content"].endswith(
        f'<tool_call>\n{{"name":"{call["name"]}","arguments":{call["arguments"]}}}\n'
        "</tool_call>")
    assert folded[3]["content"].startswith("<tool_response>\nhi-from-tool")
    assert "tool_calls" not in folded[2]


def test_folding_merges_same_role_messages_and_text_after_tool_results(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(lambda body: completion({"content": "ok"}), refused)
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
            "input": {"city": "Paris"}}
    body = ask(model="gemma-3-strict-b", tools=[TOOL], messages=[
        {"role": "user", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, call]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "text", "text": "<system-reminder>be brief</system-reminder>"}]},
    ])
    assert sdk(proxy).messages.create(**body).content[0].text == "ok"  # type: ignore[union-attr]
    assert len(refused) == 1
    assert upstream.requests[1]["messages"] == [
        {"role": "user", "content": "one\n\ntwo"},
        {"role": "assistant", "content": 'Looking.\n\n<tool_call>\n'
         '{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'},
        {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"
         "\n\n<system-reminder>be brief</system-reminder>"}]
    assert upstream.requests[1]["tools"] == refused[0]["tools"]  # still offered


def tool_loop(calls: int) -> list[dict[str, Any]]:
    """A conversation that alternates but for its tool turns: `calls` weather calls, each
    answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather?"}]
    for n in range(1, calls + 1):
        messages += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{n}",
                                               "name": "get_weather",
                                               "input": {"city": f"City {n}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                          "content": f"sunny {n}"}]}]
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_recorded_tool_result_refusal_is_retried_once_with_the_loop_as_text(
        proxy: ProxyServer, upstream: ScriptedUpstream, stream: bool) -> None:
    """The template refuses the first `tool` message (the recorded llama-server answer);
    the call and its result go again as text, in order; later requests go so at once."""
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(
        lambda body: text_stream(["fine"]) if body.get("stream")
        else completion({"content": "fine"}), refused)
    model = f"gemma-3-strict-loop-{stream}"
    for calls in (1, 2):
        message = answer(proxy, ask(model=model, tools=[TOOL], messages=tool_loop(calls)),
                         stream)
        assert [(b["type"], b["text"]) for b in message["content"]] == [("text", "fine")]
    assert [m["role"] for m in refused[0]["messages"]] == ["user", "assistant", "tool"]
    assert len(refused) == 1 and len(upstream.requests) == 3
    answered = upstream.requests[2]["messages"]
    assert answered == [{"role": "user", "content": "weather?"}] + [
        message for n in (1, 2) for message in (
            {"role": "assistant", "content": '<tool_call>\n{"name":"get_weather",'
             f'"arguments":{{"city":"City {n}"}}}}\n</tool_call>'},
            {"role": "user", "content": f"<tool_response>\nsunny {n}\n</tool_response>"})]


def test_one_refusal_without_tool_turns_teaches_the_tool_turns_as_text_too(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """Claude Code's first request has no tool turn: its refusal (the recorded llama-server
    answer) teaches the whole strict form, so the next requests, with `tool` messages, go as
    text at once: one refusal per model, not two."""
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(lambda body: completion({"content": "ok"}), refused)
    first = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    for messages in (first, tool_loop(1), tool_loop(2)):
        body = ask(model="gemma-3-strict-c", tools=[TOOL], messages=messages)
        assert sdk(proxy).messages.create(**body).content[0].text == "ok"  # type: ignore
    assert len(refused) == 1 and len(upstream.requests) == 4
    assert [m["role"] for m in refused[0]["messages"]] == ["user", "user"]
    assert upstream.requests[1]["messages"] == [{"role": "user", "content": "a\n\nb"}]
    assert upstream.requests[3]["messages"] == [{"role": "user", "content": "weather?"}] + [
        message for n in (1, 2) for message in (
            {"role": "assistant", "content": '<tool_call>\n{"name":"get_weather",'
             f'"arguments":{{"city":"City {n}"}}}}\n</tool_call>'},
            {"role": "user", "content": f"<tool_response>\nsunny {n}\n</tool_response>"})]


def test_thinking_only_assistant_turn_keeps_its_place(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="llamacpp")
    refused: list[dict[str, Any]] = []
    upstream.responder = strict_template(lambda body: completion({"content": "ok"}), refused)
    body = ask(messages=[
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "pondering",
                                           "signature": ""}]},
        {"role": "user", "content": "b"}], thinking={"type": "enabled", "budget_tokens": 1024})
    assert sdk(proxy).messages.create(**body).content[0].text == "ok"  # type: ignore[union-attr]
    assert refused == []
    sent = upstream.requests[0]
    assert sent["messages"] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "reasoning_content": "pondering"},
        {"role": "user", "content": "b"}]
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}


# ---------------------------------------------------------------- a tool call cut by length


def test_recorded_tool_calls_cut_by_length_are_max_tokens_streamed(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(http_recording("hermes-toolcalls-stream"))
    message = streamed(proxy, ask(tools=[TOOL]))
    assert [block["type"] for block in message["content"]] == [
        "text", "tool_use", "tool_use", "tool_use"]
    assert message["content"][3]["name"] == "get_weather"
    assert message["stop_reason"] == "max_tokens" and message["stop_sequence"] is None
    assert message["usage"]["output_tokens"] == 128


def test_tool_call_cut_by_length_is_max_tokens_not_streamed(
        proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Par'}}]}, "length"))
    message = sdk(proxy).messages.create(**ask(tools=[TOOL]))
    assert message.stop_reason == "max_tokens"
    assert [(b.type, b.name) for b in message.content] == [  # type: ignore[union-attr]
        ("tool_use", "get_weather")]


# ---------------------------------------------------------------- the llamacpp profile


def test_llamacpp_profile_is_recognised_from_the_server_header(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = proxy_factory(provider=None)
    assert proxy.settings.provider_name == "generic"  # a loopback URL says nothing
    thought = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "earlier thought", "signature": ""},
        {"type": "text", "text": "earlier answer"}]}
    history = ask(messages=[{"role": "user", "content": "q"}, thought,
                            {"role": "user", "content": "next"}])
    upstream.queue(http_recording("stop_seq"), completion({"content": "ok"}))
    with caplog.at_level(logging.INFO, logger="claude_proxy.service"):
        sdk(proxy).messages.create(**history)
        sdk(proxy).messages.create(**history)
    first, second = upstream.requests
    assert "reasoning_content" not in first["messages"][1]  # the generic profile: none
    assert "chat_template_kwargs" not in first
    assert second["messages"][1] == {"role": "assistant", "content": "earlier answer",
                                     "reasoning_content": "earlier thought"}
    assert second["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}
    assert [r.getMessage() for r in caplog.records if "llama.cpp" in r.getMessage()] == [
        "provider generic is llama.cpp (its Server header): using the llamacpp profile"]


# ---------------------------------------------------------------- doctor

PROPS = {"default_generation_settings": {"n_ctx": 131072}, "build_info": "b0-unknown",
         "chat_template": "{{ messages }}", "total_slots": 1}


def llama_server(jinja: bool, renders_tools: bool) -> Callable[[dict[str, Any]], Reply]:
    """llama-server as doctor meets it: without Jinja any request with tools gets the
    recorded 500; a template that drops tools costs the same prompt tokens with one."""
    def respond(body: dict[str, Any]) -> Reply:
        if body.get("tools") and not jinja:
            return http_recording("nojinja-tools")
        if body.get("stream"):
            return text_stream(["ok"])
        tokens = 30 + (82 if body.get("tools") and renders_tools else 0)
        return completion({"content": "ok"}, usage={
            "prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1})
    return respond


def run_doctor(tmp_path: Path, upstream: ScriptedUpstream,
               **env: str) -> subprocess.CompletedProcess[str]:
    variables = clean_env(tmp_path, OPENAI_API_KEY="k", OPENAI_BASE_URL=upstream.base_url,
                          BIG_MODEL="gemma", MIDDLE_MODEL="gemma", SMALL_MODEL="gemma", **env)
    return subprocess.run([sys.executable, "-m", "claude_proxy", "doctor"], env=variables,
                          capture_output=True, text=True, timeout=60)


def test_doctor_says_start_llama_server_with_jinja(
        tmp_path: Path, upstream: ScriptedUpstream) -> None:
    upstream.props = {**PROPS, "default_generation_settings": {"n_ctx": 4096}}
    upstream.responder = llama_server(jinja=False, renders_tools=False)
    result = run_doctor(tmp_path, upstream)  # PROVIDER unset: recognised from /props
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].endswith("(profile llamacpp, llama-server b0-unknown)")
    assert ("    jinja          FAIL  start llama-server with --jinja (tools are rendered by "
            "the chat template only then)") in lines
    assert ("    context        FAIL  n_ctx 4096: Claude Code's first request alone is about "
            "20000 tokens; start llama-server with -c 65536 (or more)") in lines


@pytest.mark.parametrize(("renders", "line"), [
    (False, "    template       FAIL  the chat template drops tools (30 prompt tokens with and "
            "without one): give llama-server a template that renders them "
            "(--chat-template-file)"),
    (True, "    template       ok    renders tools (30 → 112 prompt tokens with one tool)"),
])
def test_doctor_measures_whether_the_template_renders_tools(
        tmp_path: Path, upstream: ScriptedUpstream, renders: bool, line: str) -> None:
    upstream.props = PROPS
    upstream.responder = llama_server(jinja=True, renders_tools=renders)
    result = run_doctor(tmp_path, upstream, PROVIDER="llamacpp")
    lines = result.stdout.splitlines()
    assert line in lines, result.stdout
    assert "    context        ok    n_ctx 131072" in lines
    assert result.returncode == (0 if renders else 1)


def test_llamacpp_profile_discovers_its_window_from_props(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    upstream.props = {**PROPS, "default_generation_settings": {"n_ctx": 8192}}
    proxy = proxy_factory(provider="llamacpp", big_model="gguf", middle_model="gguf",
                          small_model="gguf")
    detail = httpx.get(f"{proxy.url}/health?detail=1", timeout=30).json()
    assert detail["providers"]["llamacpp"]["models"] == {"gguf": {
        "context_window": 8192, "max_output_tokens": None,
        "source": "discovered: llama.cpp /props n_ctx"}}
