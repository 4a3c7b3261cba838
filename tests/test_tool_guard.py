"""The tool-call guard (docs/tool-calls.md) on the shapes of the reference note
(tests/data/tool-calls/shapes.json): each replayed by the scripted upstream on the Chat
Completions, Responses and Messages wires, streamed and not, through a real proxy, and what
the client reads checked exactly (the input_json bytes of each call, its name, a fresh id
where one was minted); then the settings (off, observe, the hold limit), the ping while
holding, the report (log line, metrics, inspector)."""

from __future__ import annotations

import json
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from opentelemetry.trace import SpanKind

from claude_proxy.config.settings import GuardMode
from claude_proxy.conversion import response_converter
from claude_proxy.conversion.deltas import Delta, Finish, ToolCall
from claude_proxy.conversion.response_converter import StreamConverter
from claude_proxy.conversion.tool_guard import CallReport, ToolGuard
from claude_proxy.conversion.tool_schemas import OfferedTools
from claude_proxy.upstream.chat_completions import ChatCompletionsParser
from tests.conftest import ProxyServer
from tests.scripted_upstream import Reply, ScriptedUpstream, chunk, completion
from tests.sse_grammar import Event, accumulate, check_grammar, parse_sse
from tests.test_telemetry import Traced, by_kind, traced  # noqa: F401 (a fixture)

DATA = json.loads((Path(__file__).parent / "data" / "tool-calls" / "shapes.json").read_text())
CASES: list[dict[str, Any]] = DATA["cases"]
FIXTURE = json.loads((Path(__file__).parent / "data" / "fixtures" /
                      "claude-code-2.1.332-first-request.json").read_text())["body"]
CC_TOOLS = {tool["name"]: tool for tool in FIXTURE["tools"]}
APIS = ("chat", "responses", "messages")
FINISH = {"chat": {"tool_calls": "tool_calls", "stop": "stop", "length": "length"},
          "messages": {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}}


def tools_of(case: dict[str, Any]) -> list[dict[str, Any]]:
    tools = case["tools"]
    if isinstance(tools, list):
        return [CC_TOOLS[name] for name in tools]
    return [{"name": name, "description": name, "input_schema": schema}
            for name, schema in tools.items()]


def joined(call: dict[str, Any]) -> str:
    return "".join(call["fragments"])


# ------------------------------------------------------------------ the three wires


def chat_reply(case: dict[str, Any], stream: bool) -> Reply:
    if not stream:
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"], "arguments": joined(call)}}
            for call in case["calls"]]}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": message,
                             "finish_reason": FINISH["chat"][case["finish"]]}]}
        return Reply(body=body)
    frames = case.get("chunks") or [
        {"index": index, **({"id": call["id"], "type": "function",
                             "function": {"name": call["name"], "arguments": piece}}
                            if at == 0 else {"function": {"arguments": piece}})}
        for index, call in enumerate(case["calls"])
        for at, piece in enumerate(call["fragments"] or [""])]
    events: list[str | dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"tool_calls": [frame]}) for frame in frames]
    events.append(chunk({}, FINISH["chat"][case["finish"]]))
    return Reply(events=events)


def responses_reply(case: dict[str, Any], stream: bool) -> Reply:
    items = [{"type": "function_call", "id": f"fc_{index}", "call_id": call["id"],
              "name": call["name"], "arguments": joined(call), "status": "completed"}
             for index, call in enumerate(case["calls"])]
    cut = case["finish"] == "length"
    response = {"id": "resp_1", "object": "response", "model": "m", "output": items,
                "status": "incomplete" if cut else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None}
    if not stream:
        return Reply(body=response)
    events: list[str | dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "output": [],
                                                  "status": "in_progress"}}]
    for index, (item, call) in enumerate(zip(items, case["calls"], strict=True)):
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": {**item, "arguments": "", "status": "in_progress"}})
        if case.get("terminal_only"):
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "arguments": item["arguments"]})
        else:
            events += [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                        "output_index": index, "delta": piece} for piece in call["fragments"]]
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": item})
    events.append({"type": "response.incomplete" if cut else "response.completed",
                   "response": response})
    return Reply(events=events, named=True, done=False)


def messages_reply(case: dict[str, Any], stream: bool) -> Reply:
    reason = FINISH["messages"][case["finish"]]
    usage = {"input_tokens": 10, "output_tokens": 5}
    if not stream:
        content = [{"type": "tool_use", "id": call["id"], "name": call["name"],
                    "input": json.loads(joined(call))} for call in case["calls"]]
        return Reply(body={"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                           "content": content, "stop_reason": reason, "stop_sequence": None,
                           "usage": usage})
    events: list[str | dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}}]
    for index, call in enumerate(case["calls"]):
        events.append({"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}})
        events += [{"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece}}
                   for piece in call["fragments"]]
        events.append({"type": "content_block_stop", "index": index})
    events += [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": usage}, {"type": "message_stop"}]
    return Reply(events=events, named=True, done=False)


REPLIES = {"chat": chat_reply, "responses": responses_reply, "messages": messages_reply}


def replayable(case: dict[str, Any], api: str, stream: bool) -> bool:
    if api not in case.get("apis", APIS):
        return False
    if stream:
        return True
    if case["shape"] == "A1":
        return False  # a shape of streams only
    if api == "messages":  # a whole Message's input is JSON
        return all(parses(joined(call)) for call in case["calls"])
    return True


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ the client's side


@pytest.fixture(scope="module")
def proxies(proxy_factory: Callable[..., ProxyServer],
            upstream: ScriptedUpstream) -> dict[str, ProxyServer]:
    return {"chat": proxy_factory(),
            "responses": proxy_factory(middle_model="gpt-5.5"),
            "messages": proxy_factory(upstream_api="messages", openai_base_url=upstream.root_url,
                                      provider="generic")}


def request(case: dict[str, Any], stream: bool) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 1024, "stream": stream,
            "tools": tools_of(case), "messages": [{"role": "user", "content": "go"}]}


def sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.text.splitlines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def streamed_calls(proxy: ProxyServer, body: dict[str, Any]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tool_use blocks as the client assembles them (name, id, input_json text), and
    every event."""
    response = httpx.post(proxy.url + "/v1/messages", json=body, timeout=30)
    assert response.status_code == 200, response.text
    events = list(sse_events(response))
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            block = event["content_block"]
            calls[event["index"]] = {"name": block["name"], "id": block["id"], "arguments": ""}
        elif event["type"] == "content_block_delta" and (
                event["delta"]["type"] == "input_json_delta"):
            calls[event["index"]]["arguments"] += event["delta"]["partial_json"]
    return [calls[index] for index in sorted(calls)], events


def cases_for(stream: bool) -> list[Any]:
    return [pytest.param(case, api, id=f"{api}-{case['name']}") for case in CASES
            for api in APIS if replayable(case, api, stream)]


@pytest.mark.parametrize(("case", "api"), cases_for(stream=True))
def test_a_recorded_shape_streamed(case: dict[str, Any], api: str,
                                   proxies: dict[str, ProxyServer],
                                   upstream: ScriptedUpstream) -> None:
    upstream.queue(REPLIES[api](case, True))
    calls, events = streamed_calls(proxies[api], request(case, stream=True))
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == case["expected"]
    deltas = [e for e in events if e["type"] == "content_block_delta"
              and e["delta"]["type"] == "input_json_delta"]
    assert len(deltas) == sum(1 for c in case["expected"] if c["arguments"])
    upstream_ids = {call["id"] for call in case["calls"]}
    fresh = case.get("fresh_id", [False] * len(calls))
    assert [call["id"] not in upstream_ids for call in calls] == fresh
    assert len({call["id"] for call in calls}) == len(calls)
    stop = next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"]
    assert stop == ("max_tokens" if case["finish"] == "length" else "tool_use")


@pytest.mark.parametrize(("case", "api"), cases_for(stream=False))
def test_a_recorded_shape_not_streamed(case: dict[str, Any], api: str,
                                       proxies: dict[str, ProxyServer],
                                       upstream: ScriptedUpstream) -> None:
    upstream.queue(REPLIES[api](case, False))
    response = httpx.post(proxies[api].url + "/v1/messages", json=request(case, stream=False),
                          timeout=30)
    assert response.status_code == 200, response.text
    uses = [block for block in response.json()["content"] if block["type"] == "tool_use"]
    # The object a streaming client's text is; any other text as it came, a string (never
    # `{}` in its place: docs/tool-calls.md).
    assert [(use["name"], use["input"]) for use in uses] == [
        (call["name"], whole_input(call["arguments"])) for call in case["expected"]]
    assert any(isinstance(use["input"], str) for use in uses) == (case["name"] in RAW_INPUT)
    counts = Counter(case["outcomes"])
    assert response.headers["x-claude-proxy-tool-calls"] == ";".join(
        f"{outcome}={counts[outcome]}" for outcome in dict.fromkeys(case["outcomes"]))


def whole_input(arguments: str) -> Any:
    value = json.loads(arguments) if parses(arguments) else arguments
    return value if isinstance(value, dict) else arguments


RAW_INPUT = {"A3-collapsed-one-invalid", "B3-cut-by-max-tokens", "B3-ends-inside-a-string"}
"""The shapes whose call goes out as text that is no JSON object."""


# ------------------------------------------------------------------ the guard on its own


def unsigned(thinking: str, opaque: list[dict[str, Any]] = [], /) -> str:  # noqa: B006
    return ""


def guarded(frames: list[dict[str, Any]], tools: list[dict[str, Any]], *,
            finish: str = "tool_calls", mode: GuardMode = "repair", max_hold: int = 1 << 22,
            finish_apart: bool = True) -> tuple[list[tuple[str, str]], list[CallReport]]:
    """Chat Completions tool_calls frames through the parser, the guard and the blocks: the
    calls as a streaming client reads them (name, input_json text), and the guard's reports."""
    reports: list[CallReport] = []
    guard = ToolGuard(OfferedTools.of_request({"tools": tools}), reports.append, mode=mode,
                      max_hold=max_hold)
    converter = StreamConverter("m", input_tokens=1, sign=unsigned,
                                parser=ChatCompletionsParser(), guard=guard)
    events = converter.start()
    chunks = [chunk({"tool_calls": [frame]}) for frame in frames]
    if finish_apart or not chunks:
        chunks.append(chunk({}, finish))
    else:
        chunks[-1]["choices"][0]["finish_reason"] = finish
    for each in chunks:
        events += converter.feed(each)
    events += converter.finish()
    return client_calls(events), reports


def client_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    names: dict[int, str] = {}
    texts: dict[int, str] = {}
    for event in events:
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            names[event["index"]] = event["content_block"]["name"]
            texts[event["index"]] = ""
        elif event["type"] == "content_block_delta" and (
                event["delta"]["type"] == "input_json_delta"):
            texts[event["index"]] += event["delta"]["partial_json"]
    return [(names[index], texts[index]) for index in sorted(names)]


def frames_of(calls: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    """Frames of calls given as (id, name, fragments), one call after the other."""
    return [{"index": index, **({"id": call_id, "function": {"name": name, "arguments": piece}}
                                if at == 0 else {"function": {"arguments": piece}})}
            for index, (call_id, name, pieces) in enumerate(calls)
            for at, piece in enumerate(pieces or [""])]


def expected_calls(case: dict[str, Any]) -> list[tuple[str, str]]:
    return [(call["name"], call["arguments"]) for call in case["expected"]]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_what_the_guard_says_of_each_shape(case: dict[str, Any]) -> None:
    """The outcome of each upstream call, and for a repair: the result validates by the
    oracle (another draft 2020-12 implementation) and the original did not."""
    frames = frames_of([(c["id"], c["name"], c["fragments"]) for c in case["calls"]])
    calls, reports = guarded(frames, tools_of(case), finish=FINISH["chat"][case["finish"]])
    assert calls == expected_calls(case)
    assert [report.outcome for report in reports] == case["outcomes"]
    schemas = {tool["name"]: tool["input_schema"] for tool in tools_of(case)}
    for report in reports:
        assert_honest(report, schemas)


def oracle(schema: Any) -> Draft202012Validator:
    """The tests' judge of validity: the pure-Python `jsonschema`, another implementation
    than the guard's (`jsonschema_rs`)."""
    return Draft202012Validator(schema)


def assert_honest(report: CallReport, schemas: dict[str, Any]) -> None:
    """What a report says holds by the oracle: a repair's every part validates and its
    original did not; a valid call validates; nothing else was sent changed."""
    schema = schemas.get(report.name or report.tool)
    if report.outcome == "repaired" and report.sent:
        judge = oracle(schema)
        assert all(judge.is_valid(json.loads(sent)) for sent in report.sent)
        if parses(report.original) and not report.kinds[0].startswith(("S", "R8")):
            assert not judge.is_valid(json.loads(report.original))
    elif report.outcome == "valid":
        assert oracle(schema).is_valid(json.loads(report.original))
    if report.outcome not in ("repaired", "dropped"):
        assert report.sent == ()


# ------------------------------------------------------------------ properties

PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
SPLITTABLE = [case for case in CASES if case["shape"] != "A1" and "chunks" not in case]


def cut(text: str, points: list[int]) -> list[str]:
    marks = sorted({point % (len(text) + 1) for point in points})
    return [text[start:end] for start, end in zip([0, *marks], [*marks, len(text)],
                                                  strict=True)]


@PROPERTY
@given(case=st.sampled_from(SPLITTABLE), points=st.lists(st.integers(0, 10_000), max_size=8),
       finish_apart=st.booleans())
def test_any_split_of_the_arguments_gives_the_same_calls(
        case: dict[str, Any], points: list[int], finish_apart: bool) -> None:
    calls = [(c["id"], c["name"], cut(joined(c), points)) for c in case["calls"]]
    assert guarded(frames_of(calls), tools_of(case), finish=FINISH["chat"][case["finish"]],
                   finish_apart=finish_apart)[0] == expected_calls(case)


INTERLEAVABLE = [case for case in SPLITTABLE if len(case["calls"]) == 1
                 and case["finish"] == "tool_calls" and "apis" not in case]


@PROPERTY
@given(data=st.data())
def test_any_interleaving_of_parallel_calls_gives_the_same_calls(data: st.DataObject) -> None:
    """Calls of several shapes at once, each under its own index and id, their fragments
    interleaved in any order (each call's own order kept, and the calls begun in order)."""
    picked = data.draw(st.lists(st.sampled_from(INTERLEAVABLE), min_size=2, max_size=4))
    tools = {tool["name"]: tool for case in picked for tool in tools_of(case)}
    pending = []
    for index, case in enumerate(picked):
        call = case["calls"][0]
        pieces = cut(joined(call), data.draw(st.lists(st.integers(0, 10_000), max_size=4)))
        frames = [{"index": index, "id": f"call_{index}",
                   "function": {"name": call["name"], "arguments": pieces[0]}}]
        frames += [{"index": index, "function": {"arguments": piece}} for piece in pieces[1:]]
        pending.append(frames)
    order: list[dict[str, Any]] = []
    begun = 0
    while any(pending):
        choices = [i for i, frames in enumerate(pending) if frames and i <= begun]
        chosen = data.draw(st.sampled_from(choices))
        order.append(pending[chosen].pop(0))
        begun = max(begun, chosen + 1)
    calls, _ = guarded(order, list(tools.values()))
    assert calls == [call for case in picked for call in expected_calls(case)]


BASH = CC_TOOLS["Bash"]["input_schema"]
READ = CC_TOOLS["Read"]["input_schema"]
TODO_SCHEMA = CASES[[c["name"] for c in CASES].index("B5-todos-as-a-string")]["tools"]["TodoWrite"]
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
VALID = {
    "Bash": st.fixed_dictionaries({"command": TEXT}, optional={
        "timeout": st.integers(0, 600_000), "description": TEXT,
        "run_in_background": st.booleans()}),
    "Read": st.fixed_dictionaries({"file_path": TEXT}, optional={
        "offset": st.integers(0, 10_000), "limit": st.integers(1, 2000), "pages": TEXT}),
    "TodoWrite": st.fixed_dictionaries({"todos": st.lists(st.fixed_dictionaries({
        "content": TEXT, "status": st.sampled_from(["pending", "in_progress", "completed"]),
        "activeForm": TEXT}), max_size=3)}),
}
SCHEMAS = {"Bash": BASH, "Read": READ, "TodoWrite": TODO_SCHEMA}
TOOLS = [CC_TOOLS["Bash"], CC_TOOLS["Read"],
         {"name": "TodoWrite", "description": "todos", "input_schema": TODO_SCHEMA}]


def written(value: Any, style: int) -> str:
    """JSON as different writers write it (spacing, escaping, key order)."""
    if style == 0:
        return json.dumps(value)
    if style == 1:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if style == 2:
        return json.dumps(value, indent=1, sort_keys=True)
    return " " + json.dumps(value, ensure_ascii=False) + "\n"


@PROPERTY
@given(data=st.data(), style=st.integers(0, 3), points=st.lists(st.integers(0, 10_000),
                                                                max_size=5))
def test_a_valid_call_goes_out_byte_for_byte(data: st.DataObject, style: int,
                                             points: list[int]) -> None:
    name = data.draw(st.sampled_from(sorted(VALID)))
    text = written(data.draw(VALID[name]), style)
    calls, reports = guarded(frames_of([("call_1", name, cut(text, points))]), TOOLS)
    assert calls == [(name, text)]
    assert [report.outcome for report in reports] == ["valid"]


def broken(value: dict[str, Any], how: str) -> str:
    """A valid value as models break it (the reference note's B shapes)."""
    if how == "python":
        return repr(value)
    if how == "double_encoded":
        return json.dumps(json.dumps(value))
    if how == "wrapped":
        return json.dumps({"arguments": value})
    if how == "fenced":
        return "```json\n" + json.dumps(value) + "\n```"
    strung = {key: json.dumps(item) if not isinstance(item, str) else item
              for key, item in value.items()}
    return json.dumps(strung)


@PROPERTY
@given(data=st.data(), how=st.sampled_from(["python", "double_encoded", "wrapped", "fenced",
                                            "strung"]))
def test_every_repair_validates_and_its_original_did_not(data: st.DataObject,
                                                          how: str) -> None:
    name = data.draw(st.sampled_from(sorted(VALID)))
    value = data.draw(VALID[name])
    text = broken(value, how)
    calls, reports = guarded(frames_of([("call_1", name, [text])]), TOOLS)
    (report,) = reports
    assert report.outcome in ("valid", "repaired", "invalid")
    judge = oracle(SCHEMAS[name])
    (_, sent), = calls
    if report.outcome == "repaired":
        assert judge.is_valid(json.loads(sent)) and json.loads(sent) == value
        assert not (parses(text) and judge.is_valid(json.loads(text)))
    else:  # as it came, byte for byte
        assert sent == text
        assert report.outcome != "valid" or judge.is_valid(json.loads(text))


@PROPERTY
@given(data=st.data(), at=st.integers(1, 10_000))
def test_a_truncated_call_is_never_repaired(data: st.DataObject, at: int) -> None:
    """Cut anywhere by the output limit, a call goes out exactly as far as it came (it may
    validate as far as it came: then it was whole)."""
    name = data.draw(st.sampled_from(sorted(VALID)))
    text = written(data.draw(VALID[name]), 0)
    part = text[:at % len(text)]
    calls, reports = guarded(frames_of([("call_1", name, [part])]), TOOLS, finish="length")
    assert calls == [(name, part or "{}")]
    assert reports[0].outcome in ("invalid", "valid")
    assert reports[0].sent == ()


@PROPERTY
@given(data=st.data())
def test_a_call_ending_inside_a_string_is_never_completed(data: st.DataObject) -> None:
    command = data.draw(TEXT.filter(lambda text: json.dumps(text)[:-1]))
    part = json.dumps({"command": command, "description": "d"})
    part = part[:part.index('"description"') - 3]  # inside the command's string
    calls, reports = guarded(frames_of([("call_1", "Bash", [part])]), TOOLS)
    assert calls == [("Bash", part)]
    assert reports[0].outcome == "invalid"


# ------------------------------------------------------------------ invariants by hand


def test_no_schema_or_an_unknown_keyword_means_no_repair() -> None:
    strung = '{"count": "5"}'
    for schema in ({"type": "object", "properties": {"count": {"type": "integer"}},
                    "x-vendor-rule": True},
                   {"type": "object", "properties": {"count": {"$dynamicRef": "#meta"}}},
                   None):
        tool = {"name": "count", "description": "d", "input_schema": schema}
        calls, reports = guarded(frames_of([("call_1", "count", [strung])]), [tool])
        assert calls == [("count", strung)]
        assert [report.outcome for report in reports] == ["unchecked"]
    known = {"name": "count", "description": "d", "input_schema": {
        "type": "object", "properties": {"count": {"type": "integer"}}}}
    assert guarded(frames_of([("call_1", "count", [strung])]), [known])[0] == [
        ("count", '{"count":5}')]


def test_a_deferred_tool_not_loaded_is_not_offered() -> None:
    deferred = {**CC_TOOLS["Read"], "defer_loading": True}
    offered = OfferedTools.of_request({"tools": [deferred], "messages": []})
    assert offered.check("Read", '{"file_path": "/a", "offset": "5"}').outcome == "unchecked"
    loaded = OfferedTools.of_request({"tools": [deferred], "messages": [
        {"role": "user", "content": [{"type": "tool_reference", "tool_name": "Read"}]}]})
    assert loaded.check("Read", '{"file_path": "/a", "offset": "5"}').outcome == "repaired"


class Watched(list[Any]):
    """A request's messages that can be watched (a list has no weak references)."""


def test_the_guard_of_an_open_stream_holds_the_tools_not_the_conversation() -> None:
    """The guard lives as long as the stream; the parsed conversation went with it (a
    Claude Code session's 850 KB), where the record keeps the request as bytes only. Its
    messages stay only while a `tool_reference` in them may load a deferred tool."""
    deferred = {**CC_TOOLS["Read"], "defer_loading": True}
    messages = Watched([{"role": "user", "content": "hello"}])
    watched = weakref.ref(messages)
    offered = OfferedTools.of_request({"tools": [CC_TOOLS["Read"]], "messages": messages})
    del messages
    assert watched() is None
    assert offered.check("Read", '{"file_path": "/a", "offset": "5"}').outcome == "repaired"
    loading = Watched([{"role": "user", "content": [
        {"type": "tool_reference", "tool_name": "Read"}]}])
    watched = weakref.ref(loading)
    offered = OfferedTools.of_request({"tools": [deferred], "messages": loading})
    del loading
    assert watched() is not None
    assert offered.check("Read", '{"file_path": "/a", "offset": "5"}').outcome == "repaired"
    assert watched() is None


def test_the_accept_callable_of_the_markup_parsers() -> None:
    offered = OfferedTools({"Bash": BASH})
    assert offered.accept("Bash", {"command": "ls"}) == {"command": "ls"}
    assert offered.accept("Bash", {"command": "ls", "timeout": "50"}) == {
        "command": "ls", "timeout": 50}
    assert offered.accept("Bash", '{"command": "ls"}') == {"command": "ls"}
    assert offered.accept("Bash", {"cmd": "ls"}) is None
    assert offered.accept("Grep", {"pattern": "x"}) is None


def test_text_and_reasoning_around_calls_keep_their_order() -> None:
    """Other content closes the held calls first; whitespace between calls stays behind them."""
    reports: list[CallReport] = []
    guard = ToolGuard(OfferedTools.of_request({"tools": TOOLS}), reports.append)
    converter = StreamConverter("m", input_tokens=1, sign=unsigned,
                                parser=ChatCompletionsParser(), guard=guard)
    events = converter.start()
    for delta in ({"content": "Reading."},
                  {"tool_calls": [{"index": 0, "id": "a", "function": {
                      "name": "Read", "arguments": "{'file_path': '/a'}"}}]},
                  {"content": "\n\n"},
                  {"tool_calls": [{"index": 1, "id": "b", "function": {
                      "name": "Bash", "arguments": '{"command": "ls"}'}}]},
                  {"reasoning_content": "now the rest"},
                  {"content": "Done."}):
        events += converter.feed(chunk(delta))
    events += converter.feed(chunk({}, "tool_calls")) + converter.finish()
    starts = [event["content_block"]["type"] for event in events
              if event["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use", "thinking", "text"]
    assert client_calls(events) == [("Read", '{"file_path":"/a"}'),
                                    ("Bash", '{"command": "ls"}')]


def test_a_piece_after_the_finish_is_left_out() -> None:
    """OpenRouter's second finish chunk repeating the arguments (A2): the call went out."""
    frames = frames_of([("call_1", "Bash", ['{"command": "ls"}'])])
    reports: list[CallReport] = []
    guard = ToolGuard(OfferedTools.of_request({"tools": TOOLS}), reports.append)
    converter = StreamConverter("m", input_tokens=1, sign=unsigned,
                                parser=ChatCompletionsParser(), guard=guard)
    events = converter.start() + converter.feed(chunk({"tool_calls": frames}, "tool_calls"))
    events += converter.feed(chunk({"tool_calls": [{"index": 0, "function": {
        "arguments": '{"command": "ls"}'}}]}, "tool_calls"))
    events += converter.finish()
    assert client_calls(events) == [("Bash", '{"command": "ls"}')]
    assert [report.outcome for report in reports] == ["valid"]


def test_observe_changes_no_byte_and_says_what_it_found() -> None:
    pieces = ["{'command': ", "'ls'}"]
    off, _ = guarded(frames_of([("call_1", "Bash", pieces)]), TOOLS, mode="off")
    observed, reports = guarded(frames_of([("call_1", "Bash", pieces)]), TOOLS, mode="observe")
    assert observed == off == [("Bash", "{'command': 'ls'}")]
    assert [(r.outcome, r.kinds) for r in reports] == [("repairable", ("R4:json_repair",))]


def test_past_the_hold_limit_a_call_streams_as_it_comes() -> None:
    pieces = ['{"command": "', "x" * 40, "y" * 40, '"}']
    calls, reports = guarded(frames_of([("call_1", "Bash", pieces)]), TOOLS, max_hold=50)
    assert calls == [("Bash", "".join(pieces))]
    assert [report.outcome for report in reports] == ["overflow"]


class GivenDeltas:
    """A parser whose chunks are the deltas themselves (`{"deltas": [...]}`)."""

    def parse(self, chunk: dict[str, Any]) -> list[Delta]:
        deltas: list[Delta] = chunk["deltas"]
        return deltas

    def flush(self) -> list[Delta]:
        return []


def test_a_keep_alive_while_a_call_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing goes out while the arguments are held; after HOLD_PING_SECONDS of that, an
    event that adds nothing (a fake clock: no test waits). On the held call's open block an
    empty input_json_delta, which Claude Code's idle watchdog counts (its SDK drops a
    `ping`); a `ping` while no block is open (a later call, held before its start)."""
    now = [1000.0]
    monkeypatch.setattr(response_converter.time, "monotonic", lambda: now[0])
    guard = ToolGuard(OfferedTools.of_request({"tools": TOOLS}), lambda report: None)
    converter = StreamConverter("m", input_tokens=1, sign=unsigned, parser=GivenDeltas(),
                                guard=guard)
    events = converter.start()

    def held_for(seconds: int, piece: ToolCall) -> list[dict[str, Any]]:
        quiet = []
        for _ in range(seconds):
            now[0] += 1.0
            quiet += converter.feed({"deltas": [piece]})
        return quiet

    first = converter.feed({"deltas": [ToolCall(0, "a", "Bash", '{"command": "')]})
    assert [event["type"] for event in first] == ["content_block_start"]
    quiet = held_for(40, ToolCall(0, arguments="x"))  # one each 15 s
    assert quiet == [{"type": "content_block_delta", "index": 0, "delta": {
        "type": "input_json_delta", "partial_json": ""}}] * 2
    closed = converter.feed({"deltas": [ToolCall(0, arguments='"}', last=True),
                                        ToolCall(1, "b", "Bash", '{"command": "')]})
    assert [event["type"] for event in closed] == ["content_block_delta", "content_block_stop"]
    assert held_for(20, ToolCall(1, arguments="y")) == [{"type": "ping"}]
    now[0] += 100
    done = converter.feed({"deltas": [Finish("tool_use")]})
    assert "ping" not in [event["type"] for event in done]
    assert client_calls(events + first + quiet + closed + done + converter.finish()) == [
        ("Bash", '{"command": "' + "x" * 40 + '"}'), ("Bash", '{"command": "' + "y" * 20)]


# ------------------------------------------------------------------ what is said of it


def test_a_repair_is_logged_counted_and_kept_for_the_inspector(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream,
        caplog: pytest.LogCaptureFixture) -> None:
    proxy = proxies["chat"]
    broken = "{'command': 'ls', 'timeout': '5'}"
    upstream.queue(Reply(events=[chunk({"tool_calls": frames_of([
        ("call_1", "Bash", [broken]), ("call_2", "Bash\nforged line", ['{"command": "x"}'])])}),
        chunk({}, "tool_calls")]))
    body = {**request({"tools": ["Bash"]}, stream=True)}
    with caplog.at_level(logging.INFO, logger="claude_proxy.service"):
        response = httpx.post(proxy.url + "/v1/messages", json=body, timeout=30)
    assert response.status_code == 200
    lines = [record.getMessage() for record in caplog.records
             if record.getMessage().startswith("tool call ")]
    assert lines == [
        "tool call provider=openai model=middle-upstream tool='Bash' outcome=repaired "
        "kinds='R4:json_repair,R7:$.timeout:string->number' bytes=33->28 error='-'",
        "tool call provider=openai model=middle-upstream tool='Bash\\nforged line' "
        "outcome=unchecked kinds='' bytes=16->- error='no such tool'"]
    metrics = httpx.get(proxy.url + "/metrics").text
    assert ('claude_proxy_tool_calls_total{model="middle-upstream",outcome="repaired",'
            'provider="openai"}') in metrics
    assert ('claude_proxy_tool_call_repairs_total{kind="R7:string->number",'
            'model="middle-upstream",provider="openai"} 1.0') in metrics
    view = httpx.get(f"{proxy.url}/ui/api/requests/{response.headers['request-id']}").json()
    assert [(call["tool"], call["outcome"], call["original"], call["sent"])
            for call in view["tool_guard"]] == [
        ("Bash", "repaired", broken, ['{"command":"ls","timeout":5}']),
        ("Bash\nforged line", "unchecked", '{"command": "x"}', [])]
    assert view["row"]["tool_calls"] == {"repaired": 1, "unchecked": 1}


def test_a_whole_answer_without_a_call_has_no_tool_call_header(
        proxies: dict[str, ProxyServer], upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "No call."}))
    response = httpx.post(proxies["chat"].url + "/v1/messages",
                          json=request({"tools": ["Bash"]}, False), timeout=30)
    assert response.json()["content"] == [{"type": "text", "text": "No call."}]
    assert "x-claude-proxy-tool-calls" not in response.headers


def test_the_guard_is_set_per_provider_and_watches_only_for_anthropic() -> None:
    from claude_proxy.config.settings import ProviderSettings
    assert ProviderSettings().guard_mode == "repair"
    anthropic = ProviderSettings(upstream_api="messages",
                                 openai_base_url="https://api.anthropic.com")
    assert anthropic.guard_mode == "observe"
    assert ProviderSettings(openai_base_url="https://api.anthropic.com").guard_mode == "repair"
    assert ProviderSettings(tool_guard="OFF").guard_mode == "off"
    with pytest.raises(ValueError, match="tool_guard"):
        ProviderSettings(tool_guard="fix")


def test_tool_guard_off_streams_the_fragments_as_they_come(
        proxy_factory: Callable[..., ProxyServer], upstream: ScriptedUpstream) -> None:
    proxy = proxy_factory(tool_guard="off")
    case = CASES[0]
    upstream.queue(REPLIES["chat"](case, True))
    calls, events = streamed_calls(proxy, request(case, stream=True))
    assert [call["arguments"] for call in calls] == [joined(case["calls"][0])]
    assert [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"] \
        == case["calls"][0]["fragments"]


def test_a_repair_is_an_event_on_the_attempts_span(traced: Callable[..., Traced],  # noqa: F811
                                                   upstream: ScriptedUpstream) -> None:
    proxy = traced()
    upstream.queue(Reply(events=[chunk({"tool_calls": frames_of([
        ("call_1", "bash", ["{'command': 'ls'}"])])}), chunk({}, "tool_calls")]))
    response = httpx.post(proxy.proxy.url + "/v1/messages",
                          json=request({"tools": ["Bash"]}, stream=True), timeout=30)
    assert response.status_code == 200
    (client,) = by_kind(proxy.finished(2), SpanKind.CLIENT)
    assert [(event.name, dict(event.attributes or {})) for event in client.events] == [
        ("gen_ai.tool_call.repaired", {"gen_ai.tool.name": "bash",
                                       "claude_proxy.tool_call.outcome": "repaired",
                                       "claude_proxy.tool_call.kinds": ("R4:json_repair",
                                                                        "R8:name"),
                                       "claude_proxy.tool_call.resolved_name": "Bash"})]


# ------------------------------------------------------------------ re-ask


def test_reask_gives_a_whole_reply_one_more_chance(proxy_factory: Callable[..., ProxyServer],
                                                  upstream: ScriptedUpstream) -> None:
    """TOOL_GUARD_REASK: a non-streamed reply whose only call nothing could repair is asked
    for once more, with the error as the call's result; what the second answer says is the
    answer (and both were paid for)."""
    proxy = proxy_factory(tool_guard_reask=True)
    bad = '{"command": "ls", "cwd": "/tmp"}'
    first = {"content": None, "tool_calls": [{"id": "call_bad", "type": "function",
                                              "function": {"name": "Bash", "arguments": bad}}]}
    second = {"content": None, "tool_calls": [{"id": "call_ok", "type": "function", "function": {
        "name": "Bash", "arguments": '{"command": "cd /tmp && ls"}'}}]}
    usage = {"prompt_tokens": 100, "completion_tokens": 10}
    upstream.queue(completion(first, "tool_calls", usage), completion(second, "tool_calls", usage))
    response = httpx.post(proxy.url + "/v1/messages", json=request({"tools": ["Bash"]}, False),
                          timeout=30)
    message = response.json()
    assert [(b["id"], b["input"]) for b in message["content"] if b["type"] == "tool_use"] == [
        ("call_ok", {"command": "cd /tmp && ls"})]
    assert (message["usage"]["input_tokens"], message["usage"]["output_tokens"]) == (200, 20)
    assert response.headers["x-claude-proxy-tool-calls"] == "invalid=1;valid=1"
    again = upstream.requests[1]["messages"]
    assert again[-2]["tool_calls"][0]["id"] == "call_bad"
    assert again[-1]["role"] == "tool" and again[-1]["tool_call_id"] == "call_bad"
    assert again[-1]["content"] == (  # how the proxy sends any tool error upstream
        "Error: <tool_use_error>InputValidationError: Bash failed due to the following issue: "
        "$: Additional properties are not allowed ('cwd' was unexpected)\nYou sent: "
        f"{bad}</tool_use_error>")
    assert len(upstream.requests) == 2


def test_no_reask_by_default_nor_for_a_cut_call(proxy_factory: Callable[..., ProxyServer],
                                                upstream: ScriptedUpstream) -> None:
    bad = {"content": None, "tool_calls": [{"id": "call_bad", "type": "function", "function": {
        "name": "Bash", "arguments": '{"command": "ls", "cwd": "/tmp"}'}}]}
    cut = {"content": None, "tool_calls": [{"id": "call_cut", "type": "function", "function": {
        "name": "Bash", "arguments": '{"command": "rm -rf /tmp/bu'}}]}
    for proxy, reply, finish in ((proxy_factory(), bad, "tool_calls"),
                                 (proxy_factory(tool_guard_reask=True), cut, "length")):
        upstream.reset()
        upstream.queue(completion(reply, finish))
        response = httpx.post(proxy.url + "/v1/messages",
                              json=request({"tools": ["Bash"]}, False), timeout=30)
        assert response.status_code == 200 and len(upstream.requests) == 1


BAD_CALL = '{"command": "ls", "cwd": "/tmp"}'
GOOD_CALL = '{"command": "cd /tmp && ls"}'
USAGE = {"prompt_tokens": 100, "completion_tokens": 10}


def streamed_call(call_id: str, arguments: str, *before: dict[str, Any]) -> Reply:
    """A streamed Bash call (after the deltas `before`: thinking, text), its usage last."""
    return Reply(events=[chunk({"role": "assistant", "content": ""}),
                         *(chunk(delta) for delta in before),
                         chunk({"tool_calls": frames_of([(call_id, "Bash", [arguments])])}),
                         chunk({}, "tool_calls"), chunk(None, None, USAGE)])


@pytest.fixture(scope="module")
def reasking(proxy_factory: Callable[..., ProxyServer]) -> ProxyServer:
    return proxy_factory(tool_guard_reask=True)


def streamed(proxy: ProxyServer, body: dict[str, Any]) -> list[Event]:
    response = httpx.post(proxy.url + "/v1/messages", json=body, timeout=30)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    check_grammar(events)
    return events


def test_reask_on_a_stream_sends_the_retrys_answer_in_the_first_ones_place(
        reasking: ProxyServer, upstream: ScriptedUpstream) -> None:
    """TOOL_GUARD_REASK, streamed: a reply whose only content is a call that failed is held
    back to its end, then asked again; the client gets one message, the retry's call at
    index 0, and both answers' usage."""
    upstream.queue(streamed_call("call_bad", BAD_CALL), streamed_call("call_ok", GOOD_CALL))
    events = streamed(reasking, request({"tools": ["Bash"]}, True))
    assert [(e.name, e.data.get("index")) for e in events if e.name != "ping"] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("message_delta", None), ("message_stop", None)]
    message = accumulate(events)
    assert [(b["id"], b["input"]) for b in message["content"]] == [
        ("call_ok", {"command": "cd /tmp && ls"})]
    assert (message["stop_reason"], message["usage"]["input_tokens"],
            message["usage"]["output_tokens"]) == ("tool_use", 200, 20)
    again = upstream.requests[1]["messages"]
    assert json.loads(again[-2]["tool_calls"][0]["function"]["arguments"]) == json.loads(
        BAD_CALL)
    assert again[-1]["tool_call_id"] == "call_bad" and again[-1]["content"].startswith(
        "Error: <tool_use_error>InputValidationError: Bash failed due to the following issue")
    assert upstream.requests[1]["stream"] is True and len(upstream.requests) == 2


@pytest.mark.parametrize("before", [{"reasoning_content": "Listing."}, {"content": "Sure."}],
                         ids=["thinking", "text"])
def test_no_reask_on_a_stream_once_other_content_was_shown(
        before: dict[str, Any], reasking: ProxyServer, upstream: ScriptedUpstream) -> None:
    """Thinking or text before the call goes out as it comes (a retry could not take it
    back), and the reply with it: its call as it came, not asked again."""
    upstream.queue(streamed_call("call_bad", BAD_CALL, before))
    message = accumulate(streamed(reasking, request({"tools": ["Bash"]}, True)))
    assert [block["type"] for block in message["content"]] == [
        "thinking" if "reasoning_content" in before else "text", "tool_use"]
    assert message["content"][1]["input"] == json.loads(BAD_CALL)
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_reask_that_cannot_be_opened_leaves_the_first_answer(
        stream: bool, reasking: ProxyServer, upstream: ScriptedUpstream) -> None:
    first = streamed_call("call_bad", BAD_CALL) if stream else completion({
        "content": None, "tool_calls": [{"id": "call_bad", "type": "function", "function": {
            "name": "Bash", "arguments": BAD_CALL}}]}, "tool_calls", USAGE)
    upstream.queue(first, Reply(status=400, body={
        "error": {"message": "bad history", "type": "invalid_request_error"}}))
    body = request({"tools": ["Bash"]}, stream)
    message = accumulate(streamed(reasking, body)) if stream else httpx.post(
        reasking.url + "/v1/messages", json=body, timeout=30).json()
    assert [(b["id"], b["input"]) for b in message["content"]] == [
        ("call_bad", json.loads(BAD_CALL))]
    assert message["usage"]["output_tokens"] == 10 and len(upstream.requests) == 2


def test_reask_through_the_stop_sequence_path(reasking: ProxyServer,
                                              upstream: ScriptedUpstream) -> None:
    """A whole answer with stop sequences is read from an upstream stream: re-asked there."""
    upstream.queue(streamed_call("call_bad", BAD_CALL), streamed_call("call_ok", GOOD_CALL))
    body = {**request({"tools": ["Bash"]}, False), "stop_sequences": ["STOP"]}
    response = httpx.post(reasking.url + "/v1/messages", json=body, timeout=30)
    message = response.json()
    assert [(b["id"], b["input"]) for b in message["content"]] == [
        ("call_ok", {"command": "cd /tmp && ls"})]
    assert (message["usage"]["input_tokens"], message["usage"]["output_tokens"]) == (200, 20)
    assert response.headers["x-claude-proxy-tool-calls"] == "invalid=1;valid=1"


def test_what_is_logged_of_an_error_carries_no_value() -> None:
    """Logs and traces get where and which keyword; the model (re-ask) and the inspector get
    the validator's own words, the value included."""
    secret = "a value of the model"
    _, reports = guarded(frames_of([("call_1", "Read", [json.dumps(
        {"file_path": "/a", "offset": secret})])]), TOOLS)
    (report,) = reports
    assert report.outcome == "invalid"
    assert report.error == '$.offset: fails "type"'
    assert report.detail is not None and secret in report.detail
