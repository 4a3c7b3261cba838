"""How large each Claude Code session's last turn really was (for the long_context rule).

Keyed by the `x-claude-code-session-id` header and kept in the state store (state/) for
SESSION_TTL after the session's last turn, so a session that lands on another worker or
replica keeps its size when the store is shared.
"""

from __future__ import annotations

from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import StateStore

SESSION_HEADER = "x-claude-code-session-id"
SESSION_TTL = 6 * 3600.0
"""A session idle longer than this starts again from its estimate."""


class SessionSizes:
    def __init__(self, store: StateStore | None = None, ttl: float = SESSION_TTL) -> None:
        self.store = store or LocalStore()
        self.ttl = ttl

    @staticmethod
    def key(session: str) -> str:
        return f"session:{session}:size"

    def previous(self, session: str | None) -> int | None:
        """The last turn's input, from this process's copy."""
        if not session:
            return None
        return _size(self.store.get(self.key(session)))

    async def recall(self, session: str | None) -> int | None:
        """`previous`, asking the shared store when this process has no fresh copy (the
        session's first turn here)."""
        if not session:
            return None
        return _size(await self.store.fetch(self.key(session)))

    def remember(self, session: str | None, input_tokens: int) -> None:
        if not session or input_tokens <= 0:
            return
        self.store.put(self.key(session), {"input_tokens": input_tokens}, ttl=self.ttl)


def _size(record: dict[str, object] | None) -> int | None:
    value = record.get("input_tokens") if record else None
    return value if isinstance(value, int) else None
