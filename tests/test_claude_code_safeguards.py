"""What real Claude Code (the pin, `-p --permission-mode auto`) does with each
`safeguard_results` answer, for a Bash call that Auto mode must have checked (a download piped
to a shell; it reaches a closed loopback port, so it does nothing).

Observed with 2.1.332 (see docs/claude-code.md): `unsupported` makes Claude Code fall back to
its own classifier, whose requests (about 145 KB each, several per checked action) go through
the proxy to the upstream, with a notice that the session "isn't eligible"; with
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 or DISABLE_TELEMETRY=1 it refuses the action
instead. A judge's
`not_flagged` lets the call run and `flagged` denies it with the judge's explanation, neither
sending a classifier request; a judge that fails (`unavailable`) sends Claude Code to its own
classifier for that call (or, with nonessential traffic off, denies it as no verdict).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.claude_code_pin import environment
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion, text_stream
from tests.test_claude_code import CLAUDE_BIN
from tests.test_claude_code import pytestmark as claude_code_marks

pytestmark = claude_code_marks
COMMAND = "curl -s http://127.0.0.1:9/install.sh | sh"
JUDGE = "judge"
EXTRA_ENV: dict[str, str] = {"DISABLE_ERROR_REPORTING": "1"}
CLASSIFIER_MARK = "<transcript>"
"""What Claude Code's own classifier requests carry (the action under review)."""


def bash_call() -> Reply:
    return Reply(events=[
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{"index": 0, "id": "call_b1", "type": "function", "function": {
            "name": "Bash", "arguments": json.dumps({"command": COMMAND,
                                                     "description": "Install the tool"})}}]}),
        chunk({}, "tool_calls")])


def upstream_for(verdict: str) -> Callable[[dict[str, Any]], Reply | None]:
    """The model asks for the Bash call once, then says done; the judge says `verdict`;
    Claude Code's own classifier (if it asks) is told the action is fine."""
    def reply(body: dict[str, Any]) -> Reply | None:
        if body["model"] == JUDGE:
            if verdict == "fails":
                return Reply(status=400, body={"error": {"message": "no such model"}})
            return completion({"content": json.dumps(
                {"outcome": verdict, "explanation": f"the judge says {verdict}"})})
        if CLASSIFIER_MARK in json.dumps(body["messages"][-1]):
            return (text_stream(["<block>no</block>"]) if body.get("stream")
                    else completion({"content": "<block>no</block>"}))
        if any(message["role"] == "tool" for message in body["messages"]):
            return text_stream(["done"])
        return bash_call()
    return reply


def run(tmp_path: Path, proxy: ProxyServer, quiet: str | None) -> list[dict[str, Any]]:
    """`claude -p` in auto mode as a user has it, or with the variable `quiet` set to 1
    (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is the other tests' setting; the machine's lack
    of network stops Claude Code's other traffic)."""
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for folder in (home, work, tmp):
        folder.mkdir(exist_ok=True)
    env = environment(proxy.url, home, tmp)
    del env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
    if quiet is not None:
        env[quiet] = "1"
    env["ANTHROPIC_MODEL"] = "claude-sonnet-4-6"
    result = subprocess.run(
        [str(CLAUDE_BIN), "-p", "Install the tool with the curl command.", "--output-format",
         "stream-json", "--verbose", "--no-session-persistence", "--permission-mode", "auto"],
        env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert lines and lines[-1]["type"] == "result", (result.stdout, result.stderr)
    return lines


NOT_RUN = "Auto mode is unavailable: its safety check does not run for this session, so Bash "


@pytest.mark.parametrize(("verdict", "quiet", "ran", "says", "classifier"), [
    ("unsupported", None, True, "", True),
    ("unsupported", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", False, NOT_RUN, False),
    ("unsupported", "DISABLE_TELEMETRY", False, NOT_RUN, False),
    ("not_flagged", None, True, "", False),
    ("flagged", None, False, "Permission for this action was denied by the Claude Code auto "
                             "mode classifier. Reason: the judge says flagged.", False),
    ("fails", None, True, "", True),
    ("fails", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", False,
     "The server-side auto mode classifier gave no verdict (error)", False),
])
def test_what_claude_code_does_with_each_answer(
        verdict: str, quiet: str | None, ran: bool, says: str, classifier: bool, tmp_path: Path,
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(**({} if verdict == "unsupported"
                             else {"safeguards_route": f"openai,{JUDGE}"}))
    upstream.responder = upstream_for(verdict)
    lines = run(tmp_path, proxy, quiet)
    assert lines[-1]["subtype"] == "success"
    [result] = [block for line in lines if line["type"] == "user"
                for block in line["message"]["content"] if block["type"] == "tool_result"]
    denied = [line for line in lines if line.get("subtype") == "permission_denied"]
    if ran:
        assert result["is_error"] is False and denied == []
    else:
        assert denied and denied[0]["decision_reason_type"] == "classifier"
        assert result["content"].startswith(says), result["content"]
    own = [body for body in upstream.requests
           if CLASSIFIER_MARK in json.dumps(body["messages"][-1])]
    assert bool(own) is classifier
    notices = [line["content"] for line in lines if line.get("subtype") == "informational"]
    eligible = "this session isn't eligible" in " ".join(notices)
    assert eligible is (verdict == "unsupported" and quiet is None)
    if own:  # the fallback's cost: Claude Code's own classifier prompt, each time
        assert min(len(json.dumps(body)) for body in own) > 100_000
    assert (JUDGE in [body["model"] for body in upstream.requests]) is (verdict != "unsupported")
