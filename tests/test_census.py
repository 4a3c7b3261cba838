"""The census of a conversation's block types (conversion/census.py): taken once for the
client's messages, nested blocks included, and never reused for a list it was not taken of."""

from __future__ import annotations

from typing import Any

import pytest

from claude_proxy.conversion.census import Conversation, Remembered, checked, holds, kinds
from claude_proxy.conversion.shapes import Mismatch
from claude_proxy.conversion.tools import referenced_tool_names
from claude_proxy.errors import ProxyError
from claude_proxy.server.requests import ROLES, MessagesRequest, validate_request

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


def test_validation_takes_the_census_in_its_own_walk() -> None:
    messages = [{"role": "user", "content": "plain"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                  {"type": "tool_use", "id": "t1"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [REFERENCE]}]}]
    body = validate_request(MessagesRequest, {"model": "m", "max_tokens": 5,
                                              "messages": messages})
    conversation = body["messages"]
    assert isinstance(conversation, Conversation) and conversation == messages
    assert conversation.census == {"text", "tool_use", "tool_result", "tool_reference"}


def test_what_the_walk_does_not_vouch_for_is_left_to_the_validator() -> None:
    good = {"role": "user", "content": [{"type": "text", "text": "a"}]}
    for odd in ({"role": "tool", "content": "x"}, {"role": "user"},
                {"role": "user", "content": 5}, ["user", "x"]):
        assert checked([good, odd], ROLES) is None
    with pytest.raises(Mismatch) as not_a_block:  # the walk names a block's problems itself
        checked([good, {"role": "user", "content": [good["content"][0], "text"]}], ROLES)
    assert str(not_a_block.value) == "messages.1.content.1: Input should be a valid dictionary"
    checked_good = checked([good], ROLES)
    assert checked_good is not None and checked_good.census == {"text"}
    with pytest.raises(ProxyError) as refused:
        validate_request(MessagesRequest, {"model": "m", "max_tokens": 5,
                                           "messages": [good, {"role": "user", "content": 5}]})
    assert refused.value.message.startswith("messages.1.content.str: Input should be a valid")
    with pytest.raises(ProxyError) as empty:
        validate_request(MessagesRequest, {"model": "m", "max_tokens": 5, "messages": []})
    assert empty.value.message == (
        "messages: List should have at least 1 item after validation, not 0")


def _running(messages: list[Any]) -> list[frozenset[str]]:
    """Each beginning's census, taken from scratch."""
    return [kinds(list(messages[:count])) for count in range(1, len(messages) + 1)]


def test_a_sessions_remembered_messages_are_walked_from_the_first_not_known() -> None:
    """The messages an earlier request checked (the same objects) are not walked again:
    their running census is taken as known, and the walk goes on from there."""
    messages = [{"role": "user", "content": "plain"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [REFERENCE]}]},
                {"role": "user", "content": [{"type": "image", "source": {}}]}]
    first = checked(Remembered(messages[:3], []), ROLES)
    assert first is not None and first.running == _running(messages[:3])
    assert first.census == {"tool_use", "tool_result", "tool_reference"}
    again = checked(Remembered(messages, first.running[:3]), ROLES)
    assert again is not None and again == messages and again.running == _running(messages)
    assert again.census == {"tool_use", "tool_result", "tool_reference", "image"}
    # A known beginning is taken as it is said to be: a census that shrinks with it.
    shorter = checked(Remembered(messages[:2] + messages[3:], first.running[:2]), ROLES)
    assert shorter is not None and shorter.census == {"tool_use", "image"}
    odd = [{"role": "tool", "content": "x"}, *messages[1:]]
    assert checked(Remembered(odd, first.running[:1]), ROLES) is not None  # not walked again
    assert checked(Remembered(odd, []), ROLES) is None
    assert checked(Remembered([*messages, {"role": "user"}], first.running), ROLES) is None
    plain = checked(messages, ROLES)
    assert plain is not None and plain.running is None and plain.census == again.census
