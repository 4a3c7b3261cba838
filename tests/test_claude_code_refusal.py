"""A refusal as real Claude Code (the pin) sees it: an upstream's `content_filter` reaches it as
`stop_reason: "refusal"` with `stop_details`, and Claude Code 2.1.332 says so and continues
once, on the same model, telling the model its answer was stopped (observed; it does not
switch to the opus id for this)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, text_stream
from tests.test_claude_code import pytestmark as claude_code_marks
from tests.test_claude_code import run_claude

pytestmark = claude_code_marks


def test_claude_code_continues_after_a_refusal(tmp_path: Path, proxy: ProxyServer,
                                               upstream: ScriptedUpstream) -> None:
    def reply(body: dict[str, Any]) -> Reply:
        if len(upstream.requests) == 1:
            return text_stream(["I can"], finish="content_filter")
        return text_stream(["answered by ", body["model"]])
    upstream.responder = reply
    lines = run_claude(tmp_path, proxy, "Say hello.")
    notices = [line["content"] for line in lines if line.get("subtype") == "informational"]
    assert notices == ["Sonnet 4.6's safeguards stopped the response above · continuing once "
                       "with that noted"]
    told = upstream.requests[1]["messages"][-1]["content"]
    assert "Your response above was stopped by a safety classifier" in str(told)
    assert [body["model"] for body in upstream.requests] == ["middle-upstream"] * 2
    assert lines[-1]["subtype"] == "success"
    assert lines[-1]["result"] == "answered by middle-upstream"
