"""End to end with the real Claude Code CLI (the Makefile's pin, installed by `make test`;
`$CLAUDE_BIN` for another, as `make test-claude-latest` does) pointed at the
proxy, which talks to the scripted upstream.

Claude Code runs with an isolated HOME and TMPDIR in an empty working folder, with
`-p … --output-format stream-json --verbose`; its stdout lines are what a user sees.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench.conversation import file_text

from claude_proxy.conversion.signatures import ThinkingSigner
from tests.claude_code_pin import default_claude_bin, environment
from tests.conftest import ProxyServer, SuiteRecord
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    chunk,
    completion,
    error_reply,
    responses_stream,
    text_stream,
)
from tests.search_backend import HITS, SearchBackendServer

ROOT = Path(__file__).resolve().parents[1]
CLAUDE_BIN = default_claude_bin()

pytestmark = [
    pytest.mark.claude_code,
    pytest.mark.skipif(not os.access(CLAUDE_BIN, os.X_OK) and not os.environ.get("CI"),
                       reason="Claude Code not installed (make test installs it)"),
]

SECRET = "claude-code-e2e-secret"
SIGNER = ThinkingSigner(SECRET)
TOOL_OUTPUT = "hi-from-tool"


def run_claude(tmp_path: Path, proxy: ProxyServer, prompt: str, *args: str,
               model: str | None = "claude-sonnet-4-6", binary: Path | None = None,
               retries: bool = False, persist: bool = False) -> list[dict[str, Any]]:
    """One `claude -p` run; returns its stream-json lines (the last one is the result).
    `binary` another Claude Code; `retries` leaves Claude Code's own retries on; `persist`
    keeps the session (in tmp_path's HOME) for a later `-c`."""
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for folder in (home, work, tmp):
        folder.mkdir(exist_ok=True)
    env = environment(proxy.url, home, tmp)
    if retries:
        del env["CLAUDE_CODE_MAX_RETRIES"]
    if model:
        env["ANTHROPIC_MODEL"] = model
    command = [str(binary or CLAUDE_BIN), "-p", prompt, "--output-format", "stream-json",
               "--verbose", *([] if persist else ["--no-session-persistence"]), *args]
    result = subprocess.run(command, env=env, cwd=work, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines and lines[-1]["type"] == "result", (result.stdout, result.stderr)
    return lines


def blocks(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [block for line in lines if line["type"] == "assistant"
            for block in line["message"]["content"] if block["type"] == kind]


def test_plain_prompt_shows_the_upstream_text(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    answer = "pong from the upstream — ünïcode ✓"
    upstream.queue(text_stream(["pong from ", "the upstream — ", "ünïcode ✓"], usage={
        "prompt_tokens": 9000, "completion_tokens": 12, "total_tokens": 9012}))
    lines = run_claude(tmp_path, proxy, "say pong")
    assert [b["text"] for b in blocks(lines, "text")] == [answer]
    result = lines[-1]
    assert result["is_error"] is False and result["result"] == answer
    assert result["usage"]["output_tokens"] == 12
    assert len(upstream.requests) == 1
    sent = upstream.requests[0]
    assert sent["model"] == "middle-upstream" and sent["stream"] is True
    assert sent["messages"][-1]["role"] in ("user", "system")
    assert "x-anthropic-billing-header" not in json.dumps(sent)


def test_default_model_request_with_inline_system_message(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """Without ANTHROPIC_MODEL, Claude Code 2.1.328 uses claude-opus-5-5: adaptive thinking,
    output_config and a role:"system" message inside `messages`."""
    upstream.queue(text_stream(["opus says hi"]))
    lines = run_claude(tmp_path, proxy, "hello", model=None)
    assert lines[-1]["result"] == "opus says hi" and lines[-1]["is_error"] is False
    sent = upstream.requests[0]
    assert sent["model"] == "big-upstream"
    assert "system" in [m["role"] for m in sent["messages"][1:]]


def bash_loop_responder(reasoning: bool) -> Callable[[dict[str, Any]], Reply]:
    """First request: (reasoning, then) a Bash call; second: an answer quoting the result.
    With reasoning, it refuses a tool-call turn that lacks reasoning_content (as DeepSeek)."""
    def respond(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] != "tool":
            events: list[str | dict[str, Any]] = []
            if reasoning:
                events += [chunk({"role": "assistant", "reasoning_content": "I need to run "}),
                           chunk({"reasoning_content": "echo first."})]
            events += [
                chunk({"tool_calls": [{"index": 0, "id": "call_cc_1", "type": "function",
                                       "function": {"name": "Bash", "arguments": ""}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {
                    "arguments": '{"command": "echo hi-from-tool", '}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {
                    "arguments": '"description": "Print a greeting"}'}}]}),
                chunk({}, "tool_calls")]
            return Reply(events=events)
        assistant = body["messages"][-2]
        if reasoning and assistant.get("reasoning_content") != "I need to run echo first.":
            return error_reply(400, "The reasoning_content in the thinking mode must be "
                                    "passed back to the API.")
        first_line = last["content"].splitlines()[0]
        return text_stream(["The command printed: ", first_line])
    return respond


def test_bash_tool_loop(tmp_path: Path, proxy: ProxyServer,
                        upstream: ScriptedUpstream) -> None:
    upstream.responder = bash_loop_responder(reasoning=False)
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    tool_uses = blocks(lines, "tool_use")
    assert [(t["id"], t["name"], t["input"]) for t in tool_uses] == [
        ("call_cc_1", "Bash", {"command": "echo hi-from-tool", "description": "Print a greeting"})]
    results = [block for line in lines if line["type"] == "user"
               for block in line["message"]["content"] if block.get("type") == "tool_result"]
    assert results[0]["content"] == TOOL_OUTPUT and results[0]["is_error"] is False
    second = upstream.requests[1]
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_cc_1"
    assert tool_message["content"].startswith(TOOL_OUTPUT)
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "Bash"
    assert lines[-1]["result"] == f"The command printed: {TOOL_OUTPUT}"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2


SOURCE = "def f():\n    return 1  # café\n\nprint(f())\n"
NUMBERED = re.compile(r"(\d+)\t(.*)")


def test_read_tool_loop_sends_numbered_lines_as_the_bench_grows_them(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """A Read call's result as Claude Code sends it upstream: each line of the file after
    its number and a tab (no padding, no arrow). bench/conversation.py grows its long
    conversations out of results in this shape, so that it costs what a real one costs."""
    target = tmp_path / "work" / "sample.py"
    target.parent.mkdir(parents=True)
    target.write_text(SOURCE)

    def respond(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] != "tool":
            arguments = json.dumps({"file_path": str(target)})
            return Reply(events=[chunk({"tool_calls": [{
                "index": 0, "id": "call_read_1", "type": "function",
                "function": {"name": "Read", "arguments": arguments}}]}),
                chunk({}, "tool_calls")])
        return text_stream(["Read it."])

    upstream.responder = respond
    lines = run_claude(tmp_path, proxy, "read sample.py", "--allowedTools", "Read")
    sent = upstream.requests[1]["messages"][-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "call_read_1"
    assert sent["content"].startswith(
        "1\tdef f():\n2\t    return 1  # café\n3\t\n4\tprint(f())\n")
    assert lines[-1]["result"] == "Read it."
    grown_lines = file_text(7).splitlines()
    assert all(NUMBERED.fullmatch(line) for line in grown_lines)
    assert [NUMBERED.fullmatch(line)[1] for line in grown_lines[:3]] == ["1", "2", "3"]


def test_reasoning_shows_as_thinking_and_tool_loop_passes_it_back(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    upstream.responder = bash_loop_responder(reasoning=True)
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    thinking = blocks(lines, "thinking")
    assert [t["thinking"] for t in thinking] == ["I need to run echo first."]
    assert SIGNER.verify(thinking[0]["thinking"], thinking[0]["signature"])
    first = upstream.requests[0]
    assert first["thinking"] == {"type": "enabled"}  # adaptive thinking from Claude Code
    assert upstream.requests[1]["messages"][-2]["reasoning_content"] == (
        "I need to run echo first.")
    assert lines[-1]["result"] == f"The command printed: {TOOL_OUTPUT}"
    assert lines[-1]["is_error"] is False


def test_thinking_block_streams_with_exact_text(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="glm", middle_model="glm-4.7-flash",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    reasoning = ["  Leading spaces stay.\n", "Line two, ", "ünïcode ✓ ", "\n\n"]
    upstream.queue(Reply(events=[
        chunk({"role": "assistant", "reasoning_content": piece}) for piece in reasoning] + [
        chunk({"content": "Final answer."}), chunk({}, "stop")]))
    lines = run_claude(tmp_path, proxy, "think about it")
    thinking = blocks(lines, "thinking")
    assert [t["thinking"] for t in thinking] == ["".join(reasoning)]
    assert [b["text"] for b in blocks(lines, "text")] == ["Final answer."]
    assert lines[-1]["result"] == "Final answer."


# ---------------------------------------------------------------- WebSearch

WEB_QUERY = "latest rust release notes"
WEB_SUMMARY = "Rust 1.91.0 is the latest release ([Announcing Rust 1.91.0]({url}))."


def web_search_responder(seen: list[str]) -> Callable[[dict[str, Any]], Reply]:
    """The main loop loads WebSearch (ToolSearch `select:WebSearch`), calls it, then answers
    from the tool result; the proxy's summary call (a `web_search` function with its results)
    gets a short summary."""
    def respond(body: dict[str, Any]) -> Reply:
        content = last_tool_output(body["messages"])
        names = {tool["function"]["name"] for tool in body.get("tools") or []}
        if content.startswith('Web search results for "'):
            seen.append("summary")
            url = content.split("URL: ", 1)[1].split("\n", 1)[0]
            return completion({"content": WEB_SUMMARY.format(url=url)})
        if content.startswith("Web search results for query:") or "Web search error" in content:
            seen.append("answer")
            return text_stream(["Done searching."])
        if content and "WebSearch" in names:
            seen.append("call WebSearch")
            return tool_call_stream("call_ws_1", "WebSearch", {"query": WEB_QUERY})
        seen.append("call ToolSearch")
        return tool_call_stream("call_ts_1", "ToolSearch",
                                {"query": "select:WebSearch", "max_results": 1})
    return respond


def last_tool_output(messages: list[dict[str, Any]]) -> str:
    """The tool message of the latest turn (Claude Code adds a user message after it)."""
    for message in reversed(messages):
        if message["role"] == "assistant":
            return ""
        if message["role"] == "tool":
            return str(message["content"])
    return ""


def tool_call_stream(call_id: str, name: str, arguments: dict[str, Any]) -> Reply:
    return Reply(events=[
        chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": call_id,
                                                    "type": "function", "function": {
                                                        "name": name, "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(arguments)}}]}),
        chunk({}, "tool_calls")])


def web_search_result(lines: list[dict[str, Any]]) -> Any:
    """Claude Code's `tool_use_result` for the WebSearch call, and its tool_result text."""
    tool_ids = [b["id"] for b in blocks(lines, "tool_use") if b["name"] == "WebSearch"]
    assert len(tool_ids) == 1, blocks(lines, "tool_use")
    for line in lines:
        if line["type"] != "user":
            continue
        for block in line["message"]["content"]:
            if block.get("type") == "tool_result" and block["tool_use_id"] == tool_ids[0]:
                return line.get("tool_use_result"), block["content"]
    raise AssertionError("no WebSearch tool_result")


def test_web_search_runs_through_the_backend(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream, search_backend: SearchBackendServer) -> None:
    proxy = proxy_factory(web_search_backend="searxng", web_search_url=search_backend.url)
    seen: list[str] = []
    upstream.responder = web_search_responder(seen)
    lines = run_claude(tmp_path, proxy, "What are the release notes of the latest Rust?",
                       "--allowedTools", "WebSearch")
    assert [s.query for s in search_backend.requests] == [WEB_QUERY]
    structured, text = web_search_result(lines)
    results = [r for r in structured["results"] if not isinstance(r, str)]
    assert len(results) == 1  # what Claude Code counts as "Did 1 search"
    assert [(c["url"], c["title"]) for c in results[0]["content"]] == [
        (hit.url, hit.title) for hit in HITS]
    summary = WEB_SUMMARY.format(url=HITS[0].url)
    assert summary in [r for r in structured["results"] if isinstance(r, str)]
    final = last_tool_output(upstream.requests[-1]["messages"])
    assert final.startswith(text)
    assert final.startswith(f'Web search results for query: "{WEB_QUERY}"')
    links = json.dumps([{"title": hit.title, "url": hit.url} for hit in HITS],
                       ensure_ascii=False, separators=(",", ":"))
    assert final.startswith(f'Web search results for query: "{WEB_QUERY}"\n\n'
                            f"Links: {links}\n\n{summary}\n\n\nREMINDER: ")
    assert seen == ["call ToolSearch", "call WebSearch", "summary", "answer"]
    assert lines[-1]["result"] == "Done searching." and lines[-1]["is_error"] is False


def test_web_search_without_a_backend_says_unavailable(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    seen: list[str] = []
    upstream.responder = web_search_responder(seen)
    lines = run_claude(tmp_path, proxy, "What are the release notes of the latest Rust?",
                       "--allowedTools", "WebSearch")
    structured, text = web_search_result(lines)
    assert structured["results"] == ["Web search error: unavailable"]
    assert text.startswith(f'Web search results for query: "{WEB_QUERY}"')
    assert "Web search error: unavailable" in text
    final = last_tool_output(upstream.requests[-1]["messages"])
    assert final.startswith(text)
    # The side query never reached the upstream: no answer from memory.
    assert seen == ["call ToolSearch", "call WebSearch", "answer"]
    assert lines[-1]["result"] == "Done searching."


GLM_NATIVE_ANSWER = {
    "id": "glm-1", "created": 1, "model": "glm-4.6",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "GLM searched: Rust 1.91.0 is out [ref_1]."}}],
    "web_search": [{"refer": "ref_1", "title": HITS[0].title, "link": HITS[0].url,
                    "content": HITS[0].snippet, "publish_date": "2026-10-30"},
                   {"refer": "ref_2", "title": HITS[1].title, "link": HITS[1].url,
                    "content": HITS[1].snippet, "publish_date": ""}]}


def test_web_search_native_on_glm(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream, search_backend: SearchBackendServer) -> None:
    """WEB_SEARCH=native on GLM: the side query goes upstream once with GLM's web_search
    tool; its sources are what Claude Code lists; the backend is not asked."""
    proxy = proxy_factory(provider="glm", web_search="native",
                          web_search_backend="searxng", web_search_url=search_backend.url)
    seen: list[str] = []
    main_loop = web_search_responder(seen)

    def respond(body: dict[str, Any]) -> Reply:
        if any(tool.get("type") == "web_search" for tool in body.get("tools") or []):
            seen.append("native")
            return Reply(body=GLM_NATIVE_ANSWER)
        return main_loop(body)

    upstream.responder = respond
    lines = run_claude(tmp_path, proxy, "What are the release notes of the latest Rust?",
                       "--allowedTools", "WebSearch")
    structured, text = web_search_result(lines)
    results = [r for r in structured["results"] if not isinstance(r, str)]
    assert [(c["url"], c["title"]) for c in results[0]["content"]] == [
        (hit.url, hit.title) for hit in HITS[:2]]
    assert "GLM searched: Rust 1.91.0 is out [ref_1]." in text
    assert seen == ["call ToolSearch", "call WebSearch", "native", "answer"]
    assert search_backend.requests == []
    native = next(r for r in upstream.requests if r.get("tools") and any(
        t.get("type") == "web_search" for t in r["tools"]))
    assert native["tools"][0]["web_search"]["search_query"] == WEB_QUERY
    assert "stream" not in native


ENCRYPTED = "gAAAAABscripted-encrypted-reasoning_0123456789-abcdefghijklmnopqrstuvwxyz=="
SUMMARY = ["**Running the echo**\n\nI need to run ", "echo first."]


def responses_bash_responder(body: dict[str, Any]) -> Reply:
    """A /responses upstream with `store: false`: first a reasoning item (summary and
    encrypted content) and a Bash call; then an answer, but only if the reasoning item came
    back before its call (else the error OpenAI gives)."""
    outputs = [item for item in body["input"] if item.get("type") == "function_call_output"]
    if not outputs:
        arguments = '{"command": "echo hi-from-tool", "description": "Print a greeting"}'
        return responses_stream(
            {"type": "response.created", "response": {"status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": {
                "type": "reasoning", "id": "rs_cc_1", "encrypted_content": "gAAAApartial",
                "summary": []}},
            {"type": "response.reasoning_summary_part.added", "item_id": "rs_cc_1",
             "summary_index": 0},
            *({"type": "response.reasoning_summary_text.delta", "item_id": "rs_cc_1",
               "summary_index": 0, "delta": piece} for piece in SUMMARY),
            {"type": "response.output_item.done", "output_index": 0, "item": {
                "type": "reasoning", "id": "rs_cc_1", "encrypted_content": ENCRYPTED,
                "summary": [{"type": "summary_text", "text": "".join(SUMMARY)}]}},
            {"type": "response.output_item.added", "output_index": 1, "item": {
                "type": "function_call", "id": "fc_cc_1", "call_id": "call_cc_1",
                "name": "Bash", "arguments": ""}},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_cc_1",
             "delta": arguments[:20]},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_cc_1",
             "delta": arguments[20:]},
            {"type": "response.output_item.done", "output_index": 1, "item": {
                "type": "function_call", "id": "fc_cc_1", "call_id": "call_cc_1",
                "name": "Bash", "arguments": arguments}},
            {"type": "response.completed", "response": {"usage": {
                "input_tokens": 900, "output_tokens": 40,
                "output_tokens_details": {"reasoning_tokens": 30}}}})
    kinds = [(item.get("type"), item.get("id")) for item in body["input"]]
    reasoning = next((item for item in body["input"] if item.get("type") == "reasoning"), None)
    if (reasoning is None or reasoning["encrypted_content"] != ENCRYPTED
            or kinds[kinds.index(("reasoning", "rs_cc_1")) + 1] != ("function_call", "fc_cc_1")):
        return error_reply(400, "Item 'fc_cc_1' of type 'function_call' was provided without "
                                "its required 'reasoning' item: 'rs_cc_1'.")
    text = "The command printed: " + outputs[-1]["output"].splitlines()[0]
    return responses_stream(
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.output_item.added", "item": {"type": "message", "id": "msg_cc"}},
        {"type": "response.output_text.delta", "item_id": "msg_cc", "delta": text},
        {"type": "response.completed", "response": {"usage": {"input_tokens": 950,
                                                              "output_tokens": 8}}})


def test_responses_api_thinking_and_encrypted_reasoning_round_trip(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(provider="openai", middle_model="gpt-5-mini",
                          thinking_signature_secret=SECRET)
    upstream.responder = responses_bash_responder
    lines = run_claude(tmp_path, proxy, "run the echo", "--allowedTools", "Bash(echo:*)")
    thinking = blocks(lines, "thinking")
    assert [t["thinking"] for t in thinking] == ["".join(SUMMARY)]
    envelope = SIGNER.verify(thinking[0]["thinking"], thinking[0]["signature"])
    assert envelope is not None and envelope.opaque[0]["encrypted_content"] == ENCRYPTED
    assert upstream.paths == ["/v1/responses", "/v1/responses"]
    first, second = upstream.requests
    assert first["reasoning"]["summary"] == "auto" and first["store"] is False
    assert first["prompt_cache_key"] == second["prompt_cache_key"]  # one session, one key
    assert first["prompt_cache_key"].startswith("cc-")
    assert [item for item in second["input"] if item.get("type") == "reasoning"] == [
        {"type": "reasoning", "id": "rs_cc_1", "encrypted_content": ENCRYPTED, "summary": []}]
    assert lines[-1]["result"] == f"The command printed: {TOOL_OUTPUT}"
    assert lines[-1]["is_error"] is False and lines[-1]["num_turns"] == 2


def test_a_sessions_next_request_reuses_the_messages_claude_code_sent_before(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    """Claude Code's JSON is written as orjson writes it, message for message (thinking
    and its signature, tool calls, results with text beyond ASCII), so each request of a
    tool loop reuses, as parsed, every message of the one before but the last, whose cache
    marker moved (server/incremental.py)."""
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET)
    target = tmp_path / "work" / "sample.py"
    target.parent.mkdir(parents=True)
    target.write_text(SOURCE + "# → ✓ 日本語 \"quoted\" \\ back\\slash\t\x01\n")

    def respond(body: dict[str, Any]) -> Reply:
        calls = sum(message["role"] == "tool" for message in body["messages"])
        if calls == 2:
            return text_stream(["Read it twice."])
        return Reply(events=[
            chunk({"role": "assistant", "reasoning_content": f"Read it — {calls}."}),
            chunk({"tool_calls": [{"index": 0, "id": f"call_read_{calls}", "type": "function",
                                   "function": {"name": "Read", "arguments": json.dumps(
                                       {"file_path": str(target)})}}]}),
            chunk({}, "tool_calls")])

    upstream.responder = respond
    lines = run_claude(tmp_path, proxy, "read sample.py twice", "--allowedTools", "Read")
    assert lines[-1]["result"] == "Read it twice."
    (key, kept), = proxy.app.state.wiring.bodies.items()
    # The first request's one message changed on the second (its marker moved), so the
    # second shared nothing and joined it; the third took the second's place.
    remembered, first = kept.bodies
    assert (len(first.messages), first.shared) == (1, 0)
    assert len(remembered.messages) == 5 and remembered.shared == 2
    assert len(remembered.ends) == len(remembered.messages)
    assert remembered.running is not None and "tool_result" in remembered.running[-1]
    sent = upstream.requests[2]["messages"]
    assert [message.get("reasoning_content") for message in sent
            if message["role"] == "assistant"] == ["Read it — 0.", "Read it — 1."]
    assert "日本語" in sent[-1]["content"]
    # The third was converted only where it changed (conversion/reuse.py): the second's
    # converted messages of the two it shared, reused, written as a whole conversion writes
    # them (a proxy without the memo sends the very bytes).
    converted = remembered.turns.last
    assert converted is not None and converted.sources[:2] == remembered.messages[:2]
    assert converted.written is not None and bytes(converted.written.json) == upstream.raw[2]
    whole = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True, thinking_signature_secret=SECRET,
                          session_memo_bytes=0)
    session = key.split("\n", 1)[1]
    headers = [headers for path, headers in SuiteRecord.requests if path == "/v1/messages"
               and headers.get("x-claude-code-session-id") == session][-1]  # the third's
    answer = httpx.post(f"{whole.url}/v1/messages", content=remembered.raw, timeout=30,
                        headers={name: value for name, value in headers.items()
                                 if name not in ("host", "content-length")})
    assert answer.status_code == 200, answer.text
    assert upstream.raw[3] == upstream.raw[2]
