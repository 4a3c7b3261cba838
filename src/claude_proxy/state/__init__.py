"""What the proxy learns at run time, in one place: in-process by default, shared through
Redis across workers and replicas when REDIS_URL is set (see store.py)."""

from __future__ import annotations

from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import Record, StateStore


def open_store(redis_url: str | None, prefix: str = "claude-proxy:",
               timeout: float = 0.1) -> StateStore:
    """The process's store: RedisStore for a REDIS_URL (redis is imported only then), else
    the in-process LocalStore."""
    if not redis_url:
        return LocalStore()
    from claude_proxy.state.redis import RedisStore
    return RedisStore(redis_url, prefix, timeout)


async def check_store(redis_url: str, prefix: str, timeout: float) -> tuple[bool, str]:
    """Whether the shared store works, in words for `doctor` (without the password)."""
    from claude_proxy.state.redis import check_connection
    return await check_connection(redis_url, prefix, timeout)


async def check_durability(redis_url: str, timeout: float) -> Record | None:
    """What Redis says of keeping spend across a restart, for `doctor` (None: no answer)."""
    from claude_proxy.state.redis import read_durability
    return await read_durability(redis_url, timeout)
