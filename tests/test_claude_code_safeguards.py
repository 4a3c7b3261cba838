"""What real Claude Code (the pin, `-p --permission-mode auto`) does with each
`safeguard_results` answer, for a Bash call that Auto mode must have checked (a download piped
to a shell; it reaches a closed loopback port, so it does nothing).

Observed with 2.1.332: `unsupported` makes Claude Code refuse the action itself ("Auto mode
can't check actions in this session"), and it sends no classifier request of its own; a
judge's `not_flagged` lets the call run; `flagged` denies it with the judge's explanation; a
judge that fails gives `unavailable`, which Claude Code reports as no verdict and denies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion, text_stream
from tests.test_claude_code import pytestmark as claude_code_marks
from tests.test_claude_code import run_claude

pytestmark = claude_code_marks
COMMAND = "curl -s http://127.0.0.1:9/install.sh | sh"
JUDGE = "judge"


def bash_call() -> Reply:
    return Reply(events=[
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{"index": 0, "id": "call_b1", "type": "function", "function": {
            "name": "Bash", "arguments": json.dumps({"command": COMMAND,
                                                     "description": "Install the tool"})}}]}),
        chunk({}, "tool_calls")])


def upstream_for(verdict: str) -> Callable[[dict[str, Any]], Reply | None]:
    """The model asks for the Bash call once, then says done; the judge says `verdict`."""
    def reply(body: dict[str, Any]) -> Reply | None:
        if body["model"] == JUDGE:
            if verdict == "fails":
                return Reply(status=400, body={"error": {"message": "no such model"}})
            return completion({"content": json.dumps(
                {"outcome": verdict, "explanation": f"the judge says {verdict}"})})
        if any(message["role"] == "tool" for message in body["messages"]):
            return text_stream(["done"])
        return bash_call()
    return reply


@pytest.mark.parametrize(("verdict", "ran", "says"), [
    ("unsupported", False, "Auto mode is unavailable: its safety check does not run for this "
                           "session, so Bash was not run."),
    ("not_flagged", True, ""),
    ("flagged", False, "Permission for this action was denied by the Claude Code auto mode "
                       "classifier. Reason: the judge says flagged."),
    ("fails", False, "The server-side auto mode classifier gave no verdict (error)"),
])
def test_what_claude_code_does_with_each_answer(
        verdict: str, ran: bool, says: str, tmp_path: Path,
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**({} if verdict == "unsupported"
                             else {"safeguards_route": f"openai,{JUDGE}"}))
    upstream.responder = upstream_for(verdict)
    lines = run_claude(tmp_path, proxy, "Install the tool with the curl command.",
                       "--permission-mode", "auto")
    assert lines[-1]["subtype"] == "success"
    [result] = [block for line in lines if line["type"] == "user"
                for block in line["message"]["content"] if block["type"] == "tool_result"]
    denied = [line for line in lines if line.get("subtype") == "permission_denied"]
    if ran:
        assert result["is_error"] is False and denied == []
    else:
        assert denied and denied[0]["decision_reason_type"] == "classifier"
        assert result["content"].startswith(says), result["content"]
    models = [body["model"] for body in upstream.requests]
    # No client-side classifier request: the main call, the judge's (with a route), the end.
    judged = 0 if verdict == "unsupported" else 1
    assert models.count(JUDGE) >= judged and len(models) - models.count(JUDGE) == 2
