"""Per-session calibration of the input estimate, kept in the state store.

The proxy cannot tokenize like every upstream, but the upstream tells it, after each turn, how
many prompt tokens that turn really was. Kept per Claude Code session (`x-claude-code-session-id`)
and upstream model: {reported, estimate_then}. The next turn's input is then
`reported + (estimate_now - estimate_then) × ratio`, where `ratio = reported / estimate_then`
corrects the estimate of what is new by what the estimator got wrong last time. Between turns
Claude Code moves `cache_control` markers and turns string content into text parts, so "what is
new" cannot be a byte-prefix match; the difference of two estimates of the whole conversation
is robust to that. Once two turns are known, what is new is corrected by the ratio of the last
growth instead (`marginal`: reported growth / estimated growth): the system prompt and tools
that dominate the whole-conversation ratio say little about tool output (numbers, code, CJK
text), which is what a session grows by. Measured with real Claude Code on a 64k window
(tests/test_claude_code_windows.py): the whole ratio let a 68k request through as 64k; the
marginal one is exact there. A conversation that shrank (Claude Code compacted it) is scaled
by the whole ratio alone. Without a record: the plain estimate.

Claude Code's side requests in the same session (title, compaction, subagents) are other
conversations: they have their own system prompt, so the record is kept per system prompt too
(`thread`, a digest of its text without the billing header, which varies per request), and a
side request neither uses nor disturbs the main conversation's record.

The record goes through the state store (MessagesService.store) so that every worker and
replica calibrates from the same turn.
"""

from __future__ import annotations

import hashlib
from typing import Any

from claude_proxy.state.store import StateStore

KEY_PREFIX = "calibration:"
TTL_SECONDS = 6 * 3600.0
"""A session idle this long starts again from the plain estimate."""
RATIO_BOUNDS = (0.25, 4.0)
"""Tokenizers differ from four characters a token by less than a factor of four (digits and
CJK text are the far end); a ratio outside that is a sign the record does not describe this
conversation."""


BILLING_HEADER = "x-anthropic-billing-header"


def thread(body: dict[str, Any] | None) -> str:
    """Which conversation of a session a request continues: a digest of its system prompt
    (Claude Code's per-request billing header left out)."""
    system = (body or {}).get("system")
    blocks = [system] if isinstance(system, str) else system if isinstance(system, list) else []
    texts = [str(block.get("text", "")) if isinstance(block, dict) else str(block)
             for block in blocks]
    # Claude Code's header is a block of its own: left out whole, the prompt (tens of KB)
    # is not split into lines, which every request paid for twice.
    text = "\n".join(text for text in texts
                     if not (text.startswith(BILLING_HEADER) and "\n" not in text))
    if BILLING_HEADER in text:
        text = "\n".join(line for line in text.split("\n")
                         if not line.startswith(BILLING_HEADER))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key(session: str, provider: str, model: str, conversation: str) -> str:
    return f"{KEY_PREFIX}{session}:{conversation}:{provider}:{model}"


def recorded(store: StateStore, session: str | None, provider: str, model: str,
             conversation: str = "") -> bool:
    """Whether the upstream has measured a turn of this conversation (calibration applies)."""
    return bool(session) and store.get(_key(str(session), provider, model,
                                            conversation)) is not None


def calibrated(store: StateStore, session: str | None, provider: str, model: str,
               estimate: int, conversation: str = "") -> int:
    """The estimate corrected by what the upstream reported for this conversation's last
    turn (`conversation`: its `thread`)."""
    if not session:
        return estimate
    record = store.get(_key(session, provider, model, conversation))
    if record is None:
        return estimate
    reported, then = int(record.get("reported", 0)), int(record.get("estimate", 0))
    if reported <= 0 or then <= 0:
        return estimate
    whole = _bounded(reported / then)
    if estimate >= then:
        growth = _bounded(float(record.get("marginal") or whole))
        return reported + round((estimate - then) * growth)
    return round(estimate * whole)


def remember(store: StateStore, session: str | None, provider: str, model: str,
             reported: int, estimate: int, conversation: str = "") -> None:
    """What this turn's upstream reported, beside the estimate made for it."""
    if not session or reported <= 0 or estimate <= 0:
        return
    key = _key(session, provider, model, conversation)
    record: dict[str, float] = {"reported": reported, "estimate": estimate}
    previous = store.get(key)
    if previous is not None:
        grew, estimated = reported - int(previous["reported"]), estimate - int(previous["estimate"])
        if grew > 0 and estimated > 0:
            record["marginal"] = grew / estimated
        elif previous.get("marginal") and estimated >= 0:
            record["marginal"] = float(previous["marginal"])
    store.put(key, record, ttl=TTL_SECONDS)


def _bounded(ratio: float) -> float:
    low, high = RATIO_BOUNDS
    return min(max(ratio, low), high)
