"""`make test-container`: the image, built and started by a real engine, checked from outside.

It builds the Dockerfile with the engine it finds (docker with a daemon that answers, else
podman with `--format docker`), starts the image with a provider env file (.env.deepseek)
whose upstream is tests/scripted_upstream.py running on the host, and checks what a user
sees: /health, a non-streamed and a streamed /v1/messages with exact content, a wrong client
key, the process uid, the image's own HEALTHCHECK, `claude-proxy doctor`, a LOG_FILE the
container cannot write, the image run as deploy/kubernetes.yaml runs it, the logs on stdout,
and a clean stop on SIGTERM. Each check prints its result; the last line is
`container: N passed, N failed`.

With no engine that can run, it says why and fails under CI=true (skips elsewhere).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
from dotenv import dotenv_values

from tests.conftest import free_port
from tests.container.base_image import BASE, BaseImageError, ensure_base
from tests.container.engine import Engine, NoEngine, find_engine
from tests.scripted_upstream import load_transcript, transcript_chunks
from tests.test_response_converter import expected_from_chunks

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "container"
IMAGE = "claude-proxy:container-test"
PROFILE = ".env.deepseek"
UPSTREAM_KEY = "sk-container-upstream-0123456789"
CLIENT_KEY = "sk-ant-container-client-0123456789"
STREAM_STEM, JSON_STEM = "deepseek-reasoner", "deepseek-reasoner-json"
READY_SECONDS = 60
MAX_IMAGE_MB = 250
"""The image on python:3.11-slim (or its Debian stand-in): 342 MB before issue 33."""
NOT_IN_THE_IMAGE = ("pip", "setuptools", "tests", "bpe_openai", "watchfiles", "websockets")
"""Build tools, tests, and what the proxy no longer uses, in /opt/venv's site-packages."""


class CheckFailed(Exception):
    """A check's expectation that did not hold, worded for the person reading the output."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Context:
    engine: Engine
    env_file: Path
    container: str
    url: str = ""

    def image(self) -> dict[str, Any]:
        return self.engine.inspect("image", IMAGE)

    def client(self, key: str = CLIENT_KEY, url: str = "") -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=url or self.url, api_key=key, max_retries=0,
                                   timeout=60)


# ------------------------------------------------------------------ the pieces it runs


@contextmanager
def scripted_upstream() -> Iterator[int]:
    """tests/scripted_upstream.py on the host's loopback, as its own process."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "scripted_upstream.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/v1/chat/completions"),
                   lambda: process.poll() is not None, "the scripted upstream")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=5)
        return True
    except httpx.TransportError:
        return False


def wait_until(ready: Callable[[], bool], gone: Callable[[], bool], what: str) -> None:
    """Poll (bounded) until `what` is ready; stop at once if it has died."""
    give_up = time.monotonic() + READY_SECONDS
    while not ready():
        if gone():
            raise CheckFailed(f"{what} exited before it was ready")
        if time.monotonic() > give_up:
            raise CheckFailed(f"{what} was not ready after {READY_SECONDS} s")
        time.sleep(0.2)


def provider_env_file(directory: Path, upstream_url: str) -> Path:
    """The repository's provider profile as a user would use it, pointed at the scripted
    upstream, with a client key and a signing secret."""
    lines = []
    for line in (ROOT / PROFILE).read_text().splitlines():
        if line.startswith("OPENAI_BASE_URL="):
            line = f"OPENAI_BASE_URL={upstream_url}"
        elif line.startswith("OPENAI_API_KEY="):
            line = f"OPENAI_API_KEY={UPSTREAM_KEY}"
        lines.append(line)
    lines += [f"ANTHROPIC_API_KEY={CLIENT_KEY}", "THINKING_SIGNATURE_SECRET=container-secret"]
    path = directory / PROFILE
    path.write_text("\n".join(lines) + "\n")
    return path


def start_container(context: Context, name: str, *extra: str, args: tuple[str, ...] = ()) -> str:
    """Start the image detached (run flags `extra`, command `args`), published on a free host
    port; its URL once /health answers."""
    port = free_port()
    flags, _ = context.engine.network_flags(port)
    started = context.engine("run", "--detach", "--name", name, "--env-file",
                             str(context.env_file), *flags, *extra, IMAGE, *args)
    expect(started.returncode == 0, f"`{context.engine.name} run` failed: {started.stderr}")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(f"{url}/health"), lambda: not running(context, name),
                   f"container {name}")
    except CheckFailed as error:
        logs = context.engine("logs", name)
        raise CheckFailed(f"{error}; its logs:\n{logs.stdout}{logs.stderr}") from None
    return url


def running(context: Context, name: str) -> bool:
    return bool((context.engine.inspect("container", name).get("State") or {}).get("Running"))


def remove(context: Context, name: str) -> None:
    context.engine("rm", "--force", name, timeout=60)


# ------------------------------------------------------------------ the checks


def check_health(context: Context) -> str:
    response = httpx.get(f"{context.url}/health", timeout=10)
    expect(response.status_code == 200 and response.content == b'{"status":"ok"}',
           f"{response.status_code} {response.content!r}")
    return f"{context.url}/health -> 200 {response.text}"


def check_non_streamed(context: Context, url: str = "") -> str:
    recorded = load_transcript(JSON_STEM)["body"]["choices"][0]["message"]
    message = context.client(url=url).messages.create(
        model="claude-opus-4-1", max_tokens=2048, thinking={"type": "enabled",
                                                            "budget_tokens": 1024},
        messages=[{"role": "user", "content": f"SCENARIO:replay:{JSON_STEM}"}])
    got = [(block.type, getattr(block, "thinking", None) or getattr(block, "text", ""))
           for block in message.content]
    expect(got == [("thinking", recorded["reasoning_content"]), ("text", recorded["content"])],
           f"content differs from the recording {JSON_STEM}: {got!r}")
    expect(message.model == "claude-opus-4-1", f"model {message.model}")
    return (f"thinking ({len(got[0][1])} chars) and text {got[1][1][:40]!r}… as recorded "
            f"({JSON_STEM})")


def check_streamed(context: Context) -> str:
    expected = expected_from_chunks(transcript_chunks(STREAM_STEM))
    with context.client().messages.stream(
            model="claude-opus-4-1", max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": f"SCENARIO:replay:{STREAM_STEM}"}]) as stream:
        events = [event.type for event in stream]
        message = stream.get_final_message()
    thinking = "".join(b.thinking for b in message.content if b.type == "thinking")
    text = "".join(b.text for b in message.content if b.type == "text")
    expect(message.content[0].type == "thinking", f"first block {message.content[0].type}")
    expect(thinking == expected["thinking"], "thinking differs from the recording")
    expect(text == expected["text"], f"text differs from the recording: {text!r}")
    expect(events[0] == "message_start" and events[-1] == "message_stop", f"events {events}")
    return (f"{len(events)} events; thinking ({len(thinking)} chars) and text {text[:40]!r}… "
            f"as recorded ({STREAM_STEM})")


def check_wrong_key(context: Context) -> str:
    try:
        context.client(key="sk-ant-wrong-key").messages.create(
            model="claude-opus-4-1", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    except anthropic.AuthenticationError as error:
        body = error.response.json()
        expect(body["error"]["type"] == "authentication_error", f"body {body}")
        return f"401 {body['error']['type']}: {body['error']['message']}"
    raise CheckFailed("a wrong x-api-key was answered")


def check_uid(context: Context) -> str:
    user = (context.image().get("Config") or {}).get("User")
    expect(user == "10001:10001", f"image USER is {user!r}, not 10001:10001")
    status = context.engine("exec", context.container, "cat", "/proc/1/status").stdout
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines()
           if line.startswith(("Uid:", "Gid:"))}
    expect(ids == {"Uid": ["10001"] * 4, "Gid": ["10001"] * 4}, f"process 1: {ids}")
    return "image USER 10001:10001; process 1 runs with uid and gid 10001"


def check_healthcheck(context: Context) -> str:
    # The container's config, started without health flags: the image's own HEALTHCHECK
    # (the same place for docker and podman, which differ in the image's inspect output).
    config = context.engine.inspect("container", context.container).get("Config") or {}
    test = (config.get("Healthcheck") or {}).get("Test")
    expect(bool(test), "the image has no HEALTHCHECK (podman drops it without --format docker)")
    if context.engine.podman:
        result = context.engine("healthcheck", "run", context.container)
    else:  # docker runs it on its own schedule: run the image's command the same way
        command = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
        result = context.engine("exec", context.container, *command)
    expect(result.returncode == 0, f"unhealthy: {result.stdout}{result.stderr}")
    return f"the image's own {test[0]} {test[1]} … exits 0"


def env_model(context: Context, name: str) -> str:
    """A model the image's env file names (the profile's models change with the provider's)."""
    values = dotenv_values(context.env_file)
    model = values.get(name)
    expect(bool(model), f"{context.env_file}: no {name}")
    return str(model)


def check_doctor(context: Context) -> str:
    flags, _ = context.engine.network_flags(None)
    result = context.engine("run", "--rm", "--env-file", str(context.env_file), *flags, IMAGE,
                            "doctor", timeout=180)
    out = result.stdout
    expect(result.returncode == 0, f"exit {result.returncode}: {out}{result.stderr}")
    big, small = env_model(context, "BIG_MODEL"), env_model(context, "SMALL_MODEL")
    for line in (f"  {big} (opus, sonnet)", f"  {small} (haiku)",
                 "Claude Code will work with this configuration."):
        expect(line in out.splitlines(), f"no line {line!r} in:\n{out}")
    expect(len(re.findall(r"^    reachable\s+ok", out, re.M)) == 2, out)
    return "exit 0, both upstream models reachable; 'Claude Code will work …'"


def check_unwritable_log_file(context: Context) -> str:
    """The bug that killed compose setups: a log folder the container's user cannot write."""
    name = f"{context.container}-logfile"
    try:
        url = start_container(context, name, "--env", "LOG_FILE=/app/claude-proxy.log")
        expect(httpx.get(f"{url}/health", timeout=10).status_code == 200, "no /health")
        logs = context.engine("logs", name).stdout
    finally:
        remove(context, name)
    warning = ("WARNING [1] claude_proxy: LOG_FILE /app/claude-proxy.log cannot be opened "
               "(Permission denied: /app/claude-proxy.log): logging to stdout only")
    expect(warning in logs, f"no warning line in:\n{logs}")
    return "serving; " + warning.split(": ", 1)[1]


def check_as_kubernetes_runs_it(context: Context) -> str:
    """As deploy/kubernetes.yaml runs it: two workers, read-only root, no capabilities."""
    name = f"{context.container}-k8s"
    try:
        url = start_container(context, name, "--read-only", "--cap-drop", "ALL",
                              "--security-opt", "no-new-privileges", args=("--workers", "2"))
        answered = check_non_streamed(context, url)
        logs = context.engine("logs", name).stdout
    finally:
        remove(context, name)
    expect("(2 workers)" in logs, "not started with 2 workers")
    return f"--workers 2, read-only root, no capabilities: {answered}"


def check_logs_on_stdout(context: Context) -> str:
    logs = context.engine("logs", context.container)
    access = [line for line in logs.stdout.splitlines() if "claude_proxy.access" in line]
    big = env_model(context, "BIG_MODEL")
    for wanted in (f"model=claude-opus-4-1->{big} status=200 stream=false",
                   f"model=claude-opus-4-1->{big} status=200 stream=true",
                   "status=401 stream=false"):
        expect(any(wanted in line for line in access), f"no access line with {wanted!r}:\n"
               + "\n".join(access))
    for secret in (UPSTREAM_KEY, CLIENT_KEY):
        expect(secret not in logs.stdout + logs.stderr, "a key appears in the logs")
    return f"{len(access)} access lines on stdout, no key in them"


def check_sigterm(context: Context) -> str:
    started = time.monotonic()
    stopped = context.engine("stop", "--time", "10", context.container, timeout=60)
    took = time.monotonic() - started
    state = context.engine.inspect("container", context.container).get("State") or {}
    logs = context.engine("logs", context.container).stdout
    expect(stopped.returncode == 0, f"stop failed: {stopped.stderr}")
    expect(state.get("ExitCode") == 0,
           f"exit code {state.get('ExitCode')} (137 = killed after 10 s without exiting)")
    expect("Finished server process [1]" in logs, "uvicorn did not finish its shutdown")
    return f"exit code 0 after SIGTERM in {took:.1f} s"


def check_image_size(context: Context) -> str:
    """At most MAX_IMAGE_MB; beyond the base image only the virtualenv, without build tools
    or tests (pip's cache is off in the build stage, which nothing else leaves)."""
    size = int(context.image().get("Size") or 0) / 1e6
    base = int(context.engine.inspect("image", BASE).get("Size") or 0) / 1e6
    flags, _ = context.engine.network_flags(None)
    listed = context.engine("run", "--rm", *flags, "--entrypoint", "sh", IMAGE, "-c",
                            "du -sm /opt/venv; ls /opt/venv/lib/python3*/site-packages")
    expect(listed.returncode == 0, f"listing /opt/venv failed: {listed.stderr}")
    lines = listed.stdout.split()
    venv, names = lines[0], set(lines[2:])
    leftovers = sorted(name for name in NOT_IN_THE_IMAGE if name in names)
    expect(not leftovers, f"in /opt/venv: {', '.join(leftovers)}")
    expect(size <= MAX_IMAGE_MB, f"{size:.0f} MB > {MAX_IMAGE_MB} MB (base {base:.0f} MB, "
           f"/opt/venv {venv} MB)")
    return f"{size:.0f} MB <= {MAX_IMAGE_MB} MB (base {base:.0f} MB, /opt/venv {venv} MB)"


CHECKS: list[tuple[str, Callable[[Context], str]]] = [
    ("/health answers", check_health),
    (f"image at most {MAX_IMAGE_MB} MB", check_image_size),
    ("non-streamed /v1/messages", check_non_streamed),
    ("streamed /v1/messages", check_streamed),
    ("wrong client key -> 401", check_wrong_key),
    ("runs as uid 10001", check_uid),
    ("image HEALTHCHECK passes", check_healthcheck),
    ("claude-proxy doctor in the image", check_doctor),
    ("unwritable LOG_FILE is a warning", check_unwritable_log_file),
    ("as deploy/kubernetes.yaml runs it", check_as_kubernetes_runs_it),
    ("logs go to stdout", check_logs_on_stdout),
    ("clean stop on SIGTERM within 10 s", check_sigterm),
]


# ------------------------------------------------------------------ the run


def report(name: str, outcome: Callable[[], str]) -> bool:
    """Run one check and print its line: PASS or FAIL, its name and what was seen."""
    try:
        detail = outcome()
    except CheckFailed as error:
        print(f"FAIL  {name}: {error}", flush=True)
        return False
    except Exception as error:  # a check that errors has failed too; say how
        print(f"FAIL  {name}: {type(error).__name__}: {error}", flush=True)
        return False
    print(f"PASS  {name}: {detail}", flush=True)
    return True


def build_image(engine: Engine) -> str:
    started = time.monotonic()
    log = CACHE / "build.log"
    with log.open("w") as output:
        built = subprocess.run([engine.name, "build", *engine.build_flags(), "--tag", IMAGE,
                                str(ROOT)], stdout=output, stderr=subprocess.STDOUT, timeout=1200)
    took = time.monotonic() - started
    if built.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise CheckFailed(f"`{engine.name} build` failed after {took:.0f} s ({log}):\n{tail}")
    size = int(engine.inspect("image", IMAGE).get("Size") or 0)
    return f"{IMAGE} in {took:.1f} s, {size / 1e6:.0f} MB"


def cannot_test(reason: str) -> int:
    print(f"container: cannot test the image here: {reason}")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        print("container: 0 passed, 1 failed")
        return 1
    print("container: 0 passed, 0 failed, 1 skipped (outside CI)")
    return 0


def main() -> int:
    try:
        engine = find_engine()
    except NoEngine as error:
        return cannot_test(str(error))
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"container: engine {engine.describe()}", flush=True)
    try:
        started = time.monotonic()
        base = ensure_base(engine, CACHE)
        print(f"container: base {base} ({time.monotonic() - started:.1f} s)", flush=True)
    except BaseImageError as error:
        return cannot_test(str(error))
    results = [report("image builds", lambda: build_image(engine))]
    if results[0]:
        results += run_checks(engine)
    passed = sum(results)
    print(f"container: {passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


def run_checks(engine: Engine) -> list[bool]:
    with scripted_upstream() as upstream_port, tempfile.TemporaryDirectory() as directory:
        _, host = engine.network_flags(None)
        env_file = provider_env_file(Path(directory), f"http://{host}:{upstream_port}/v1")
        context = Context(engine, env_file, f"claude-proxy-test-{os.getpid()}")
        try:
            if not report("container starts", lambda: start(context)):
                return [False]
            return [True, *(report(name, lambda check=check: check(context))
                            for name, check in CHECKS)]
        finally:
            remove(context, context.container)


def start(context: Context) -> str:
    started = time.monotonic()
    context.url = start_container(context, context.container)
    return (f"{context.url} serving {time.monotonic() - started:.1f} s after "
            f"`{context.engine.name} run --env-file {PROFILE}`")


if __name__ == "__main__":
    sys.exit(main())
