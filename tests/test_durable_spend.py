"""Money that survives: when keys have budgets the proxy reads what Redis keeps across a
restart (INFO persistence and memory), and says it loudly when spend would be lost — at start
(a WARNING), in /health?detail=1 and in `doctor`; with the shipped settings (read from
docker-compose.yml and deploy/kubernetes.yaml) it says where spend is kept. Without Redis, the
usage file. (That the shipped settings keep every key's spend across a Redis restart is the
soak's: tests/soak.py.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from claude_proxy.config.key_specs import digest_of
from tests.conftest import RedisServer, clean_env, free_port
from tests.test_docker import shipped_redis_arguments

ADMIN = "sk-durable-admin-0123456789"
KEY = "sk-durable-ana-0123456789"
Started = Callable[..., tuple[str, subprocess.Popen[str]]]
NO_PERSISTENCE = ("spend will be lost when Redis restarts: it keeps none (run it with "
                  "--appendonly yes)")
EVICTION = ("spend counters can be evicted: maxmemory-policy allkeys-lru evicts keys once its "
            "maxmemory (67108864 bytes) is full (run it with --maxmemory-policy noeviction)")
CASES = {
    "no persistence": (("--save", "", "--appendonly", "no"), NO_PERSISTENCE),
    "evicting": (("--save", "", "--appendonly", "yes", "--maxmemory", "64mb",
                  "--maxmemory-policy", "allkeys-lru"), EVICTION),
    "shipped": (tuple(shipped_redis_arguments()["compose"]), None),
}


def config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(f"""
[providers.alpha]
openai_base_url = "http://127.0.0.1:9/v1"
openai_api_key = "sk-durable-upstream-0123456789"
provider = "openai"
big_model = "alpha-model"
middle_model = "alpha-model"
small_model = "alpha-model"
price_input = 1
price_output = 1

[keys.ana]
key_sha256 = "{digest_of(KEY).hex()}"
budget_usd = 5
""")
    return path


@pytest.fixture
def redis_with(tmp_path: Path) -> Iterator[Callable[[tuple[str, ...]], RedisServer]]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make redis)")
    servers: list[RedisServer] = []

    def start(arguments: tuple[str, ...]) -> RedisServer:
        folder = tmp_path / f"redis-{len(servers)}"
        folder.mkdir()
        servers.append(RedisServer(free_port(), folder, arguments=arguments).start())
        return servers[-1]

    yield start
    for server in servers:
        server.kill()


@pytest.mark.parametrize("case", list(CASES))
def test_keys_with_budgets_say_whether_redis_keeps_their_spend(
        tmp_path: Path, started: Started, redis_with: Callable[[tuple[str, ...]], RedisServer],
        case: str) -> None:
    arguments, problem = CASES[case]
    redis = redis_with(arguments)
    url_text = f"redis://127.0.0.1:{redis.port}/0"
    env = clean_env(tmp_path, ANTHROPIC_API_KEY=ADMIN, REDIS_URL=redis.url,
                    REDIS_PREFIX="durable:", REDIS_TIMEOUT="1")
    proxy_url, process = started("--config", str(config(tmp_path)), env=env)
    detail = httpx.get(f"{proxy_url}/health?detail=1", headers={"x-api-key": ADMIN},
                       timeout=10).json()["spend"]
    doctor = subprocess.run([sys.executable, "-m", "claude_proxy", "doctor", "--config",
                             str(config(tmp_path)), "--time-limit", "5"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120).stdout.splitlines()
    spend_line = next(line for line in doctor if line.startswith("    spend"))
    start = process.startup_output  # type: ignore[attr-defined]
    if problem is None:
        kept = "append-only file, appendfsync always"
        assert detail == {"kept": "Redis", "persistence": kept, "eviction": "noeviction",
                          "maxmemory": 512 * 1024 * 1024, "used_memory": detail["used_memory"],
                          "warning": None}
        assert spend_line == (f"    spend          ok    kept by Redis: {kept}, "
                              "maxmemory-policy noeviction")
        assert (f"keys have budgets: their spend is kept by Redis: {kept}; maxmemory-policy "
                "noeviction") in start
        assert "keys have budgets, but" not in start
        return
    warning = f"Redis at {url_text}: {problem}"
    assert detail["warning"] == warning
    assert spend_line == f"    spend          warn  {warning}"
    assert f"WARNING [{process.pid}] claude_proxy.app: keys have budgets, but {warning}" in start


def test_without_redis_spend_is_kept_in_the_usage_file(tmp_path: Path, started: Started) -> None:
    data = tmp_path / "data"
    env = clean_env(tmp_path, ANTHROPIC_API_KEY=ADMIN, DATA_DIR=str(data))
    proxy_url, _ = started("--config", str(config(tmp_path)), env=env)
    detail: dict[str, Any] = httpx.get(f"{proxy_url}/health?detail=1",
                                       headers={"x-api-key": ADMIN}, timeout=10).json()
    kept = (f"SQLite file {data / 'usage.sqlite3'} (this process only; with several processes "
            "use REDIS_URL)")
    assert detail["spend"] == {"kept": kept, "warning": None}
