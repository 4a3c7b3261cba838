"""How large each Claude Code session's last turn really was (for the long_context rule).

Keyed by the `x-claude-code-session-id` header; bounded (least recently used dropped), per
process, in memory only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

SESSION_HEADER = "x-claude-code-session-id"


class SessionSizes:
    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = capacity
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def previous(self, session: str | None) -> int | None:
        if not session:
            return None
        return self._sizes.get(session)

    def remember(self, session: str | None, input_tokens: int) -> None:
        if not session or input_tokens <= 0:
            return
        with self._lock:
            self._sizes[session] = input_tokens
            self._sizes.move_to_end(session)
            while len(self._sizes) > self.capacity:
                self._sizes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._sizes)
