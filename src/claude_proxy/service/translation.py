"""What one candidate is sent, and what turns its answer into events: the request converted
in the API the provider takes for the model (with the profile its server was recognised as),
thinking signed for its origin, and the converter with its tool-call guard and judge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion import safeguards
from claude_proxy.conversion.reasoning import OpaqueFor
from claude_proxy.conversion.request_converter import UpstreamRequest
from claude_proxy.conversion.response_converter import StreamConverter
from claude_proxy.conversion.reuse import Slot
from claude_proxy.conversion.signatures import Origin, ThinkingSigner, restore_hidden_thinking
from claude_proxy.conversion.tool_guard import CallReport, Report, ToolGuard
from claude_proxy.conversion.tool_schemas import OfferedTools, metric_kind
from claude_proxy.metrics import Metrics
from claude_proxy.record import current_record
from claude_proxy.routing.providers import Provider
from claude_proxy.service.failover import Attempt
from claude_proxy.state.store import StateStore
from claude_proxy.upstream import llamacpp
from claude_proxy.upstream.api import Build, api_for, api_of

logger = logging.getLogger("claude_proxy.service")

BodyStep = Callable[[dict[str, Any]], dict[str, Any]]
"""A change to the client's body before it is converted, handed in by a layer above (the web
search's replay of earlier searches as text): the service knows no feature above it."""


def unchanged(body: dict[str, Any]) -> dict[str, Any]:
    return body


SERVER_PROFILE_KEY = "server-profile:"
"""Store records: the profile a provider's server was recognised as (per provider name)."""
SERVER_PROFILE_TTL = 3600.0
"""Refreshed by the next answer that says so; a server swapped for another is relearned."""


class Translator:
    """The request converted for the provider that takes it, and the converter of its answer:
    the profile the provider's server was recognised as, the reasoning given back to its
    origin only, the tool-call guard and the safeguards' judge."""

    def __init__(self, providers: dict[str, Provider], signer: ThinkingSigner, metrics: Metrics,
                 store: StateStore, replay: BodyStep = unchanged,
                 judge: safeguards.Judge | None = None) -> None:
        self.replay = replay
        """Earlier turns' blocks of features above this layer, as the upstream can take them."""
        self.judge = judge
        """Judges a reply's tool calls for a request with `safeguards` (`judge.py`, set by
        the app when a judge route is configured); None: `unsupported` is answered."""
        self.store = store
        self.signer = signer
        self.metrics = metrics
        self._recognised: dict[str, ProviderSettings] = {}
        for provider in providers.values():
            if llamacpp.recognisable(provider.settings):
                provider.client.on_headers = partial(self._note_server, provider.name)

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
        """The provider's settings, with the profile its server was recognised as (the store
        is read only for a provider whose profile is a guess: asked twice a request)."""
        if not llamacpp.recognisable(provider.settings):
            return provider.settings
        known = self.store.get(SERVER_PROFILE_KEY + provider.name)
        profile = known.get("profile") if known else None
        if not isinstance(profile, str):
            return provider.settings
        cached = self._recognised.get(provider.name)
        if cached is None or cached.provider != profile:
            cached = provider.settings.model_copy(update={"provider": profile})
            self._recognised[provider.name] = cached
        return cached

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
