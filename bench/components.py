"""What routing, the dashboard's recorder and the inspector cost per request, measured inside
the production install (`python bench/components.py` prints JSON).

The benchmark cannot switch routing off, so these parts are timed alone, with the objects the
proxy really uses (`create_app`, its service, router, providers and recorder) on a request
like the benchmark's, and set against the proxy's server CPU per request. What each part
runs per request (the same calls, in the same order as the proxy):

- routing: the router's candidates, the provider's health (acquire, release, success), the
  attempt counter and the route noted on the access record;
- dashboard: the recorder told that a request started and finished (its summary row, the
  per-minute series, the inspector's ring of kept requests), with no dashboard open;
- inspector: what the service leaves on the record for it (bodies by reference, three
  timeline marks).

Per chunk there is nothing to time here: a streamed write appends one reference to the
record (`lifecycle.relay_events`), and an open dashboard reads those once a second.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson

from claude_proxy.config.settings import Settings
from claude_proxy.record import RequestRecord, bind, current_record, mark
from claude_proxy.server.app import create_app
from claude_proxy.service import CandidateWalk, MessagesService

T = TypeVar("T")

BODY = {"model": "claude-sonnet-4-6", "stream": False, "max_tokens": 4096,
        "messages": [{"role": "user", "content": "BENCH n=8 iv=0"}]}
MESSAGE = {"id": "msg_bench", "type": "message", "role": "assistant", "model": BODY["model"],
           "content": [{"type": "text", "text": "tok " * 8}], "stop_reason": "end_turn",
           "stop_sequence": None, "usage": {"input_tokens": 8, "output_tokens": 8}}
TOKENS = {"cache_read": 0, "cache_write": 0, "input": 8, "output": 8, "reasoning": 0,
          "cached": 0}


def per_call_us(work: Callable[[], object], seconds: float = 0.3) -> float:
    """Median of five timed batches, in microseconds per call."""
    number = 1
    while True:
        started = time.perf_counter()
        for _ in range(number):
            work()
        if time.perf_counter() - started > seconds / 5:
            break
        number *= 2
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(number):
            work()
        runs.append((time.perf_counter() - started) / number * 1e6)
    return sorted(runs)[2]


def at_once(coroutine: Coroutine[Any, Any, T]) -> T:
    """The value of a coroutine that finishes without waiting (a healthy provider's `take`
    claims nothing), without an event loop's cost in the timing."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("the coroutine waited")


def routing(service: MessagesService) -> Callable[[], object]:
    def run() -> object:
        record = current_record()
        walk = CandidateWalk(service.router.candidates(BODY, 10, service.sessions.previous(None)),
                     service.providers)
        candidate = at_once(walk.next())
        assert candidate is not None
        provider = service.providers[candidate.provider]
        service._note_route(record, candidate, walk)
        provider.health.release()
        provider.health.record_success()
        service._count(candidate, "ok")
        return candidate
    return run


def dashboard(recorder: Any) -> Callable[[], object]:
    def run() -> object:
        record = RequestRecord("req_bench", "POST", "/v1/messages", status=200,
                               client_model=BODY["model"], provider="default",
                               upstream_model="gpt-4o", tokens=dict(TOKENS))
        record.message = MESSAGE
        recorder.started(record)
        recorder.finished(record, time.perf_counter())
        return record
    return run


def inspector() -> Callable[[], object]:
    def run() -> object:
        record = current_record()
        record.client_body, record.upstream_body, record.added = BODY, BODY, {}
        mark("upstream request", "default,gpt-4o")
        mark("first upstream byte", "default")
        mark("failover", "")  # the third moment a request may have (a retry, a failover)
        record.timeline.clear()
        return record
    return run


async def measure() -> dict[str, float]:
    settings = Settings(openai_api_key="sk-bench-components", provider="openai",
                        openai_base_url="http://127.0.0.1:9/v1", _env_file=None)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        service: MessagesService = app.state.wiring.service
        bind(RequestRecord("req_bench", "POST", "/v1/messages"))
        return {"routing_us": round(per_call_us(routing(service)), 2),
                "dashboard_us": round(per_call_us(dashboard(app.state.recorder)), 2),
                "inspector_us": round(per_call_us(inspector()), 2)}


def main() -> None:
    sys.stdout.write(orjson.dumps(asyncio.run(measure())).decode() + "\n")


if __name__ == "__main__":
    main()
