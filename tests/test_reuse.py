"""A session's next turn converted and written only where it changed (conversion/reuse.py).

The reuse must give the very bytes a whole conversion gives: two real proxies, one with the
session memo and one without (`SESSION_MEMO_BYTES=0`), get the same requests, and the
upstream must receive the same bytes from both, request by request. Checked on Claude Code's
recorded tool loop for every kind of upstream the conversion treats differently, and on
generated sessions: turns added, messages edited, reordered and taken back, images, a
mid-conversation system message, thinking of the proxy's own and of another, a switch of
provider, a failover to another provider, and refusals learned mid-session.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from bench.conversation import read_turn, session_turns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from claude_proxy.config.file import load_config_file
from claude_proxy.config.settings import ProviderSettings, Settings
from claude_proxy.conversion import reuse
from claude_proxy.conversion.census import checked
from claude_proxy.conversion.reasoning import tool_call_extra
from claude_proxy.conversion.request_converter import convert_request
from claude_proxy.conversion.reuse import MOST_PIECES, Converted, Slot, Spliced
from claude_proxy.conversion.signatures import Origin, ThinkingSigner
from claude_proxy.server.app import create_app
from claude_proxy.server.incremental import SessionBodies
from claude_proxy.server.requests import ROLES
from claude_proxy.upstream.client import encoded
from tests.conftest import UPSTREAM_KEY, ProxyServer, eventually, serving
from tests.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    bind_loopback,
    error_reply,
    serve_in_thread,
    stop_server,
)

SESSION = "x-claude-code-session-id"
FIXTURES = Path(__file__).parent / "data" / "fixtures"
TOOL_LOOP = orjson.loads((FIXTURES / "claude-code-2.1.332-tool-loop-second-request.json")
                         .read_bytes())["body"]
RECORDED = orjson.loads((FIXTURES / "claude-code-2.1.328-session-10-turns.json").read_bytes())

PROVIDERS = {
    # name: (profile, model): every way the conversion differs after converting a message
    "seek": ("deepseek", "deepseek-v4-pro"),  # reasoning_content given back, automatic cache
    "route": ("openrouter", "anthropic/claude-sonnet-4.5"),  # breakpoints, opaque details
    "gem": ("gemini", "gemini-3.8-flash"),  # skipped thought signatures on tool calls
    "mini": ("minimax", "MiniMax-M3"),  # reasoning_details given back
    "qwen": ("dashscope", "qwen3.8-max"),  # breakpoints
}
ROUTES = {"claude-opus-5-5": ("seek", "deepseek-v4-pro"),
          **{f"{name},{model}": (name, model) for name, (_, model) in PROVIDERS.items()},
          "route,google/gemini-2.5-pro": ("route", "google/gemini-2.5-pro")}
"""The model a request names → the provider and upstream model it goes to."""
MODELS = list(ROUTES)


@dataclass
class Script:
    """What the upstream does to the next requests (both proxies get the same)."""

    failing: bool = False
    """DeepSeek answers 503: the request fails over to OpenRouter."""
    refusing: set[str] = field(default_factory=set)
    """Fields answered with a 400 naming them while a request carries them."""

    def reply(self, body: dict[str, Any]) -> Reply | None:
        if self.failing and body["model"].startswith("deepseek"):
            return error_reply(503, "overloaded")
        text = orjson.dumps(body).decode()
        if "cache_control" in self.refusing and '"cache_control"' in text:
            return error_reply(400, "messages.1.content.0.cache_control: Extra inputs are "
                                    "not permitted")
        for name in ("thinking", "reasoning_content"):
            if name in self.refusing and f'"{name}"' in text:
                return error_reply(400, f"Unrecognized request argument supplied: {name}")
        return None


@dataclass
class Pair:
    """Two proxies in front of one upstream, the same but for the session memo."""

    upstream: ScriptedUpstream
    kept: ProxyServer
    whole: ProxyServer
    script: Script

    def send(self, body: dict[str, Any], session: str) -> list[bytes]:
        """The body to both; what the upstream received from each must be the same bytes
        (and so must the answers). Returns what it received."""
        raw = orjson.dumps(body)
        received, answers = [], []
        for proxy in (self.kept, self.whole):
            self.upstream.raw.clear()
            answer = httpx.post(f"{proxy.url}/v1/messages", content=raw, timeout=30,
                                headers={"content-type": "application/json", SESSION: session})
            answers.append((answer.status_code, _content(answer)))
            received.append(list(self.upstream.raw))
        assert answers[0] == answers[1] and answers[0][0] == 200, answers[0]
        assert received[0] == received[1]
        return received[0]

    def last_conversion(self, session: str) -> Converted | None:
        kept = self.kept.app.state.wiring.bodies.get(f"-\n{session}")
        return kept.bodies[0].turns.last if kept is not None and kept.bodies else None

    def forget(self) -> None:
        """Each example starts with nothing refused and a healthy DeepSeek."""
        self.script.failing, self.script.refusing = False, set()
        for proxy in (self.kept, self.whole):
            for provider in proxy.app.state.wiring.service.providers.values():
                for model in {model for name, model in _routes() if name == provider.name}:
                    for refused in ("cache_control", "reasoning"):
                        provider.refusals.store.delete(
                            f"refusal:{provider.name}:{model}:{refused}")


def _routes() -> list[tuple[str, str]]:
    return [(name, model) for name, (_, model) in PROVIDERS.items()] + [
        ("route", "google/gemini-2.5-pro")]


def _content(answer: httpx.Response) -> Any:
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return [line for line in answer.text.splitlines() if '"text_delta"' in line]
    body = answer.json()
    return body.get("content", body)


def _config(url: str) -> str:
    tables = "".join(
        f'[providers.{name}]\nopenai_base_url = "{url}"\nopenai_api_key = "{UPSTREAM_KEY}"\n'
        f'provider = "{profile}"\nbig_model = "{model}"\nmiddle_model = "{model}"\n'
        f'small_model = "{model}"\nretry_base_delay = 0\nmax_retries = 0\n'
        f"context_window = 1000000\nvision = {'false' if name == 'seek' else 'true'}\n\n"
        for name, (profile, model) in PROVIDERS.items())
    return tables + ('[router]\ndefault = "seek,deepseek-v4-pro"\n'
                     'fallback = ["route,anthropic/claude-sonnet-4.5"]\n'
                     "cooldown_failures = 1000000\n")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    upstream = ScriptedUpstream().start()
    script = Script()
    upstream.responder = script.reply
    folder = tmp_path_factory.mktemp("reuse")
    path = folder / "proxy.toml"
    path.write_text(_config(upstream.base_url))
    started = []
    for memo in (64 << 20, 0):
        settings = Settings(log_file=str(folder / "proxy.log"), session_memo_bytes=memo,
                            thinking_signature_secret="s" * 32)
        app = create_app(settings, config=load_config_file(path, settings))
        sock = bind_loopback()
        server, thread = serve_in_thread(app, sock)
        proxy = ProxyServer(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, server,
                            app, thread)
        assert eventually(partial(serving, proxy.url))
        started.append(proxy)
    yield Pair(upstream, started[0], started[1], script)
    for proxy in started:
        proxy.server.should_exit = True
        stop_server(proxy.server, proxy.thread)
    upstream.stop()


# ---------------------------------------------------------------- Claude Code's sessions


@pytest.mark.parametrize("model", MODELS)
def test_claude_codes_recorded_session_goes_upstream_as_without_the_memo(
        pair: Pair, model: str) -> None:
    """The ten turns Claude Code 2.1.328 sent in one session (nine tool calls, and the
    system message it sends mid-conversation), each through both proxies to each kind of
    upstream; from the second on, the converted messages of the turn before are reused."""
    pair.forget()
    session = f"recorded-{uuid.uuid4()}"
    reused = 0
    for turn in RECORDED["turns"]:
        before = pair.last_conversion(session)
        pair.send({**turn["body"], "model": model}, session)
        after = pair.last_conversion(session)
        assert after is not None and after.written is not None
        reused += _reused(before, after)
    assert reused >= 8


def _reused(before: Converted | None, after: Converted | None) -> int:
    """1 when `after` took converted messages from `before` (the very objects), else 0."""
    return int(before is not None and after is not None and bool(after.messages)
               and bool(before.messages) and after.messages[0] is before.messages[0])


@pytest.mark.parametrize(("stream", "most_pieces"), [(False, MOST_PIECES), (True, MOST_PIECES),
                                                    (False, 1)])
def test_a_long_tool_loop_reuses_all_but_the_last_turn(
        pair: Pair, stream: bool, most_pieces: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded request grown by Read turns (the bench's session): each next turn
    reuses every converted message but those of the last message (its marker moved), and
    what is written is the whole conversion's bytes (also when the shared prefix's pieces
    are joined, as they are once they are many: `most_pieces` 1)."""
    monkeypatch.setattr(reuse, "MOST_PIECES", most_pieces)
    pair.forget()
    session = f"grown-{uuid.uuid4()}"
    previous: Converted | None = None
    for raw in session_turns(70, 4, "Go on.", stream):
        pair.send(orjson.loads(raw), session)
        converted = pair.last_conversion(session)
        assert converted is not None and converted.written is not None
        if previous is not None:
            shared = len(previous.sources) - 1
            assert all(converted.sources[index] is previous.sources[index]
                       for index in range(shared))
            assert _reused(previous, converted)
            assert converted.messages[:previous.ends[shared - 1]] == \
                previous.messages[:previous.ends[shared - 1]]
        _written_as_converted(converted)
        previous = converted


@given(st.lists(st.binary(max_size=6), max_size=6), st.integers(0, 40), st.integers(0, 40))
def test_a_spliced_bodys_cut_is_the_bytes_between(pieces: list[bytes], start: int,
                                                  end: int) -> None:
    """`Spliced.cut` gives the very bytes the joined body has between two offsets, from
    pieces that are bytes or views, whole or cut."""
    spliced = Spliced([piece if index % 2 else memoryview(piece)
                       for index, piece in enumerate(pieces)], sum(map(len, pieces)))
    whole = bytes(spliced)
    assert whole == b"".join(pieces) and len(spliced) == len(whole)
    assert b"".join(spliced.cut(start, end)) == whole[start:end]


def _written_as_converted(converted: Converted) -> None:
    """Every kept converted message still is what its bytes say (nothing changed one in
    place after it was written)."""
    written = converted.written
    assert written is not None
    json = bytes(written.json)
    assert len(json) == len(written.json)
    at = written.start
    for index, end in enumerate(written.ends):
        first = converted.ends[index - 1] if index else 0
        pieces = [b"," + orjson.dumps(message)
                  for message in converted.messages[first:converted.ends[index]]]
        assert json[at:end] == b"".join(pieces)
        at = end


# ---------------------------------------------------------------- generated sessions

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
               min_size=1, max_size=40)


SIGNER = ThinkingSigner("s" * 32)
"""The proxies' own signer (the same secret)."""


@st.composite
def thinking(draw: st.DrawFn, call_id: str, model: str) -> dict[str, Any] | None:
    """A thinking block: none, the proxy's own plain one (an empty signature), another's, one
    the proxy signed with opaque reasoning and a tool call's extra for a provider (mostly
    the one `model` goes to), or one the client was shown empty (`display: "omitted"`)."""
    kind = draw(st.sampled_from([None, "plain", "foreign", "opaque", "opaque", "hidden"]))
    text = draw(TEXT)
    if kind is None:
        return None
    if kind in ("plain", "foreign"):
        return {"type": "thinking", "thinking": text,
                "signature": "" if kind == "plain" else "foreign-signature"}
    provider, upstream_model = ROUTES[draw(st.sampled_from([model] * len(MODELS) + MODELS))]
    origin = Origin(provider, upstream_model, SIGNER.key_fingerprint(UPSTREAM_KEY))
    if kind == "hidden":
        return {"type": "thinking", "thinking": "",
                "signature": SIGNER.sign(text, origin=origin, hidden=True)}
    opaque = [{"type": "reasoning.encrypted", "data": text, "index": 0},
              tool_call_extra(call_id, {"google": {"thought_signature": text}})]
    return {"type": "thinking", "thinking": text,
            "signature": SIGNER.sign(text, opaque, origin=origin)}


@st.composite
def turns(draw: st.DrawFn, number: int, model: str) -> list[dict[str, Any]]:
    """A tool turn as Claude Code sends it, sometimes with thinking (`thinking`), a second
    text, or an image in the result."""
    assistant, user = read_turn(number)
    block = draw(thinking(assistant["content"][1]["id"], model))
    if block is not None:
        assistant["content"].insert(0, block)
    if draw(st.booleans()):
        user["content"].append({"type": "text", "text": draw(TEXT)})
    extra = draw(st.sampled_from([None, None, None, "image", "search", "reference"]))
    if extra == "image":
        user["content"][0]["content"] = [
            {"type": "text", "text": draw(TEXT)},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]
    elif extra == "search":  # a web search of an earlier turn, replayed as text
        found = f"srvtoolu_{number:05d}"
        assistant["content"][-1:-1] = [
            {"type": "server_tool_use", "id": found, "name": "web_search",
             "input": {"query": draw(TEXT)}},
            {"type": "web_search_tool_result", "tool_use_id": found, "content": [
                {"type": "web_search_result", "url": "https://example.com/", "title": "Ex",
                 "encrypted_content": "zz"}]}]
    elif extra == "reference":  # a tool loaded by tool search, expanded
        user["content"][0]["content"] = [{"type": "tool_reference", "tool_name": "Read"}]
    return [assistant, user]


STEPS = st.sampled_from(["turn"] * 8 + ["edit", "swap", "rewind", "reminder", "pin",
                         "switch", "fail", "refuse cache_control", "refuse thinking",
                         "refuse reasoning_content", "stream", "clear"])
CLEAR_TOOL_USES = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses",
                                                                   "value": 2},
                   "keep": {"type": "tool_uses", "value": 1}}
PINNED = "pinned"
"""A marker that stays where it was put (`_move_marker` moves only the others)."""


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_session_goes_upstream_as_without_the_memo(pair: Pair, data: st.DataObject) -> None:
    """Generated sessions: whatever each step does to the conversation or to the upstream,
    the upstream receives from the proxy with the memo the bytes it receives without."""
    pair.forget()
    session = f"generated-{uuid.uuid4()}"
    body = orjson.loads(orjson.dumps(TOOL_LOOP))
    body["model"] = data.draw(st.sampled_from(MODELS))
    for number in range(data.draw(st.integers(3, 7))):
        step = data.draw(STEPS)
        messages = body["messages"]
        _apply(step, data, body, messages, number, pair.script)
        _move_marker(messages)
        pair.send(body, session)
        pair.script.failing = False


def _apply(step: str, data: st.DataObject, body: dict[str, Any], messages: list[Any],
           number: int, script: Script) -> None:
    if step == "turn":
        messages += data.draw(turns(number, body["model"]))
    elif step == "edit":
        at = data.draw(st.integers(0, len(messages) - 1))
        messages[at] = {**messages[at], "content": data.draw(TEXT)}
    elif step == "swap" and len(messages) > 2:
        first, second = data.draw(st.lists(st.integers(0, len(messages) - 1), min_size=2,
                                           max_size=2, unique=True))
        messages[first], messages[second] = messages[second], messages[first]
    elif step == "rewind" and len(messages) > 3:
        del messages[data.draw(st.integers(3, len(messages) - 1)):]
    elif step == "reminder":
        messages.append({"role": "system", "content": data.draw(TEXT)})
        messages.append({"role": "user", "content": data.draw(TEXT)})
    elif step == "switch":
        body["model"] = data.draw(st.sampled_from(MODELS))
    elif step == "fail":
        script.failing = True
    elif step.startswith("refuse"):
        script.refusing.add(step.split()[1])
    elif step == "stream":
        body["stream"] = not body.get("stream")
    elif step == "clear":  # context management clears all tool results but the last
        edits = body["context_management"]["edits"]
        body["context_management"] = {"edits": edits[:1] if len(edits) > 1
                                      else [*edits, CLEAR_TOOL_USES]}
    elif step == "pin":
        at = data.draw(st.integers(0, len(messages) - 1))
        content = messages[at]["content"]
        if isinstance(content, list):
            messages[at] = {**messages[at], "content": [*content[:-1], {
                **content[-1], "cache_control": {"type": "ephemeral", "ttl": PINNED}}]}


def _move_marker(messages: list[Any]) -> None:
    """Claude Code's marker: on the last block of the last message only."""
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list) and any(_moving(block) for block in content):
            messages[index] = {**message, "content": [
                {key: value for key, value in block.items() if key != "cache_control"}
                if _moving(block) else block for block in content]}
    last = messages[-1]
    if isinstance(last.get("content"), list) and last["content"]:
        blocks = [*last["content"]]
        blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
        messages[-1] = {**last, "content": blocks}


def _moving(block: dict[str, Any]) -> bool:
    marker = block.get("cache_control")
    return isinstance(marker, dict) and marker.get("ttl") != PINNED


# ---------------------------------------------------------------- what the log and refusals see


@pytest.mark.parametrize("provider", ["gem", "seek", "mini", "route"])
def test_the_reasoning_fields_said_added_are_a_whole_conversions(provider: str) -> None:
    """The fields the proxy says it added (which a refusal is matched against, and the
    inspector shows) count the reasoning given back on reused messages too: a turn signed
    with opaque reasoning, then turns after it, converted with the slot and whole."""
    profile, model = PROVIDERS[provider]
    settings = ProviderSettings(openai_api_key=UPSTREAM_KEY, provider=profile)
    origin = Origin(provider, model, SIGNER.key_fingerprint(UPSTREAM_KEY))

    def opaque_for(block: dict[str, Any]) -> list[dict[str, Any]]:
        envelope = SIGNER.verify(block["thinking"], block["signature"])
        return envelope.opaque if envelope is not None and envelope.origin == origin else []

    def converted(body: dict[str, Any], slot: Slot | None) -> tuple[bytes, dict[str, Any]]:
        body["messages"] = checked(body["messages"], ROLES)
        upstream = convert_request(body, settings, model=model, is_ours=lambda block: True,
                                   opaque_for=opaque_for, slot=slot)
        return bytes(encoded(upstream.body)), upstream.extras

    bodies = SessionBodies()
    request = {key: value for key, value in TOOL_LOOP.items() if key != "thinking"}
    request["messages"] = [*request["messages"]]
    for number in range(4):
        turn = read_turn(number)
        if not number:
            call = turn[0]["content"][1]["id"]
            opaque = [{"type": "reasoning.encrypted", "data": "e", "index": 0},
                      tool_call_extra(call, {"google": {"thought_signature": "t"}})]
            turn[0]["content"].insert(0, {"type": "thinking", "thinking": "Read it.",
                                          "signature": SIGNER.sign("Read it.", opaque,
                                                                   origin=origin)})
        request["messages"] += turn
        _move_marker(request["messages"])
        raw = orjson.dumps(request)
        before = bodies.bodies[0].turns.last if bodies.bodies else None
        body, parsed = bodies.parse(raw)
        assert parsed is not None
        assert converted(body, parsed.turns) == converted(orjson.loads(raw), None)
        assert not number or _reused(before, parsed.turns.last)
