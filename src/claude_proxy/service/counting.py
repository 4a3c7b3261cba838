"""How many input tokens a request is, for a candidate: the calibrated estimate the
pre-flight and the router weigh, and count_tokens (the upstream's own count where its API has
one).
"""

from __future__ import annotations

import logging
from typing import Any

from claude_proxy.config.file import ProxyConfig
from claude_proxy.errors import ProxyError
from claude_proxy.record import current_record
from claude_proxy.routing import calibration, preflight
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.router import Candidate, Router
from claude_proxy.routing.sessions import SessionSizes
from claude_proxy.routing.tokens import encoding_name, estimate_request_tokens
from claude_proxy.service.translation import Translator
from claude_proxy.state.store import StateStore
from claude_proxy.upstream.api import Build, api_for

logger = logging.getLogger("claude_proxy.service")

EXACT_NEAR_WINDOW = 0.5
"""On the request path, an OpenAI-family request is tokenized exactly (before the upstream has
measured its conversation) once its plain estimate reaches this share of the window: below
it, four characters a token is not wrong by enough to matter."""


class TokenCounter:
    """Input tokens of a request for a candidate, calibrated by what the upstream reported
    for the session (routing/calibration.py)."""

    def __init__(self, config: ProxyConfig, store: StateStore, router: Router,
                 sessions: SessionSizes, providers: dict[str, Provider],
                 translator: Translator) -> None:
        self.config = config
        self.store = store
        self.router = router
        self.sessions = sessions
        self.providers = providers
        self.translator = translator

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

    async def count_input(self, body: dict[str, Any], session: str | None,
                          raw: bytes | None = None) -> int:
        """count_tokens: the upstream's own count where the API of the provider this request
        would go to has one (a Messages endpoint that documents it), else the calibrated input
        estimate (exact for OpenAI-family models; also when that count fails). `raw`: as for
        `routed`."""
        plain = estimate_request_tokens(body, raw=raw)
        candidate = self.router.candidates(body, plain, self.sessions.previous(session))[0]
        counted = await self._counted_upstream(body, candidate)
        if counted is not None:
            return counted
        return self.measure(body, session, plain, exact=True)(candidate).tokens

    async def _counted_upstream(self, body: dict[str, Any], candidate: Candidate) -> int | None:
        provider = self.providers[candidate.provider]
        settings = self.translator.settings_of(provider)
        build = Build(candidate.model, provider.refusals,
                      opaque_for=self.translator.opaque_for(
                          self.translator.origin(provider, candidate.model)),
                      betas=current_record().betas)
        try:
            return await api_for(candidate.model, settings).count_tokens(
                provider.client, body, settings, build)
        except ProxyError as error:
            logger.info("provider %s could not count tokens (%d %s); using the estimate",
                        provider.name, error.status, error.error_type)
            return None
