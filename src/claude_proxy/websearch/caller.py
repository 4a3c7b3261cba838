"""The flow's view of the service: which provider answers, and its two kinds of model call.

Kept in one small adapter so that the flow does not depend on how the service picks and
calls providers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from claude_proxy.config import ProviderSettings
from claude_proxy.conversion.response_converter import collect_message, convert_chunks
from claude_proxy.service import MessagesService


class ServiceCaller:
    def __init__(self, service: MessagesService) -> None:
        self.service = service

    def provider_for(self, body: dict[str, Any]) -> ProviderSettings:
        return self.service.settings

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed model call as an Anthropic Message."""
        return await self.service.create(body)

    async def create_native(
            self, body: dict[str, Any],
            extra: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One non-streamed call with the provider's search switch (`extra` of the converted
        body): the raw completion (its sources) and the Anthropic Message."""
        service = self.service
        upstream = service.convert(body)
        raw = {k: v for k, v in upstream.body.items() if k not in ("stream", "stream_options")}
        raw.update(extra(raw))
        completion = await service.client.complete(raw)
        chunks = service.client._generate_buffered_stream_chunks(completion)
        return completion, collect_message(convert_chunks(chunks,
                                                          service.converter(body, upstream)))
