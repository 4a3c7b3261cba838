"""One Messages request from validated body to upstream answer: conversion, the reasoning
fallback, and the converter that turns the answer into Anthropic events.

Kept apart from `app.py` (HTTP framing) and `upstream.py` (the network), so the flow reads in
one place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from claude_proxy.access import current_record, record_usage
from claude_proxy.capabilities import (
    OPTIONAL_FIELDS,
    REASONING,
    Refusals,
    names_added_field,
    refused_optional_fields,
)
from claude_proxy.config import Settings
from claude_proxy.conversion.request_converter import (
    UpstreamRequest,
    convert_request,
    map_model,
)
from claude_proxy.conversion.response_converter import (
    StreamConverter,
    collect_message,
    convert_chunks,
)
from claude_proxy.conversion.signatures import ThinkingSigner
from claude_proxy.errors import ProxyError, context_overflow
from claude_proxy.metrics import Metrics
from claude_proxy.tokens import estimate_request_tokens
from claude_proxy.upstream import OpenAIClient, UpstreamStream
from claude_proxy.websearch.blocks import replay_blocks

logger = logging.getLogger("claude_proxy.service")

T = TypeVar("T")


class MessagesService:
    def __init__(self, settings: Settings, client: OpenAIClient, signer: ThinkingSigner,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.client = client
        self.signer = signer
        self.metrics = metrics
        self.refusals = Refusals()

    def is_ours(self, block: dict[str, Any]) -> bool:
        """Our own thinking block: its signature verifies. A block with an empty signature
        (from a proxy that did not sign) is plain text the client showed, and counts too;
        any other signature (e.g. a real Anthropic one) does not."""
        signature = block.get("signature")
        if not signature:
            return True
        return isinstance(signature, str) and self.signer.verify(
            str(block.get("thinking", "")), signature)

    def convert(self, body: dict[str, Any]) -> UpstreamRequest:
        """The upstream request, minus whatever this model is known to refuse."""
        body = replay_blocks(body, self.signer)  # earlier web searches as text
        model = map_model(body["model"], self.settings)
        record = current_record()
        record.client_model, record.upstream_model = body["model"], model
        record.stream = bool(body.get("stream"))
        upstream = convert_request(body, self.settings, is_ours=self.is_ours,
                                   without_reasoning=self.refusals.refuses(model, REASONING))
        for name in OPTIONAL_FIELDS:
            if self.refusals.refuses(model, name):
                upstream.body.pop(name, None)
        logger.debug("upstream request model=%s extra_json: %s", model, upstream.extras)
        return upstream

    def converter(self, body: dict[str, Any], upstream: UpstreamRequest) -> StreamConverter:
        return StreamConverter(body["model"], input_tokens=estimate_request_tokens(body),
                               sign=self.signer.sign, think_tags=upstream.think_tags,
                               show_inline_thinking=upstream.thinking)

    async def _call(self, body: dict[str, Any],
                    send: Callable[[UpstreamRequest], Awaitable[T]]) -> tuple[UpstreamRequest, T]:
        """Send, rewording a context overflow the way Claude Code understands."""
        try:
            return await self._send_with_fallback(body, send)
        except ProxyError as error:
            self.metrics.count_upstream_error(error.error_type)
            overflow = context_overflow(error, estimate_request_tokens(body))
            if overflow is None:
                raise
            logger.info("upstream context overflow (%s) reworded as %r", error.message,
                        overflow.message)
            raise overflow from None

    async def _send_with_fallback(
            self, body: dict[str, Any],
            send: Callable[[UpstreamRequest], Awaitable[T]]) -> tuple[UpstreamRequest, T]:
        """Send; if the upstream refuses a field we added (an optional OpenAI field, or the
        reasoning fields), remember that for the model and send once more without it."""
        upstream = self.convert(body)
        try:
            return upstream, await send(upstream)
        except ProxyError as error:
            refused = self._refused_fields(error, upstream)
            if not refused:
                raise
            model = upstream.body["model"]
            what = (f"the reasoning fields {sorted(upstream.extras)}" if refused == [REASONING]
                    else ", ".join(refused))
            logger.warning("upstream model %s refused %s (%s); retrying without, and leaving "
                           "it out for this model from now on", model, what, error.message)
            for field in refused:
                self.refusals.remember(model, field)
            upstream = self.convert(body)
            return upstream, await send(upstream)

    @staticmethod
    def _refused_fields(error: ProxyError, upstream: UpstreamRequest) -> list[str]:
        if error.status != 400:
            return []
        optional = refused_optional_fields(error.message, upstream.body)
        if optional:
            return optional
        if upstream.extras and names_added_field(error.message, upstream.extras):
            return [REASONING]
        return []

    async def open_stream(self, body: dict[str, Any]) -> tuple[StreamConverter, UpstreamStream]:
        """The upstream stream, opened (errors before the first byte raise ProxyError)."""
        def send(upstream: UpstreamRequest) -> Awaitable[UpstreamStream]:
            if upstream.buffered:
                return self.client.open_buffered_stream(upstream.body)
            return self.client.open_stream(upstream.body)

        upstream, stream = await self._call(body, send)
        return self.converter(body, upstream), stream

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole Message, for non-streaming clients."""
        upstream, completion = await self._call(
            body, lambda upstream: self.client.complete(upstream.body))
        chunks = self.client._generate_buffered_stream_chunks(completion)
        converter = self.converter(body, upstream)
        message = collect_message(convert_chunks(chunks, converter))
        record_usage(message["usage"], converter.reasoning_tokens())
        return message
