"""Real Claude Code (pinned, plain ANTHROPIC_BASE_URL) in a session that outgrows a 64k-token
window: the proxy refuses the over-long request before sending it (`prompt is too long`),
Claude Code compacts the conversation and goes on, and no request over the window ever reaches
the upstream."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.count_tokens import upstream_tokens

from tests.conftest import ProxyServer, SuiteRecord
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, error_reply, text_stream
from tests.test_claude_code import pytestmark as claude_code_marks
from tests.test_claude_code import run_claude

pytestmark = claude_code_marks
WINDOW = 65_536
FINAL = "finished after compacting"
COMMAND = "seq 100000 103999"
"""28,000 characters of output: about 10k tokens a turn for this upstream's tokenizer."""


class WindowedUpstream:
    """Answers like a model with a 64k window: Bash calls until Claude Code compacts, a
    summary for the compaction request, then the final answer. It reports its own token count
    and refuses (and remembers) any request over the window, as a real one would."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.too_long: list[int] = []
        self.compactions = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        size = upstream_tokens(body)
        self.sizes.append(size)
        usage = {"prompt_tokens": size, "completion_tokens": 5, "total_tokens": size + 5}
        if size > WINDOW:
            self.too_long.append(size)
            return error_reply(400, f"This model's maximum context length is {WINDOW} tokens. "
                                    f"However, you requested {size} tokens.")
        text = json.dumps(body["messages"][-3:])
        if "detailed summary" in text:
            self.compactions += 1
            return text_stream(["<summary>The user asked for numbers; several `seq` runs "
                                "printed them. Nothing is left to do.</summary>"], usage=usage)
        if "continued from a previous conversation" in json.dumps(body["messages"]):
            return text_stream([FINAL], usage=usage)
        if not body.get("tools"):
            return text_stream(["ok"], usage=usage)
        step = sum(1 for message in body["messages"] if message["role"] == "tool") + 1
        arguments = json.dumps({"command": COMMAND, "description": f"Print numbers {step}"})
        return Reply(events=[
            chunk({"role": "assistant", "content": f"Printing batch {step}."}),
            chunk({"tool_calls": [{"index": 0, "id": f"call_seq_{step}", "type": "function",
                                   "function": {"name": "Bash", "arguments": arguments}}]}),
            chunk({}, "tool_calls"), chunk(None, None, usage)])


def test_a_session_past_the_window_is_refused_before_sending_and_compacts(
        tmp_path: Path, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(context_window=WINDOW)
    model = WindowedUpstream()
    upstream.responder = model
    answered = len(SuiteRecord.responses)
    lines = run_claude(tmp_path, proxy, "Print numbers with seq again and again until told "
                       "to stop.", "--allowedTools", "Bash(seq:*)")
    assert lines[-1]["is_error"] is False, lines[-1]
    assert lines[-1]["result"] == FINAL
    refusals = [body for body in SuiteRecord.responses[answered:]
                if b"prompt is too long: " in body]
    assert refusals and all(f"> {WINDOW} maximum".encode() in body for body in refusals)
    assert model.too_long == [], model.sizes  # none over the window reached the upstream
    assert model.compactions >= 1
    assert max(model.sizes) <= WINDOW


class OverflowingMidStream:
    """Answers the first turn; overflows the second turn after its first text (OpenAI's
    `context_length_exceeded` as a stream chunk) once; answers a compaction request with a
    summary, and the rest with FINAL."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.overflowed = 0
        self.compactions = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.bodies.append(body)
        everything, last = json.dumps(body["messages"]), json.dumps(body["messages"][-3:])
        if "detailed summary" in last:
            self.compactions += 1
            return text_stream(["<summary>The user said hello, then asked again.</summary>"])
        if "say it again" not in everything:
            return text_stream(["hello back"])
        if not self.overflowed:
            self.overflowed += 1
            return Reply(events=[chunk({"role": "assistant", "content": "Let me th"}), {
                "error": {"message": f"This model's maximum context length is {WINDOW} tokens. "
                          f"However, your messages resulted in {WINDOW + 904} tokens. Please "
                          "reduce the length of the messages.", "type": "invalid_request_error",
                          "param": "messages", "code": "context_length_exceeded"}}], done=False)
        return text_stream([FINAL])


def test_an_overflow_event_mid_stream_makes_claude_code_compact(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """The `error` event in Anthropic's overflow wording, after the first text: Claude Code
    (its own retries on) does not retry the request unchanged; it compacts and goes on."""
    model = OverflowingMidStream()
    upstream.responder = model
    run_claude(tmp_path, proxy, "hello there", retries=True, persist=True)
    answered = len(SuiteRecord.responses)
    lines = run_claude(tmp_path, proxy, "say it again", "-c", retries=True, persist=True)
    assert lines[-1]["is_error"] is False, lines[-1]
    assert lines[-1]["result"] == FINAL
    events = [body for body in SuiteRecord.responses[answered:]
              if b"prompt is too long: " in body]
    assert events == [b'event: content_block_stop\ndata: {"type":"content_block_stop",'
                      b'"index":0}\n\nevent: error\ndata: {"type":"error","error":{"type":'
                      b'"invalid_request_error","message":"prompt is too long: 66440 tokens > '
                      b'65536 maximum"}}\n\n']
    assert model.overflowed == 1 and model.compactions == 1  # compacted, not retried as is
    assert "continued from a previous conversation" in json.dumps(model.bodies[-1]["messages"])
