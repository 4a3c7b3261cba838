"""The flow's view of the service: which provider a search request goes to, and its two
kinds of model call, both routed (with failover) like any other request.

Kept in one small adapter so that the flow does not depend on how the service picks and
calls providers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion.request_converter import UpstreamRequest
from claude_proxy.conversion.response_converter import collect_message, convert_chunks
from claude_proxy.errors import ProxyError
from claude_proxy.routing.providers import Provider
from claude_proxy.routing.tokens import estimate_request_tokens
from claude_proxy.service import MessagesService
from claude_proxy.upstream.api import api_of
from claude_proxy.upstream.client import Chunk

NativeSwitch = Callable[[ProviderSettings, str, dict[str, Any]], dict[str, Any] | None]
"""(provider settings, upstream API, converted body) → the fields that make it search."""


class ServiceCaller:
    def __init__(self, service: MessagesService) -> None:
        self.service = service

    def provider_for(self, body: dict[str, Any]) -> ProviderSettings:
        """The settings of the provider the router tries first for this request."""
        service = self.service
        candidates = service.router.candidates(body, estimate_request_tokens(body))
        name = candidates[0].provider if candidates else service.router.first
        return service.providers[name].settings

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed model call as an Anthropic Message."""
        return await self.service.create(body)

    async def create_native(self, body: dict[str, Any],
                            switch: NativeSwitch) -> tuple[Chunk, dict[str, Any]]:
        """One non-streamed call with the answering provider's search switch (the fields
        `switch` gives for its settings, API and converted body; None: it has none): the raw
        answer (its sources) and the Anthropic Message."""
        async def send(provider: Provider, upstream: UpstreamRequest) -> Chunk:
            raw = {k: v for k, v in upstream.body.items()
                   if k not in ("stream", "stream_options")}
            fields = switch(provider.settings, upstream.api, raw)
            if fields is None:
                raise ProxyError(501, f"provider {provider.name} has no native web search")
            return await api_of(upstream).send_once(
                provider.client, replace(upstream, body={**raw, **fields}))

        service = self.service
        attempt, answer = await service.routed(body, send, None)
        chunks = api_of(attempt.upstream).events_of(answer)
        converter = service.translator.converter(body, attempt)
        message = collect_message(convert_chunks(chunks, converter))
        return answer, message
