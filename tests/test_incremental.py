"""A session's request parsed again only where it changed (server/incremental.py), and the
memo that keeps each session's last body (state/memo.py).

The parse must give exactly what `orjson.loads` gives, key order and errors included, for any
pair of bodies; it must reuse the earlier messages of a Claude Code session's next turn; and
nothing the proxy does with a request may change the reused messages in place.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from bench.conversation import grown, read_turn, session_turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from claude_proxy.conversion.census import kinds
from claude_proxy.server import incremental
from claude_proxy.server.incremental import KEPT_PER_SESSION, REUSE_FROM, ParsedBody, SessionBodies
from claude_proxy.state.memo import Memo
from tests.conftest import ProxyServer
from tests.scripted_upstream import ScriptedUpstream, completion

SESSION = "x-claude-code-session-id"


def parsed_like_whole(raw: bytes, previous: ParsedBody | None) -> ParsedBody | None:
    """Parses `raw` with `previous` remembered and checks the result against a whole
    parse: the same values, the same key order, the same error."""
    try:
        expected = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        with pytest.raises(orjson.JSONDecodeError) as caught:
            incremental.parse(raw, previous)
        assert str(caught.value) == str(error)
        return None
    body, parsed = incremental.parse(raw, previous)
    assert _text(body) == _text(expected)
    if parsed is not None:
        assert _text(parsed.messages) == _text(expected["messages"])
    return parsed


def _text(value: Any) -> str:
    """`value` as JSON, key order included (also nested deeper than orjson writes)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _compact(value: Any) -> bytes:
    """JSON as Claude Code and orjson write it, for values nested deeper than orjson
    writes."""
    return _text(value).encode()


# ---------------------------------------------------------------- Claude Code's sessions


@pytest.mark.parametrize("size_kb", [50, 200])
def test_a_claude_code_sessions_next_turn_reuses_all_but_the_changed_last_message(
        size_kb: int) -> None:
    """Each turn adds a Read call and its result and moves the cache marker, so the turn
    before's last message changed: all the others are the very objects parsed before."""
    previous = None
    for turn, raw in enumerate(session_turns(size_kb, 4, "Go on.", stream=True)):
        parsed = parsed_like_whole(raw, previous)
        assert parsed is not None and len(parsed.ends) == len(parsed.messages)
        assert parsed.rest is not None and list(parsed.rest)[:2] == ["system", "tools"]
        if previous is not None:
            kept = len(previous.messages) - 1
            assert all(parsed.messages[index] is previous.messages[index]
                       for index in range(kept)), turn
            assert parsed.messages[kept] is not previous.messages[kept]
            assert len(parsed.messages) == len(previous.messages) + 2
            assert parsed.rest is previous.rest  # the system prompt and tools, as parsed
        previous = parsed


def test_a_body_written_with_spaces_is_parsed_whole_and_not_remembered() -> None:
    body = grown(50)
    spaced = json.dumps(body).encode()
    assert len(spaced) >= REUSE_FROM
    assert parsed_like_whole(spaced, None) is None
    remembered = parsed_like_whole(orjson.dumps(body), None)
    assert remembered is not None
    assert parsed_like_whole(spaced, remembered) is None


def test_a_short_body_is_not_remembered() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert parsed_like_whole(orjson.dumps(body), None) is None


def test_an_edited_conversation_reuses_only_what_comes_before_the_edit() -> None:
    """A rewound or compacted session: the messages before the first changed one are
    reused, the rest parsed, and a different model (an earlier key) reuses nothing."""
    body = grown(100)
    first = parsed_like_whole(orjson.dumps(body), None)
    assert first is not None
    edited = orjson.loads(orjson.dumps(body))
    edited["messages"][10]["content"][0]["text"] = "changed"
    again = parsed_like_whole(orjson.dumps(edited), first)
    assert again is not None
    assert all(again.messages[i] is first.messages[i] for i in range(10))
    assert again.messages[10] is not first.messages[10]
    assert again.messages[11] is not first.messages[11]
    other_model = parsed_like_whole(orjson.dumps({**body, "model": "claude-opus-4-6"}), first)
    assert other_model is not None and other_model.messages[0] is not first.messages[0]


def test_a_second_messages_key_or_the_sentinel_is_read_as_a_whole_parse_reads_it() -> None:
    body = grown(50)
    first = parsed_like_whole(orjson.dumps(body), None)
    turn = {**body, "messages": [*body["messages"], *read_turn(7)]}
    raw = orjson.dumps(turn)
    for tail in (b',"messages":[{"role":"user","content":"last"}]}', b',"\\u0000":[1]}',
                 b',"tools":[{"\\u0000":1}]}', b',"m\\u0065ssages":[]}'):
        parsed = parsed_like_whole(raw[:-1] + tail, first)
        assert parsed is None or parsed.shared == 0, tail  # parsed whole: nothing reused


def test_a_message_nested_deeper_than_orjson_writes_is_parsed_but_not_remembered() -> None:
    """orjson parses 1,024 levels but writes 255: such a message (and those after it)
    cannot be found in the bytes, so the body is remembered up to it, or not at all."""
    body = grown(50)
    deep: Any = "bottom"
    for _ in range(300):
        deep = [deep]
    messages = body["messages"]
    nested = {**body, "messages": [*messages[:3], {"role": "user", "content": deep},
                                   *messages[3:]]}
    assert _compact(body) == orjson.dumps(body)
    first = parsed_like_whole(_compact(nested), None)
    assert first is not None and len(first.ends) == 3
    again = parsed_like_whole(_compact({**nested, "max_tokens": 7}), first)
    assert again is not None and again.messages[2] is first.messages[2]
    assert parsed_like_whole(_compact({**body, "model": deep}), None) is None


def test_an_invalid_body_fails_as_a_whole_parse_fails() -> None:
    body = grown(50)
    first = parsed_like_whole(orjson.dumps(body), None)
    raw = orjson.dumps({**body, "messages": [*body["messages"], *read_turn(7)]})
    for broken in (raw[:-1], raw[:-2000], raw + b"x", raw.replace(b'"Read"', b'"Re\xff"'),
                   raw[: len(raw) // 2]):
        assert parsed_like_whole(broken, first) is None  # the whole parse's error, raised


def test_a_session_keeps_its_main_conversation_and_its_subagents_apart() -> None:
    """Claude Code sends a subagent's requests under the session's id: the main
    conversation and the subagent's take turns, and each reuses its own last body. Past
    KEPT_PER_SESSION conversations, the least recently used goes."""
    main = session_turns(200, 3, "Go on.", stream=False)
    agents = []
    for number in range(KEPT_PER_SESSION):
        body = grown(50)
        body["messages"][0] = {"role": "user", "content": f"Subagent {number}: read the files."}
        agents.append([orjson.dumps({**body, "messages": [*body["messages"], *read_turn(turn)]})
                       for turn in range(1, 3)])
    kept = SessionBodies()

    def turn(raw: bytes) -> ParsedBody:
        expected = orjson.loads(raw)
        body, parsed = kept.parse(raw)
        assert _text(body) == _text(expected) and parsed is not None
        return parsed

    first_main, first_agent = turn(main[0]), turn(agents[0][0])
    second_main = turn(main[1])
    assert second_main.messages[0] is first_main.messages[0]
    assert second_main.shared == len(first_main.messages) - 1
    second_agent = turn(agents[0][1])
    assert second_agent.messages[0] is first_agent.messages[0] and second_agent.shared > 1
    assert [body.raw for body in kept.bodies] == [agents[0][1], main[1]]
    for others in agents[1:]:
        turn(others[0])
    assert len(kept.bodies) == KEPT_PER_SESSION and main[1] not in [b.raw for b in kept.bodies]
    assert turn(main[2]).shared == 0  # the main conversation was let go: parsed whole
    assert kept.weight == sum(body.weight for body in kept.bodies)


# ---------------------------------------------------------------- any pair of bodies

_leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12))
_values = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                  "content": _values})
_PAD = {"role": "user", "content": "x" * REUSE_FROM}


def _body(head: dict[str, Any], messages: list[Any], tail: dict[str, Any]) -> dict[str, Any]:
    return {**head, "messages": [_PAD, *messages], **tail}


def _written(body: dict[str, Any], writer: str) -> bytes:
    if writer == "orjson":
        return orjson.dumps(body)
    return json.dumps(body, ensure_ascii=writer == "ascii").encode()


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(head=st.dictionaries(st.sampled_from(["model", "system", "x"]), _values, max_size=2),
       messages=st.lists(_message, max_size=5), new=st.lists(_message, max_size=3),
       keep=st.integers(0, 6), tail=st.dictionaries(st.text(max_size=6), _values, max_size=3),
       writer=st.sampled_from(["orjson", "orjson", "spaces", "ascii"]),
       cut=st.integers(-40, 0), extra=st.sampled_from(
           [b"", b"", b',"messages":[]', b',"\\u0000":[]', b',"model":"other"', b"x"]))
def test_any_next_body_parses_as_a_whole_parse_would(
        head: dict[str, Any], messages: list[Any], new: list[Any], keep: int,
        tail: dict[str, Any], writer: str, cut: int, extra: bytes) -> None:
    """The next body keeps some of the messages, adds others, may be written otherwise,
    cut short, or carry a repeated key: whatever it is, it reads as `orjson.loads`."""
    tail = {key: value for key, value in tail.items() if key != "messages"}
    first = parsed_like_whole(orjson.dumps(_body(head, messages, tail)), None)
    raw = _written(_body(head, messages[:keep] + new, tail), writer)
    if extra:
        raw = raw[:-1] + extra + b"}"
    if cut:
        raw = raw[:cut]
    parsed = parsed_like_whole(raw, first)
    if writer == "orjson" and not extra and not cut:
        assert first is not None and parsed is not None
        assert parsed.messages[0] is first.messages[0]  # the long first message, reused
        assert first.rest is not None and parsed.rest is first.rest  # and what follows


# ---------------------------------------------------------------- the memo


def test_the_memo_lets_the_least_recently_used_go_past_its_budget() -> None:
    memo = Memo(budget=100, ttl=60, clock=lambda: 0.0)
    memo.put("a", "A", 40)
    memo.put("b", "B", 40)
    assert memo.get("a") == "A"  # now the most recently used
    memo.put("c", "C", 40)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == ("A", None, "C")
    assert memo.weight == 80
    memo.put("a", "A2", 10)  # replaced, not added
    assert (memo.get("a"), memo.weight, len(memo)) == ("A2", 50, 2)
    memo.put("huge", "H", 101)
    assert memo.get("huge") is None and len(memo) == 2
    assert [key for key, _ in memo.items()] == ["c", "a"]


def test_the_memo_forgets_an_entry_its_time_after_it_was_stored() -> None:
    now = [0.0]
    memo = Memo(budget=100, ttl=10, clock=lambda: now[0])
    memo.put("a", "A", 10)
    now[0] = 5.0
    memo.put("b", "B", 10)
    now[0] = 9.9
    assert memo.get("a") == "A"
    now[0] = 10.0
    assert memo.get("a") is None and memo.weight == 10
    now[0] = 15.0
    memo.put("c", "C", 10)  # b expired: let go as the new one comes in
    assert (len(memo), memo.weight) == (1, 10)


def test_a_memo_without_a_budget_keeps_nothing() -> None:
    memo = Memo(budget=0, ttl=10)
    memo.put("a", "A", 1)
    memo.put("b", "B", 0)
    assert memo.get("a") is None and memo.get("b") is None and len(memo) == 0


# ---------------------------------------------------------------- through the proxy


def _turn(proxy: ProxyServer, raw: bytes, session: str) -> dict[str, Any]:
    """Sends one turn of a session; checks that what the proxy remembers of it is still
    exactly what its bytes say (nothing changed the messages in place) and returns the
    answer and the first remembered message object."""
    answer = httpx.post(f"{proxy.url}/v1/messages", content=raw, timeout=30,
                        headers={"content-type": "application/json", SESSION: session})
    assert answer.status_code == 200, answer.text
    kept = proxy.app.state.wiring.bodies.get(f"-\n{session}")
    assert kept is not None
    remembered = kept.bodies[0]
    assert remembered.raw == raw
    fresh = orjson.loads(raw)
    messages = fresh["messages"]
    assert orjson.dumps(remembered.messages) == orjson.dumps(messages)
    after = list(fresh)[list(fresh).index("messages") + 1:]
    assert remembered.rest is not None
    assert orjson.dumps(remembered.rest) == orjson.dumps({key: fresh[key] for key in after})
    assert remembered.running == [kinds(messages[:count])
                                  for count in range(1, len(messages) + 1)]
    return {"answer": answer.json(), "first": remembered.messages[0]}


def test_a_sessions_turns_go_upstream_as_they_do_without_the_memo(
        proxy: ProxyServer, proxy_factory: Callable[..., ProxyServer],
        upstream: ScriptedUpstream) -> None:
    """The proxy remembers the session's last body and reuses its messages: the upstream
    gets exactly the requests a proxy without the memo sends, and the client the same
    answers."""
    bodies = session_turns(60, 3, "Go on.", stream=False)
    session = f"session-{uuid.uuid4()}"
    turns = []
    for raw in bodies:
        upstream.queue(completion({"content": "Read on."}))
        turns.append(_turn(proxy, raw, session))
    assert turns[0]["first"] is turns[1]["first"] is turns[2]["first"]
    sent = list(upstream.requests)
    without = proxy_factory(session_memo_bytes=0)
    upstream.reset()
    for raw, turn in zip(bodies, turns, strict=True):
        upstream.queue(completion({"content": "Read on."}))
        answer = httpx.post(f"{without.url}/v1/messages", content=raw, timeout=30, headers={
            "content-type": "application/json", SESSION: session})
        assert answer.json()["content"] == turn["answer"]["content"]
    assert len(without.app.state.wiring.bodies) == 0
    assert len(sent) == 3 and sent == upstream.requests


def test_reasoning_given_back_leaves_the_remembered_messages_as_they_came(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    """DeepSeek's reasoner gets its reasoning back on the tool-call turn: the proxy adds it
    to the converted message, never to the client's, which the next turn reuses."""
    proxy = proxy_factory(provider="deepseek", middle_model="deepseek-reasoner",
                          reasoning_with_tools=True, thinking_signature_secret="s" * 32)
    session = f"session-{uuid.uuid4()}"
    tools = [{"name": "Read", "description": "Reads a file.", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}}}]
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-6", "max_tokens": 4096, "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * REUSE_FROM},
                                                  {"type": "text", "text": "Read a.py"}]}]}
    upstream.queue(completion({"content": None, "reasoning_content": "Read it first.",
                               "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                   "name": "Read", "arguments": '{"file_path":"a.py"}'}}]},
                              finish="tool_calls"))
    first = _turn(proxy, orjson.dumps(body), session)
    assistant = first["answer"]["content"]
    assert [block["type"] for block in assistant] == ["thinking", "tool_use"]
    body["messages"] += [
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": assistant[1]["id"],
                                      "content": "print('a')"}]}]
    for answer in ("It prints a.", "Done."):
        upstream.queue(completion({"content": answer}))
        turn = _turn(proxy, orjson.dumps(body), session)
        assert turn["first"] is first["first"]
        assert turn["answer"]["content"][-1] == {"type": "text", "text": answer}
        body["messages"] += [{"role": "assistant", "content": turn["answer"]["content"]},
                             {"role": "user", "content": "And then?"}]
    given_back = [message for message in upstream.requests[1]["messages"]
                  if message.get("reasoning_content")]
    assert given_back and given_back[0]["reasoning_content"] == "Read it first."
    assert upstream.requests[2]["messages"][2] == upstream.requests[1]["messages"][2]
