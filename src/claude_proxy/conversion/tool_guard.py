"""The tool-call guard: between an upstream API's parser and the block machine, each tool
call is collected, closed, checked against the schema of the tool the request offered, and
sent as one piece (docs/tool-calls.md).

A call is closed when the upstream says so (a Messages `content_block_stop`, a Responses
`output_item.done`), at the upstream's finish reason, before any other content, or at the
end; not when another call starts, since parallel calls may come interleaved (and a call
whose text is whole JSON may still have a `<|call|>` or an echo to come). Then the wire shapes are
undone (S1 cumulative snapshots, S2 an echo of the whole arguments, S3 parallel calls collapsed
into one, each part valid; S5 the same call twice) and the repair ladder runs
(`OfferedTools.check`). What validates goes out (the original bytes when they were valid);
what does not goes out as the upstream sent it, so that the client's own error reaches the
model. Nothing is repaired in a call cut by the output limit.

The first call's block starts as soon as its name is an offered tool (Claude Code shows the
row; not while a reply is held to be asked again: `start_early`); later calls, and names R8
must resolve, start when they close, so that they can still be dropped, split or renamed.
Past `max_hold` characters a call streams as it comes, unchecked. `observe` changes nothing
and only reports what it found. Pure: the caller's `report` is told of every call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from claude_proxy.config.settings import GuardMode
from claude_proxy.conversion import tool_repair
from claude_proxy.conversion.deltas import Delta, Finish, Text, ToolCall, UpstreamFailure, Usage
from claude_proxy.conversion.tool_schemas import Check, OfferedTools

logger = logging.getLogger("claude_proxy.conversion")

HOLD_PING_SECONDS = 15.0
"""While a call is held and the upstream keeps sending, an event that adds nothing goes out
this often (`BlockMachine.keep_alive`; the stream's own `: ping` comment covers an upstream
gone quiet: docs/tool-calls.md)."""
DEFAULT_MAX_HOLD = 4 * 1024 * 1024


@dataclass(frozen=True)
class CallReport:
    """What the guard did with one upstream tool call: `outcome` is valid, repaired (or, in
    observe mode, repairable), invalid, unchecked, overflow or dropped; `original` its
    arguments as the upstream sent them; `sent` what went out instead (several for a split)
    when that differs; `name` the tool it went to when R8 renamed it. `error` says where
    and why the original fails without its values (logs, traces); `detail` with them."""

    tool: str
    outcome: str
    kinds: tuple[str, ...] = ()
    error: str | None = None
    original: str = ""
    sent: tuple[str, ...] = ()
    name: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "outcome": self.outcome, "kinds": list(self.kinds),
                "error": self.error, "detail": self.detail, "original": self.original,
                "sent": list(self.sent), "name": self.name}


Report = Callable[[CallReport], None]
Part = tuple[str, str]
"""One call to send: the tool's name and its argument text."""


@dataclass
class _Held:
    key: int
    upstream_id: str
    name: str
    fragments: list[str] = field(default_factory=list)
    size: int = 0
    snapshot: str = ""
    """S1: the latest fragment, while every fragment repeats the one before and goes on."""
    cumulative: bool = True
    started: bool = False
    """Its block's start has been sent (the name is an offered tool, and it came first)."""
    streaming: bool = False
    """Past the hold limit: its fragments go out as they come."""
    closed: bool = False
    """The upstream said it is complete."""

    def add(self, piece: str) -> None:
        if self.cumulative and self.fragments:
            if len(self.snapshot) >= 2 and piece.startswith(self.snapshot):
                self.snapshot = piece
            else:
                self.cumulative = False
        elif not self.fragments:
            self.snapshot = piece
        self.fragments.append(piece)
        self.size += len(piece)

    def text(self) -> str:
        return "".join(self.fragments)

    def snapshots(self) -> str | None:
        """The S1 reading (the last snapshot), when every fragment was one."""
        return self.snapshot if self.cumulative and len(self.fragments) >= 2 else None


class ToolGuard:
    """One response's tool calls, collected, checked and sent (see the module)."""

    def __init__(self, offered: OfferedTools, report: Report, *, mode: GuardMode = "repair",
                 max_hold: int = DEFAULT_MAX_HOLD) -> None:
        self.offered = offered
        self.report = report
        self.repairs = mode == "repair"
        self.start_early = True
        """The first call's block starts when its name is offered; else when it closes, as
        every later call's (a reply held to be asked again shows nothing)."""
        self.max_hold = max_hold
        self.held: dict[int, _Held] = {}
        """The calls collected now, by key, in the order they began."""
        self._done: set[int] = set()
        self._sent: list[tuple[str, str, str]] = []
        """(upstream id, name, argument text) of each call sent, for S5."""
        self._first_key: int | None = None
        self._truncated = False
        self._spare_key = -1
        self._behind: list[Delta] = []
        """Whitespace that came while calls were held: it goes out after them, as it came."""
        self._holding = 0
        """How many calls' arguments are held back from the client now."""

    def engaged(self, deltas: list[Delta]) -> bool:
        """Whether the guard has anything to do with these deltas: a call is held, or one
        begins (a text answer passes by at the cost of this test)."""
        return bool(self.held) or ToolCall in map(type, deltas)

    def holding(self) -> bool:
        """Whether arguments are held back from the client now."""
        return self._holding > 0

    def apply(self, deltas: list[Delta]) -> list[Delta]:
        """The deltas as the blocks are to get them (`engaged` says when they may differ)."""
        out: list[Delta] = []
        for delta in deltas:
            kind = type(delta)
            if kind is ToolCall:
                self._piece(delta, out)  # type: ignore[arg-type]
            elif kind is Text and delta.text.isspace():  # type: ignore[union-attr]
                (self._behind if self.held else out).append(delta)
            elif kind is Usage or kind is UpstreamFailure:
                out.append(delta)
            else:
                if isinstance(delta, Finish):
                    self._truncated = delta.stop_reason == "max_tokens"
                self._settle_all(out)  # other content, or the finish: every call is closed
                out.append(delta)
        return out

    def flush(self, *, failed: bool = False) -> list[Delta]:
        """The end of the answer (`failed`: it broke off, so its calls may be cut)."""
        out: list[Delta] = []
        self._truncated = self._truncated or failed
        self._settle_all(out)
        return out

    # ------------------------------------------------------------ collecting

    def _piece(self, piece: ToolCall, out: list[Delta]) -> None:
        held = self.held.get(piece.key)
        if held is not None and held.started and not (
                held.streaming or piece.id or piece.name or piece.last):
            if piece.arguments:  # the usual fragment: only kept
                held.add(piece.arguments)
                if held.size > self.max_hold:
                    self._overflow(held, out)
            return
        if held is None:
            if piece.key in self._done:
                self._late(piece, out)
                return
            held = self.held[piece.key] = _Held(piece.key, piece.id, piece.name)
            self._holding += self.repairs
            if self._first_key is None:
                self._first_key = piece.key
        else:
            held.upstream_id = held.upstream_id or piece.id
            held.name = held.name or piece.name
        if not self.repairs or held.streaming:
            out.append(piece)  # as it came: observed only, or past the hold limit
        elif not held.started and held.key == self._first_key and self.start_early and (
                self.offered.offers(held.name)):
            held.started = True
            out.append(ToolCall(held.key, id=held.upstream_id, name=held.name))
        if piece.arguments and not held.streaming:
            held.add(piece.arguments)
            if held.size > self.max_hold:
                self._overflow(held, out)
        if piece.last:
            held.closed = True
            self._settle_ready(out)

    def _overflow(self, held: _Held, out: list[Delta]) -> None:
        """Past the hold limit: what is held goes out, the rest as it comes, unchecked."""
        held.streaming = True
        self._holding -= self.repairs
        if self.repairs:
            start = ("", "") if held.started else (held.upstream_id, held.name)
            out.append(ToolCall(held.key, *start, arguments=held.text()))
        held.fragments, held.snapshot, held.cumulative = [], "", False

    def _late(self, piece: ToolCall, out: list[Delta]) -> None:
        """A piece of a call already sent (a second finish chunk repeating the arguments):
        observed, it goes on as before; held back, nothing can be added any more."""
        if not self.repairs:
            out.append(piece)
        elif piece.arguments.strip():
            logger.info("a piece of tool call %s came after the call was sent (%d characters):"
                        " left out", piece.key, len(piece.arguments))

    # ------------------------------------------------------------ closing

    def _settle_ready(self, out: list[Delta]) -> None:
        """The calls that are closed, in the order they began (a later call never goes
        before an earlier one that is still open)."""
        for held in list(self.held.values()):
            if not held.closed:
                return
            self._settle(held, out)
        self._release(out)

    def _settle_all(self, out: list[Delta]) -> None:
        for held in list(self.held.values()):
            self._settle(held, out)
        self._release(out)

    def _release(self, out: list[Delta]) -> None:
        if not self.held and self._behind:
            out.extend(self._behind)
            self._behind = []

    def _settle(self, held: _Held, out: list[Delta]) -> None:
        del self.held[held.key]
        self._done.add(held.key)
        self._holding -= self.repairs and not held.streaming
        if held.streaming:
            if self.repairs:
                out.append(ToolCall(held.key, last=True))
            self.report(CallReport(held.name, "overflow", error="held past the limit"))
            return
        text = held.text()
        try:
            parts, report = self._verdict(held, text)
        except Exception:  # the guard never breaks an answer: it goes as it came
            logger.exception("the tool-call guard failed on a call of %r", held.name)
            parts, report = [(held.name, text)], CallReport(held.name, "unchecked",
                                                           error="guard failed",
                                                           original=text)
        if self.repairs:
            parts, report = self._deduplicated(held, parts, report)
            self._send(held, parts, out)
        elif report.outcome == "repaired":
            report = replace(report, outcome="repairable")
        self.report(report)

    def _send(self, held: _Held, parts: list[Part], out: list[Delta]) -> None:
        for position, (name, arguments) in enumerate(parts):
            if position == 0 and held.started:
                out.append(ToolCall(held.key, arguments=arguments, last=True))
                continue
            key, upstream_id = (held.key, held.upstream_id) if position == 0 else (
                self._spare_key, "")
            if position:
                self._spare_key -= 1
            out.append(ToolCall(key, id=upstream_id, name=name, arguments=arguments,
                                last=True))

    def _deduplicated(self, held: _Held, parts: list[Part],
                      report: CallReport) -> tuple[list[Part], CallReport]:
        """S5: a call the upstream sent before, under the same id, is dropped; the same id
        with other arguments gets a new one."""
        if not parts or held.started or not held.upstream_id:
            self._remember(held, parts)
            return parts, report
        name, arguments = parts[0]
        same_id = [sent for sent in self._sent if sent[0] == held.upstream_id]
        if any(sent[1] == name and _value(sent[2]) == _value(arguments) for sent in same_id):
            return [], CallReport(held.name, "dropped", ("S5:duplicate",),
                                  original=held.text())
        self._remember(held, parts)
        if same_id:
            held.upstream_id = ""
            outcome = "repaired" if report.outcome == "valid" else report.outcome
            return parts, replace(report, outcome=outcome, kinds=(*report.kinds, "S5:new_id"))
        return parts, report

    def _remember(self, held: _Held, parts: list[Part]) -> None:
        self._sent.extend((held.upstream_id, name, arguments) for name, arguments in parts)

    # ------------------------------------------------------------ the verdict

    def _verdict(self, held: _Held, text: str) -> tuple[list[Part], CallReport]:
        """What to send for one closed call, and what to say of it."""
        name, truncated = held.name, self._truncated
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        else:
            return self._from_check(self.offered.check_value(name, value, truncated=truncated),
                                    text, tool=name)
        if not truncated:
            values = tool_repair.json_values(text)
            found = self._collapsed(name, values, text) if values else None
            snapshot = held.snapshots()
            if found is None and snapshot is not None:
                check = self.offered.check(name, snapshot)
                if check.passes:
                    found = self._from_check(check, snapshot, text, ("S1:snapshots",), tool=name)
            if found is not None:
                return found
        return self._from_check(self.offered.check(name, text, truncated=truncated), text,
                                tool=name)

    def _collapsed(self, name: str, values: list[tuple[Any, str]],
                   text: str) -> tuple[list[Part], CallReport] | None:
        """S2/S3: several whole objects in one call's text. The same one repeated is one call;
        different ones are a call each, only when every one of them validates."""
        first, first_text = values[0]
        if all(value == first for value, _ in values):
            check = self.offered.check_value(name, first)
            return self._from_check(check, first_text, text, ("S2:echo",), tool=name) if (
                check.passes) else None
        checks = [(self.offered.check_value(name, value), raw) for value, raw in values]
        if not all(check.passes for check, _ in checks):
            return None
        parts = [_part(check, raw) for check, raw in checks]
        kinds = ("S3:split", *(kind for check, _ in checks for kind in check.kinds))
        return parts, CallReport(name, "repaired", kinds, original=text,
                                 sent=tuple(arguments for _, arguments in parts))

    @staticmethod
    def _from_check(check: Check, text: str, original: str | None = None,
                    kinds: tuple[str, ...] = (), *, tool: str | None = None,
                    ) -> tuple[list[Part], CallReport]:
        """The call to send for a check of `text` (the whole original when `original` is
        None; else a reading of it, which a wire-shape fix `kinds` chose). `tool`: the name
        as the upstream sent it (R8 may have resolved another)."""
        original = text if original is None else original
        tool = check.name if tool is None else tool
        if not check.passes:
            return [(tool, original)], CallReport(tool, check.outcome, check.kinds,
                                                  check.error, original, detail=check.detail)
        part = _part(check, text)
        kinds = (*kinds, *check.kinds)
        if not kinds:
            return [part], CallReport(tool, "valid", original=original)
        return [part], CallReport(tool, "repaired", kinds, original=original,
                                  sent=(part[1],),
                                  name=check.name if check.name != tool else None)


def _part(check: Check, text: str) -> Part:
    """The name and text to send for a check that passed: the text as it came when only the
    name changed (or nothing did), else the repaired value as JSON."""
    if all(kind == "R8:name" for kind in check.kinds):
        return check.name, text
    return check.name, orjson.dumps(check.value).decode()


def _value(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


REASK_SHOWN = 2048
"""How much of a call the upstream sent is quoted back to it (as Claude Code quotes it)."""


def reask_body(body: dict[str, Any], message: dict[str, Any],
               calls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """TOOL_GUARD_REASK: the request that asks the upstream once more, when every tool call
    of a whole reply was invalid and nothing could repair it (`calls`: what the guard said of
    them, in order): the reply, then each call's validation error as its result, in Claude
    Code's words. None when the reply is anything else (a call cut by the output limit is
    not asked again with the same limit)."""
    uses = [block for block in message.get("content") or [] if block.get("type") == "tool_use"]
    if not uses or len(calls) != len(uses) or message.get("stop_reason") == "max_tokens" or any(
            call["outcome"] != "invalid" or "truncated" in call["kinds"] for call in calls):
        return None
    results = [{"type": "tool_result", "tool_use_id": use["id"], "is_error": True,
                "content": f"<tool_use_error>InputValidationError: {use['name']} failed due to "
                           f"the following issue: {call['detail'] or call['error']}\nYou sent: "
                           f"{call['original'][:REASK_SHOWN]}</tool_use_error>"}
               for use, call in zip(uses, calls, strict=True)]
    return {**body, "messages": [*body["messages"],
                                 {"role": "assistant", "content": message["content"]},
                                 {"role": "user", "content": results}]}
