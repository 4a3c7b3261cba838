"""The census of a conversation's block types (conversion/census.py): taken once for the
client's messages, nested blocks included, and never reused for a list it was not taken of."""

from __future__ import annotations

from claude_proxy.conversion.census import Conversation, holds, kinds
from claude_proxy.conversion.tools import referenced_tool_names

REFERENCE = {"type": "tool_reference", "tool_name": "mcp__db__query"}


def test_nested_blocks_are_counted() -> None:
    messages = [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [REFERENCE]}]}]
    assert kinds(messages) == {"tool_result", "tool_reference"}
    assert referenced_tool_names(messages) == {"mcp__db__query"}


def test_a_conversation_keeps_its_census_and_a_new_list_gets_its_own() -> None:
    conversation = Conversation([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert not holds(conversation, "tool_reference")
    assert kinds(conversation) is conversation.census
    grown = [*conversation, {"role": "user", "content": [REFERENCE]}]
    assert holds(grown, "tool_reference")
    assert referenced_tool_names(grown) == {"mcp__db__query"}
    assert referenced_tool_names(conversation) == set()


def test_string_content_and_odd_blocks_hold_nothing() -> None:
    messages = [{"role": "user", "content": "plain"}, {"role": "user", "content": [
        "a string", {"type": {"not": "a string"}}, {"no": "type"}]}, "not a message"]
    assert kinds(messages) == frozenset()
