"""One Messages request from validated body to upstream answer: where it goes (the router's
candidates, walked with failover before the first byte), its conversion for the provider that
takes it, the refused-field fallback, and the converter that turns the answer into events.

Kept apart from `server/` (HTTP framing) and `upstream/` (the network), so the flow reads in
one place.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from claude_proxy.config.file import ProxyConfig
from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion import context_edits, safeguards
from claude_proxy.conversion.caching import session_cache_key
from claude_proxy.conversion.reasoning import OpaqueFor
from claude_proxy.conversion.request_converter import UpstreamRequest
from claude_proxy.conversion.response_converter import (
    StreamConverter,
    collect_message,
    convert_chunks,
)
from claude_proxy.conversion.reuse import Slot
from claude_proxy.conversion.signatures import Origin, ThinkingSigner, restore_hidden_thinking
from claude_proxy.conversion.tool_guard import CallReport, Report, ToolGuard, reask_body
from claude_proxy.conversion.tool_schemas import OfferedTools, metric_kind
from claude_proxy.conversion.usage import summed
from claude_proxy.errors import ProxyError
from claude_proxy.keys.ring import KeyRing
from claude_proxy.metrics import Metrics
from claude_proxy.record import RequestRecord, current_record, mark, record_usage
from claude_proxy.routing import calibration, preflight
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Candidate, Router
from claude_proxy.routing.sessions import SessionSizes
from claude_proxy.routing.tokens import encoding_name, estimate_request_tokens
from claude_proxy.state.local import LocalStore
from claude_proxy.state.store import StateStore
from claude_proxy.upstream import llamacpp
from claude_proxy.upstream.api import Build, api_for, api_of
from claude_proxy.upstream.capabilities import REASONING
from claude_proxy.upstream.client import Batches, Chunk, OpenAIClient, UpstreamStream
from claude_proxy.upstream.misconfigured import MisconfiguredUpstream
from claude_proxy.upstream.overflow import ContextOverflow, context_overflow
from claude_proxy.upstream.retry import parse_retry_after

logger = logging.getLogger("claude_proxy.service")

T = TypeVar("T")
Send = Callable[[Provider, UpstreamRequest], Awaitable[T]]
BodyStep = Callable[[dict[str, Any]], dict[str, Any]]
"""A change to the client's body before it is converted, handed in by a layer above (the web
search's replay of earlier searches as text): the service knows no feature above it."""


def unchanged(body: dict[str, Any]) -> dict[str, Any]:
    return body


SERVER_PROFILE_KEY = "server-profile:"
"""Store records: the profile a provider's server was recognised as (per provider name)."""
SERVER_PROFILE_TTL = 3600.0
"""Refreshed by the next answer that says so; a server swapped for another is relearned."""

FAILOVER_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
CREDENTIAL_STATUSES = frozenset({401, 402, 403})
Failure = Literal["retriable", "credential", "misconfigured", "overflow", "final"]


@dataclass(frozen=True)
class Attempt:
    """The candidate that answered, and what was sent to it."""

    provider: Provider
    candidate: Candidate
    upstream: UpstreamRequest
    fit: preflight.Fit
    """Its input estimate and window (the pre-flight's measure)."""
    edits: list[dict[str, Any]] = field(default_factory=list)
    """The context-management edits applied to what it was sent (`applied_edits`)."""


def classify(error: ProxyError) -> Failure:
    """What a failure before the first byte means for failover: try the next candidate
    (counting towards cooldown or, for a refused credential, not), reroute a context
    overflow, or answer the client now. A server not set up for the request (e.g. llama-server
    without --jinja) is tried no more, but another provider may be."""
    if isinstance(error, MisconfiguredUpstream):
        return "misconfigured"
    if error.status in CREDENTIAL_STATUSES:
        return "credential"
    if error.status in FAILOVER_STATUSES:
        return "retriable"
    if isinstance(error, ContextOverflow) or context_overflow(error, 0) is not None:
        return "overflow"
    return "final"


class CandidateWalk:
    """The candidates still to try: cooling providers are skipped, unless every candidate is
    cooling, when the one that reopens soonest is tried anyway."""

    def __init__(self, candidates: list[Candidate], providers: dict[str, Provider]) -> None:
        self.queue = list(candidates)
        self.providers = providers
        self.skipped: list[Candidate] = []
        self.failures: list[tuple[Candidate, ProxyError]] = []
        self.rerouted = False

    async def next(self) -> Candidate | None:
        while self.queue:
            candidate = self.queue.pop(0)
            if await self.providers[candidate.provider].health.take():
                return candidate
            self.skipped.append(candidate)
        if self.failures or not self.skipped:
            return None
        soonest = min(self.skipped,
                      key=lambda c: self.providers[c.provider].health.reopens_at())
        self.skipped.remove(soonest)
        self.providers[soonest.provider].health.force()
        return soonest

    def reroute(self, route: list[Candidate], current: Candidate) -> bool:
        """Put the long-context route first, once, when it is another route."""
        fresh = [c for c in route if (c.provider, c.model) != (current.provider, current.model)]
        if self.rerouted or not fresh:
            return False
        self.rerouted = True
        self.queue[:0] = fresh
        return True


LEARNED_RETRIES = 2
"""How often one attempt is sent again after a refusal that taught what to leave out: a
refused signature can be followed by a refusal of the unsigned thinking sent in its place."""
EXACT_NEAR_WINDOW = 0.5
"""On the request path, an OpenAI-family request is tokenized exactly (before the upstream has
measured its conversation) once its plain estimate reaches this share of the window: below
it, four characters a token is not wrong by enough to matter."""


class MessagesService:
    def __init__(self, config: ProxyConfig, providers: dict[str, Provider],
                 signer: ThinkingSigner, metrics: Metrics,
                 store: StateStore | None = None, keys: KeyRing | None = None,
                 replay: BodyStep = unchanged, judge: safeguards.Judge | None = None) -> None:
        self.config = config
        self.replay = replay
        """Earlier turns' blocks of features above this layer, as the upstream can take them."""
        self.judge = judge
        """Judges a reply's tool calls for a request with `safeguards` (`judge.py`, set by
        the app when a judge route is configured); None: `unsupported` is answered."""
        self.keys = keys
        """The `[keys]` (None without): what each key may be routed to."""
        self.store = store or LocalStore()
        """What this request path learns for the fleet (state/): one instance per process."""
        self.providers = providers
        self.router = Router({name: p.settings for name, p in providers.items()}, config.router)
        self.signer = signer
        self.metrics = metrics
        self.sessions = SessionSizes(self.store)
        self._recognised: dict[str, ProviderSettings] = {}
        for provider in providers.values():
            if llamacpp.recognisable(provider.settings):
                provider.client.on_headers = partial(self._note_server, provider.name)

    # ------------------------------------------------------------ the server behind a provider

    def _note_server(self, name: str, headers: Mapping[str, str]) -> None:
        """A provider whose profile was only guessed: llama-server says who it is in every
        answer's `Server` header; from then on the provider gets the `llamacpp` profile."""
        key = SERVER_PROFILE_KEY + name
        known = self.store.get(key)
        if llamacpp.is_llamacpp(headers):
            if known is None:
                logger.info("provider %s is llama.cpp (its Server header): using the %s "
                            "profile", name, llamacpp.PROFILE)
                self.store.put(key, {"profile": llamacpp.PROFILE}, ttl=SERVER_PROFILE_TTL)
        elif known is not None:
            self.store.delete(key)

    def settings_of(self, provider: Provider) -> ProviderSettings:
        """The provider's settings, with the profile its server was recognised as."""
        known = self.store.get(SERVER_PROFILE_KEY + provider.name)
        profile = known.get("profile") if known else None
        if not isinstance(profile, str) or not llamacpp.recognisable(provider.settings):
            return provider.settings
        cached = self._recognised.get(provider.name)
        if cached is None or cached.provider != profile:
            cached = provider.settings.model_copy(update={"provider": profile})
            self._recognised[provider.name] = cached
        return cached

    @property
    def client(self) -> OpenAIClient:
        """The first provider's client (with one provider, the only one)."""
        return self.providers[self.router.first].client

    def is_ours(self, block: dict[str, Any]) -> bool:
        """Our own thinking block: its signature verifies. A block with an empty signature
        (from a proxy that did not sign) is plain text the client showed, and counts too;
        any other signature (e.g. a real Anthropic one) does not."""
        signature = block.get("signature")
        if not signature:
            return True
        return isinstance(signature, str) and self.signer.verify(
            str(block.get("thinking", "")), signature) is not None

    def origin(self, provider: Provider, model: str) -> Origin:
        """Who answers: the provider, the upstream model and a fingerprint of the key. Thinking
        blocks carry it; their opaque reasoning goes back only to that same origin."""
        key = provider.settings.openai_api_key.get_secret_value()
        return Origin(provider.name, model, self.signer.key_fingerprint(key))

    def opaque_for(self, origin: Origin) -> OpaqueFor:
        """A block's opaque reasoning items if its envelope verifies and names `origin`;
        none for a tampered, foreign or plain block."""
        def opaque(block: dict[str, Any]) -> list[dict[str, Any]]:
            signature = block.get("signature")
            if not isinstance(signature, str) or not signature:
                return []
            envelope = self.signer.verify(str(block.get("thinking", "")), signature)
            if envelope is None or envelope.origin != origin:
                return []
            return envelope.opaque
        return opaque

    def convert(self, provider: Provider, model: str, body: dict[str, Any],
                cache_key: str | None = None, turns: Slot | None = None) -> UpstreamRequest:
        """The upstream request, minus whatever this model is known to refuse, in the API
        the provider takes for this model (upstream/api.py picks it). `turns`: the
        conversation's last conversion, for this one to reuse (conversion/reuse.py)."""
        body = self.replay(body)  # earlier web searches as text
        body = restore_hidden_thinking(body, self.signer)  # display "omitted" blocks
        refusals = provider.refusals
        settings = self.settings_of(provider)
        api = api_for(model, settings)
        upstream = api.build(body, settings, Build(
            model, refusals, is_ours=self.is_ours,
            opaque_for=self.opaque_for(self.origin(provider, model)), cache_key=cache_key,
            betas=current_record().betas, turns=turns))
        record = current_record()  # for the dashboard's inspector (kept by reference)
        record.client_body, record.upstream_body = body, upstream.body
        record.added = upstream.extras
        logger.debug("upstream request model=%s%s extra_json: %s", model, api.label,
                     upstream.extras)
        return upstream

    def converter(self, body: dict[str, Any], attempt: Attempt) -> StreamConverter:
        """The event converter for the answer of the attempt that succeeded: that API's
        parser, and signatures naming that provider and model."""
        upstream = attempt.upstream
        origin = self.origin(attempt.provider, attempt.candidate.model)
        thinking = body.get("thinking")
        omitted = isinstance(thinking, dict) and thinking.get("display") == "omitted"
        cleared = sum(int(edit["cleared_input_tokens"]) for edit in attempt.edits)
        converter = StreamConverter(body["model"],
                                    input_tokens=max(1, attempt.fit.tokens - cleared),
                                    sign=partial(self.signer.sign, origin=origin,
                                                 hidden=omitted),
                                    parser=api_of(upstream).parser(upstream),
                                    omit_thinking=omitted,
                                    stop_sequences=body.get("stop_sequences") or (),
                                    window=attempt.fit.window,
                                    guard=self.tool_guard(body, attempt))
        if body.get("context_management") is not None:
            converter.event_fields["context_management"] = {"applied_edits": attempt.edits}
        if safeguards.requested(body):
            if self.judge is None:
                converter.delta_fields["safeguard_results"] = safeguards.results(
                    safeguards.UNSUPPORTED)
            else:
                converter.judge = partial(self.judge, body)
        return converter

    def tool_guard(self, body: dict[str, Any], attempt: Attempt) -> ToolGuard | None:
        """The tool-call guard for the answer (TOOL_GUARD), None when off or when the request
        offers no tools."""
        if not body.get("tools"):
            return None
        settings = self.settings_of(attempt.provider)
        mode = settings.guard_mode
        if mode == "off":
            return None
        report = tool_call_reporter(self.metrics, attempt.candidate.provider,
                                    attempt.candidate.model)
        return ToolGuard(OfferedTools.of_request(body), report, mode=mode,
                         max_hold=settings.tool_guard_max_hold_bytes)

    # ------------------------------------------------------------ routing and failover

    async def routed(self, body: dict[str, Any], send: Send[T], session: str | None,
                     raw: bytes | None = None, turns: Slot | None = None) -> tuple[Attempt, T]:
        """Walk the router's candidates until one answers (before its first byte). `raw`:
        the client's JSON that `body` was parsed from, for the estimate; `turns`: the
        conversation's last conversion (conversion/reuse.py)."""
        record = current_record()
        record.client_model, record.stream = body["model"], bool(body.get("stream"))
        estimate = estimate_request_tokens(body, raw=raw)
        measure = self.measure(body, session, estimate)
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
        raise self._all_failed(walk, estimate)

    def measure(self, body: dict[str, Any], session: str | None, plain: int | None = None,
                exact: bool = False) -> preflight.Measure:
        """Measures candidates for this request: the calibrated input estimate for the
        model and its known window. The calibration works on the tokenizer-free estimate
        (`plain`, made once); a conversation the upstream has not measured yet is counted
        exactly for an OpenAI-family model when it matters: always for count_tokens
        (`exact`), and on the request path only near the model's window, so that the
        tokenizer (its tables weigh ~140 MiB, a 100k-token request ~13 ms) stays off the
        hot path of requests that fit with room to spare."""
        plain = estimate_request_tokens(body) if plain is None else plain
        exact_counts: dict[str, int] = {}
        fits: dict[Candidate, preflight.Fit] = {}
        # Only a session is calibrated: no digest of the system prompt without one.
        conversation = calibration.thread(body) if session else ""
        current_record().thread = conversation  # remember_session's too (same system prompt)

        def counted(candidate: Candidate, window: int | None) -> int:
            family = encoding_name(candidate.model)
            if family is None or calibration.recorded(self.store, session, candidate.provider,
                                                      candidate.model, conversation):
                return calibration.calibrated(self.store, session, candidate.provider,
                                              candidate.model, plain, conversation)
            if not exact and (window is None or plain < window * EXACT_NEAR_WINDOW):
                return plain
            if family not in exact_counts:
                exact_counts[family] = estimate_request_tokens(body, candidate.model)
            return exact_counts[family]

        def measure(candidate: Candidate) -> preflight.Fit:
            if candidate not in fits:
                facts = self.config.models.facts(candidate.provider, candidate.model)
                tokens = counted(candidate, facts.context_window)
                fits[candidate] = preflight.Fit(candidate, tokens, plain,
                                                facts.context_window, facts.max_output_tokens)
            return fits[candidate]
        return measure

    def count_tokens(self, body: dict[str, Any], session: str | None) -> int:
        """count_tokens: the calibrated input estimate for the model this request would go
        to (exact for OpenAI-family models)."""
        plain = estimate_request_tokens(body)
        candidates = self.router.candidates(body, plain, self.sessions.previous(session))
        return self.measure(body, session, plain, exact=True)(candidates[0]).tokens

    async def count_input(self, body: dict[str, Any], session: str | None,
                          raw: bytes | None = None) -> int:
        """count_tokens: the upstream's own count where the API of the provider this request
        would go to has one (a Messages endpoint that documents it), else `count_tokens`'s
        estimate (also when that count fails). `raw`: as for `routed`."""
        plain = estimate_request_tokens(body, raw=raw)
        candidate = self.router.candidates(body, plain, self.sessions.previous(session))[0]
        counted = await self._counted_upstream(body, candidate)
        if counted is not None:
            return counted
        return self.measure(body, session, plain, exact=True)(candidate).tokens

    async def _counted_upstream(self, body: dict[str, Any], candidate: Candidate) -> int | None:
        provider = self.providers[candidate.provider]
        settings = self.settings_of(provider)
        build = Build(candidate.model, provider.refusals,
                      opaque_for=self.opaque_for(self.origin(provider, candidate.model)),
                      betas=current_record().betas)
        try:
            return await api_for(candidate.model, settings).count_tokens(
                provider.client, body, settings, build)
        except ProxyError as error:
            logger.info("provider %s could not count tokens (%d %s); using the estimate",
                        provider.name, error.status, error.error_type)
            return None

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

    def _all_failed(self, walk: CandidateWalk, estimate: int) -> ProxyError:
        """The client's error once every candidate failed: a lone candidate's own error (as
        with one provider), else the overflow in Claude Code's words, else 429 until the
        soonest cooldown ends, else 529 (which lets Claude Code's fallback model act)."""
        failures = walk.failures
        if len(failures) == 1 and not walk.skipped:
            error = failures[0][1]
            return context_overflow(error, estimate) or error
        for _, error in failures:
            overflow = context_overflow(error, estimate)
            if overflow is not None:
                return overflow
        if failures and all(classify(e) in ("credential", "misconfigured") for _, e in failures):
            return failures[0][1]
        summary = "; ".join(f"{c.provider},{c.model}: {e.status} {e.message}"[:300]
                            for c, e in failures)
        cooling = [p.health.reopens_at() - p.health.clock() for p in self.providers.values()
                   if p.health.is_cooling()]
        if cooling:
            seconds = max(1, math.ceil(min(cooling)))
            return ProxyError(429, f"every provider failed or is cooling down ({summary})",
                              error_type="rate_limit_error",
                              headers={"retry-after": str(seconds)})
        return ProxyError(529, f"every provider failed ({summary})",
                          error_type="overloaded_error")

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
                                     needs_reasoning(self.settings_of(provider)))
        body = edited.body
        upstream = self.convert(provider, candidate.model, body, cache_key, turns)
        for _ in range(LEARNED_RETRIES):
            try:
                return (Attempt(provider, candidate, upstream, fit, edited.applied),
                        await _timed_send(provider, upstream, send))
            except ProxyError as error:
                if not await self._learned(provider, candidate.model, error, upstream):
                    raise
            upstream = self.convert(provider, candidate.model, body, cache_key, turns)
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
        converter = self.converter(body, attempt)
        guard = converter.guard
        if guard is None or not guard.repairs or not self.settings_of(
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
                 and self.settings_of(attempt.provider).tool_guard_reask else None)
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
        converter = self.converter(body, attempt)
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
        self.converter.resume(service.converter(retry, attempt))
        return stream

    async def aclose(self) -> None:
        await self.stream.aclose()


def tool_call_reporter(metrics: Metrics, provider: str, model: str) -> Report:
    """What is said of each tool call the guard saw: counted (by provider, model and
    outcome, and each repair by kind), kept on the request's record (the inspector, the
    dashboard, OpenTelemetry; the original arguments of a call that was not valid), and one
    log line for every call that was not valid, its client values escaped."""
    record = current_record()

    def report(call: CallReport) -> None:
        metrics.tool_calls_of(provider, model, call.outcome).inc()
        for kind in call.kinds:
            metrics.tool_repairs_of(provider, model, metric_kind(kind)).inc()
        if call.outcome == "valid":
            record.tool_calls.append({"tool": call.tool, "outcome": "valid"})
            return
        record.tool_calls.append(call.as_dict())
        logger.log(logging.WARNING if call.outcome == "invalid" else logging.INFO,
                   "tool call provider=%s model=%s tool=%s outcome=%s kinds=%s bytes=%d->%s "
                   "error=%s", provider, model, shown(call.tool), call.outcome,
                   shown(",".join(call.kinds)), len(call.original),
                   "+".join(str(len(sent)) for sent in call.sent) or "-",
                   shown(call.error or "-"))
    return report


def shown(value: str, limit: int = 200) -> str:
    """A value from the upstream or the client as a log line may carry it: quoted, its
    control characters and line breaks escaped, cut at `limit` characters."""
    return repr(value[:limit] + ("…" if len(value) > limit else ""))


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
