"""The tool-call guard's figures on the dashboard, in headless chromium (the machinery of
tests/test_dashboard_browser.py): per model, the share of calls repaired and passed on
invalid, and in the inspector what the upstream sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk
from tests.test_dashboard_browser import Page, browser, pytestmark  # noqa: F401 (fixture, marks)
from tests.test_tool_guard import CC_TOOLS, frames_of

CALLS = [["{'command': 'ls'}"], ['{"command": "pwd"}'], ['{"command": "date"}'],
         ['{"command": "echo hi"}'], ['{"cmd": "ls"}']]
"""Five answers of one Bash call each: a Python literal (repaired), three valid, one with a
key Bash does not take (passed on invalid)."""


def test_tool_calls_by_model_and_the_inspector(proxy_factory: Callable[..., ProxyServer],
                                               upstream: ScriptedUpstream,
                                               browser: Any) -> None:  # noqa: F811
    proxy = proxy_factory()
    ids = []
    for pieces in CALLS:
        upstream.queue(Reply(events=[chunk({"tool_calls": frames_of([("call_1", "Bash",
                                                                       pieces)])}),
                                     chunk({}, "tool_calls")]))
        response = httpx.post(proxy.url + "/v1/messages", timeout=30, json={
            "model": "claude-sonnet-4-6", "max_tokens": 100, "stream": True,
            "tools": [CC_TOOLS["Bash"]], "messages": [{"role": "user", "content": "go"}]})
        assert response.status_code == 200
        ids.append(response.headers["request-id"])
    tab = Page(browser, f"{proxy.url}/ui")
    page = tab.page
    page.wait_for_selector("#tools-panel:not([hidden])")
    row = page.locator('#tools tr[data-model="middle-upstream"]')
    assert row.locator("td").all_inner_texts()[:4] == ["middle-upstream", "5", "20.0%", "20.0%"]
    tab.shot("tool-calls-by-model")
    page.click(f'#requests tr[data-id="{ids[0]}"]')
    page.wait_for_selector("#inspector .tool-call.guard")
    guard = page.inner_text("#inspector .tool-call.guard")
    assert "Bash · repaired" in guard and "R4:json_repair" in guard
    assert "{'command': 'ls'}" in guard and '{"command":"ls"}' in guard
    tab.shot("inspector-tool-guard")
    assert tab.errors == []
    tab.close()
