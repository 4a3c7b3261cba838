"""One Messages request from validated body to upstream answer: where it goes (the router's
candidates, walked with failover before the first byte), its conversion for the provider that
takes it, the refused-field fallback, and the converter that turns the answer into events.

Kept apart from `server/` (HTTP framing) and `upstream/` (the network), so the flow reads in
one place: `MessagesService` here, with what it asks of its collaborators beside it — the
failover walk (`failover.py`), the request's translation for a provider and the converter of
its answer (`translation.py`), the input tokens counted for a candidate (`counting.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from claude_proxy.config.file import ProxyConfig
from claude_proxy.conversion import context_edits, safeguards
from claude_proxy.conversion.caching import session_cache_key
from claude_proxy.conversion.request_converter import UpstreamRequest
from claude_proxy.conversion.response_converter import (
    StreamConverter,
    collect_message,
    convert_chunks,
)
from claude_proxy.conversion.reuse import Slot
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.conversion.tool_guard import reask_body
from claude_proxy.conversion.usage import summed
from claude_proxy.errors import ProxyError
from claude_proxy.keys.ring import KeyRing
from claude_proxy.metrics import Metrics
from claude_proxy.record import RequestRecord, current_record, mark, record_usage
from claude_proxy.routing import calibration, preflight
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Candidate, Router
from claude_proxy.routing.sessions import SessionSizes
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.service.counting import TokenCounter
from claude_proxy.service.failover import Attempt, CandidateWalk, classify
from claude_proxy.service.translation import BodyStep, Translator, unchanged
from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import StateStore
from claude_proxy.upstream.api import api_of
from claude_proxy.upstream.capabilities import REASONING
from claude_proxy.upstream.client import Batches, Chunk, OpenAIClient, UpstreamStream
from claude_proxy.upstream.misconfigured import MisconfiguredUpstream
from claude_proxy.upstream.overflow import ContextOverflow, context_overflow
from claude_proxy.upstream.retry import parse_retry_after

logger = logging.getLogger("claude_proxy.service")

T = TypeVar("T")
Send = Callable[[Provider, UpstreamRequest], Awaitable[T]]

LEARNED_RETRIES = 2
"""How often one attempt is sent again after a refusal that taught what to leave out: a
refused signature can be followed by a refusal of the unsigned thinking sent in its place."""


class MessagesService:
    def __init__(self, config: ProxyConfig, providers: dict[str, Provider],
                 signer: ThinkingSigner, metrics: Metrics,
                 store: StateStore | None = None, keys: KeyRing | None = None,
                 replay: BodyStep = unchanged, judge: safeguards.Judge | None = None) -> None:
        self.config = config
        self.keys = keys
        """The `[keys]` (None without): what each key may be routed to."""
        self.store = store or LocalStore()
        """What this request path learns for the fleet (state/): one instance per process."""
        self.providers = providers
        self.router = Router({name: p.settings for name, p in providers.items()}, config.router)
        self.metrics = metrics
        self.sessions = SessionSizes(self.store)
        self.translator = Translator(providers, signer, metrics, self.store, replay, judge)
        self.counter = TokenCounter(config, self.store, self.router, self.sessions, providers,
                                    self.translator)

    @property
    def client(self) -> OpenAIClient:
        """The first provider's client (with one provider, the only one)."""
        return self.providers[self.router.first].client

    # ------------------------------------------------------------ routing and failover

    async def routed(self, body: dict[str, Any], send: Send[T], session: str | None,
                     raw: bytes | None = None, turns: Slot | None = None) -> tuple[Attempt, T]:
        """Walk the router's candidates until one answers (before its first byte). `raw`:
        the client's JSON that `body` was parsed from, for the estimate; `turns`: the
        conversation's last conversion (conversion/reuse.py)."""
        record = current_record()
        record.client_model, record.stream = body["model"], bool(body.get("stream"))
        estimate = estimate_request_tokens(body, raw=raw)
        measure = self.counter.measure(body, session, estimate)
        previous = await self.sessions.recall(session)
        candidates = self.permitted(self.router.candidates(
            body, estimate, previous, subagent=record.agent != "-",
            request_class=record.request_class))
        fits = preflight.plan(candidates, self.permitted(self.router.route("long_context"),
                                                         strict=False), measure)
        walk = CandidateWalk([fit.candidate for fit in fits], self.providers)
        cache_key = session_cache_key(session, body)
        while (candidate := await walk.next()) is not None:
            provider = self.providers[candidate.provider]
            self._note_route(record, candidate, walk)  # an error is then the last one tried
            fit = measure(candidate)
            record.input_estimate = fit.raw
            try:
                attempt, result = await self._attempt(provider, candidate, fit, body, send,
                                                      cache_key, turns)
            except ProxyError as error:
                self.metrics.count_upstream_error(error.error_type)
                await self._after_failure(walk, provider, candidate, error, fit)
                continue
            finally:
                provider.health.release()
            provider.health.record_success()
            self._count(candidate, "ok")
            return attempt, result
        raise walk.all_failed(estimate)

    async def count_input(self, body: dict[str, Any], session: str | None,
                          raw: bytes | None = None) -> int:
        """count_tokens for the request (`TokenCounter.count_input`)."""
        return await self.counter.count_input(body, session, raw)

    async def _after_failure(self, walk: CandidateWalk, provider: Provider, candidate: Candidate,
                             error: ProxyError, fit: preflight.Fit) -> None:
        """Record the failure and decide: go on to the next candidate, or raise now."""
        kind = classify(error)
        if kind == "final":
            provider.health.record_success()  # it answered: the request was at fault
            self._count(candidate, "error")
            raise error
        if kind == "overflow":
            self._count(candidate, "error")
            overflow = context_overflow(error, fit.tokens, fit.window)
            assert overflow is not None
            if not walk.reroute(self.permitted(self.router.route("long_context"), strict=False),
                                candidate):
                raise overflow
            logger.info("context overflow on %s,%s; trying the long_context route",
                        candidate.provider, candidate.model)
            walk.failures.append((candidate, overflow))
            return
        if kind == "credential":
            provider.health.record_misconfigured(error.message)
            logger.warning("provider %s refused its credential (%d %s): check its key",
                           provider.name, error.status, error.message)
        elif isinstance(error, MisconfiguredUpstream):
            provider.health.record_misconfigured(error.message)
            logger.warning("provider %s is not set up for this request: %s", provider.name,
                           error.advice)
        else:
            await provider.health.failed(error.message,
                                         parse_retry_after(error.headers.get("retry-after")))
        walk.failures.append((candidate, error))
        self._count(candidate, "failed_over" if walk.queue else "error")
        if walk.queue:
            logger.warning("provider %s failed (%d %s); failing over to %s", provider.name,
                           error.status, error.error_type, walk.queue[0].provider)
            mark("failover", f"{provider.name} -> {walk.queue[0].provider}")

    def permitted(self, candidates: list[Candidate], strict: bool = True) -> list[Candidate]:
        """The candidates the request's key may use: its providers and routes, and for a key
        with a budget only priced models (`strict`: 403 naming why when none is left)."""
        spec = self.keys.spec(current_record().key) if self.keys is not None else None
        if spec is None:
            return candidates
        allowed = [c for c in candidates if spec.may_use(c.provider, c.route)]
        if spec.budget_usd is not None:
            allowed = [c for c in allowed
                       if self.config.models.facts(c.provider, c.model).priced]
        if strict and candidates and not allowed:
            tried = ", ".join(f"{c.provider},{c.model} ({c.route})" for c in candidates)
            raise ProxyError(403, f"key {spec.name} may not use {tried}"
                             + (" (a key with a budget uses priced models only)"
                                if spec.budget_usd is not None else ""),
                             error_type="permission_error")
        return allowed

    def _note_route(self, record: RequestRecord, candidate: Candidate, walk: CandidateWalk) -> None:
        """The candidate being tried, and the providers that failed before it."""
        record.provider, record.route = candidate.provider, candidate.route
        record.upstream_model = candidate.model
        record.failover = [c.provider for c, _ in walk.failures]

    def _count(self, candidate: Candidate, outcome: str) -> None:
        self.metrics.attempts_of(candidate.provider, candidate.route, outcome).inc()

    # ------------------------------------------------------------ one provider

    async def _attempt(self, provider: Provider, candidate: Candidate, fit: preflight.Fit,
                       body: dict[str, Any], send: Send[T], cache_key: str | None = None,
                       turns: Slot | None = None) -> tuple[Attempt, T]:
        """Send to one provider; if it refuses something we added (an optional field, the
        cache breakpoints, the reasoning fields, a later system message), remember that for
        the model and send once more without. `cache_key`: the session's prompt-cache key.
        max_tokens is clamped to the room the model's window leaves (pre-flight)."""
        body = preflight.clamped(body, fit)
        edited = context_edits.apply(body, fit.tokens, needs_reasoning=context_edits.
                                     needs_reasoning(self.translator.settings_of(provider)))
        body = edited.body
        upstream = self.translator.convert(provider, candidate.model, body, cache_key, turns)
        for _ in range(LEARNED_RETRIES):
            try:
                return (Attempt(provider, candidate, upstream, fit, edited.applied),
                        await _timed_send(provider, upstream, send))
            except ProxyError as error:
                if not await self._learned(provider, candidate.model, error, upstream):
                    raise
            upstream = self.translator.convert(provider, candidate.model, body, cache_key, turns)
        return (Attempt(provider, candidate, upstream, fit, edited.applied),
                await _timed_send(provider, upstream, send))

    async def _learned(self, provider: Provider, model: str, error: ProxyError,
                       upstream: UpstreamRequest) -> bool:
        """Whether the error refuses something the proxy may leave out; if so it is
        remembered for the model (and the fleet) before the request is sent again."""
        known = isinstance(error, ContextOverflow | MisconfiguredUpstream)
        refused = [] if known else api_of(upstream).refused_fields(error, upstream)
        if not refused:
            return False
        what = (f"the reasoning fields {sorted(upstream.extras)}" if refused == [REASONING]
                else ", ".join(refused))
        logger.warning("upstream model %s refused %s (%s); retrying without, and leaving "
                       "it out for this model from now on", model, what, error.message)
        for name in refused:
            provider.refusals.remember(model, name)
        await self.store.sync()  # the fleet leaves it out from now on, too
        return True

    # ------------------------------------------------------------ entry points

    async def open_stream(self, body: dict[str, Any], session: str | None = None,
                          raw: bytes | None = None, turns: Slot | None = None
                          ) -> tuple[StreamConverter, Batches]:
        """The upstream stream, opened (errors before the first byte raise ProxyError).
        `raw`, `turns`: as for `routed`. With TOOL_GUARD_REASK, a reply whose only content
        is tool calls is held back to its end, and asked again if they all failed."""
        attempt, stream = await self.routed(body, send_stream, session, raw, turns)
        converter = self.translator.converter(body, attempt)
        guard = converter.guard
        if guard is None or not guard.repairs or not self.translator.settings_of(
                attempt.provider).tool_guard_reask:
            return converter, stream
        converter.hold_reply()
        return converter, ReaskingStream(stream, converter, self, body, session)

    async def create(self, body: dict[str, Any], session: str | None = None,
                     raw: bytes | None = None, turns: Slot | None = None) -> dict[str, Any]:
        """A whole Message, for non-streaming clients. With stop sequences the upstream is
        asked for a stream, so that it can be cancelled where one matches. `raw`, `turns`:
        as for `routed`."""
        if body.get("stop_sequences"):
            return await self._create_streamed(body, session, turns)

        def send(provider: Provider, upstream: UpstreamRequest) -> Awaitable[dict[str, Any]]:
            return api_of(upstream).send_once(provider.client, upstream)

        attempt, answer = await self.routed(body, send, session, raw, turns)
        message, reasoning = await self._whole(body, attempt, answer)
        usage = message["usage"]
        record = current_record()
        retry = (reask_body(body, message, record.tool_calls) if record.tool_calls
                 and self.translator.settings_of(attempt.provider).tool_guard_reask else None)
        if retry is not None:  # TOOL_GUARD_REASK: once, with the validation errors
            mark("tool-call re-ask", f"{len(record.tool_calls)} invalid call(s)")
            try:
                attempt, answer = await self.routed(retry, send, session)
            except ProxyError as error:
                logger.warning("tool-call re-ask failed (%s): the first answer stands",
                               error.message)
            else:
                message, more = await self._whole(retry, attempt, answer)
                # Both answers were paid for: the Message says so, as does the spend.
                usage = message["usage"] = summed(message["usage"], usage)
                reasoning += more
        record.message = message
        record_usage(usage, reasoning)
        self.remember_session(session, record)
        return message

    async def _whole(self, body: dict[str, Any], attempt: Attempt,
                     answer: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """A whole upstream answer as a Message, and its reasoning tokens."""
        chunks = api_of(attempt.upstream).events_of(answer)
        converter = self.translator.converter(body, attempt)
        events = convert_chunks(chunks, converter, end=False)
        message = collect_message(events + await converter.settle() + converter.finish())
        return message, converter.reasoning_tokens()

    async def _create_streamed(self, body: dict[str, Any], session: str | None,
                               turns: Slot | None = None) -> dict[str, Any]:
        """`create` through an upstream stream, read until its end or a stop sequence."""
        converter, stream = await self.open_stream({**body, "stream": True}, session,
                                                   turns=turns)
        record = current_record()
        record.stream = False
        events = converter.start()
        try:
            async for batch in stream:
                for chunk in batch:
                    events.extend(converter.feed(chunk))
                    if converter.stopped:
                        break
                if converter.stopped:
                    break
            if not (stream.complete or converter.saw_finish_reason):
                raise ProxyError(502, "upstream stream ended before the response was complete",
                                 error_type="api_error")
        finally:
            await stream.aclose()  # cancels the upstream after a stop sequence
        message = collect_message(events + await converter.settle() + converter.finish())
        record.message = message
        record_usage(message["usage"], converter.reasoning_tokens())
        self.remember_session(session, record)
        return message

    def remember_session(self, session: str | None, record: RequestRecord) -> None:
        """The input this turn really used, for the next turn's long_context rule and the
        session's calibration (routing/calibration.py)."""
        reported = (record.tokens.get("input", 0) + record.tokens.get("cache_read", 0)
                    + record.tokens.get("cache_write", 0))
        self.sessions.remember(session, reported)
        calibration.remember(self.store, session, record.provider, record.upstream_model,
                             reported, record.input_estimate, record.thread)


def send_stream(provider: Provider, upstream: UpstreamRequest) -> Awaitable[UpstreamStream]:
    return api_of(upstream).send_stream(provider.client, upstream)


class ReaskingStream:
    """TOOL_GUARD_REASK on a stream: the upstream's answer, read by the converter holding
    the reply back (`StreamConverter.hold_reply`); when that answer ended with nothing but
    tool calls held and all failed, the retry's answer goes out in its place, through the
    same converter into the same message. A retry that cannot be opened leaves the reply."""

    def __init__(self, stream: UpstreamStream, converter: StreamConverter,
                 service: MessagesService, body: dict[str, Any], session: str | None) -> None:
        self.stream = stream
        self.converter = converter
        self._service: MessagesService | None = service
        """Until the first answer has ended."""
        self._body, self._session = body, session

    @property
    def complete(self) -> bool:
        return self.stream.complete

    @property
    def said_done(self) -> bool:
        return self.stream.said_done and not self._may_follow()

    def _may_follow(self) -> bool:
        return self._service is not None and self.converter.holds_reply

    def __aiter__(self) -> ReaskingStream:
        return self

    async def __anext__(self) -> list[Chunk]:
        if not (self.stream.said_done and self._may_follow()):
            try:
                return await anext(self.stream)
            except StopAsyncIteration:
                if not self._may_follow():
                    raise
        retry = await self._retry()
        if retry is None:
            raise StopAsyncIteration
        await self.stream.aclose()
        self.stream = retry
        return await anext(retry)

    async def _retry(self) -> UpstreamStream | None:
        """The retry's stream, once: when the whole answer came (not one cut short), it held
        nothing but tool calls, and every one of them failed (`reask_body`)."""
        service, self._service = self._service, None
        if service is None or not (self.stream.complete or self.converter.saw_finish_reason):
            return None
        reply = self.converter.end_answer()
        record = current_record()
        retry = None if reply is None else reask_body(self._body, reply, record.tool_calls)
        if retry is None:
            return None
        mark("tool-call re-ask", f"{len(record.tool_calls)} invalid call(s)")
        streamed = record.stream  # the client's (a stop-sequence request reads a stream)
        try:
            attempt, stream = await service.routed(retry, send_stream, self._session)
        except ProxyError as error:
            logger.warning("tool-call re-ask failed (%s): the first answer goes out",
                           error.message)
            return None
        finally:
            record.stream = streamed
        self.converter.resume(service.translator.converter(retry, attempt))
        return stream

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _timed_send(provider: Provider, upstream: UpstreamRequest, send: Send[T]) -> T:
    """`send`, with its moments on the request's timeline (the dashboard's inspector)."""
    mark("upstream request", f"{provider.name},{upstream.body['model']}")
    try:
        answer = await send(provider, upstream)
    except ProxyError as error:
        mark("upstream failed", f"{provider.name}: {error.status} {error.error_type}")
        raise
    mark("first upstream byte", provider.name)
    return answer
