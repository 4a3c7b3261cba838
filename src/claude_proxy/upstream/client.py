"""The only module that talks to the upstream: OpenAI-compatible `/chat/completions`, and
`/responses` for OpenAI reasoning models.

One pooled `httpx.AsyncClient` per provider, on aiohttp's transport (`transport.py`).
Failures before the first byte are retried by `RetryPolicy` and end as a `ProxyError`
carrying the upstream's status; the client then gets a real HTTP error instead of a 200
followed by a broken stream. A streaming request is only handed
back once its first chunk has arrived, so an error announced in that chunk still has a status.
Both APIs share the pool, the retries and this first-byte rule; what differs (which events
only announce a response, where an error hides, how a whole JSON answer becomes a stream) is a
`Wire`, defined next to each API's parser in `upstream/`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from typing import Any, Protocol, TypeVar

import httpx
import orjson

from claude_proxy.config.settings import ProviderSettings
from claude_proxy.conversion.reuse import Prewritten, Spliced
from claude_proxy.errors import ProxyError
from claude_proxy.logs import MIN_SECRET_LENGTH
from claude_proxy.record import current_record, current_trace, mark
from claude_proxy.upstream import chat_completions, messages, responses
from claude_proxy.upstream.misconfigured import MisconfiguredUpstream, recognise
from claude_proxy.upstream.overflow import from_payload, from_upstream
from claude_proxy.upstream.retry import RetryPolicy
from claude_proxy.upstream.sse_data import DataReader
from claude_proxy.upstream.transport import AiohttpTransport, OneShotBody, UpstreamHttpClient
from claude_proxy.upstream.wire import CHAT_WIRE, Wire

logger = logging.getLogger("claude_proxy.upstream")

Chunk = dict[str, Any]
T = TypeVar("T")

EAGER_CHUNKS = 2
"""The first chunks of a stream, each handed on as soon as it is parsed (the opening, then
normally the first text), so that an upstream sending a burst in one read (a fast or local
server, a buffered reply) has its first words sent before the rest of the read is parsed and
converted (20 chunks: ~0.2 ms)."""

LOGGED_MESSAGE_CHARS = 300
"""How much of an upstream's error message a log line carries."""


EXACT_BELOW = 64 * 1024
"""Request bodies shorter than this are copied into bytes of their own size (`encoded`)."""


def encoded(body: dict[str, Any]) -> bytes | Spliced:
    """The request body as JSON, as bytes that hold no more memory than their length when
    they are short. orjson 3.12 and later return their working buffer, which they never
    shrink: 4 KiB at least, 32 KiB for 3 KB of JSON, 256 KiB for 20 KB, and from 64 KB on
    the next power of two (1 MiB for 800 KB). The request's record keeps the body for the
    inspector while the answer is open and in its ring after, so a stream's few hundred
    bytes held 4 KiB each. Copying a short body costs 0.2 µs at 100 bytes and 1.5 µs at 50
    KB (in a loop), where orjson's buffer is 2.6 to 40 times its length; a long one is
    kept as orjson made it (at most twice its length), where the copy would cost 20 µs at
    800 KB in a loop, more in the server. A session's next turn is written where it changed
    only, in pieces that share the earlier body's bytes (conversion/reuse.py `Spliced`)."""
    if type(body) is Prewritten:
        return body.written()
    content = orjson.dumps(body)
    return bytes(memoryview(content)) if len(content) < EXACT_BELOW else content


class Batches(Protocol):
    """What the relay reads an answer from: an `UpstreamStream`, or one that goes on with
    another answer in its place (TOOL_GUARD_REASK, `service.ReaskingStream`)."""

    @property
    def complete(self) -> bool: ...

    @property
    def said_done(self) -> bool: ...

    def __aiter__(self) -> Batches: ...

    async def __anext__(self) -> list[Chunk]: ...

    async def aclose(self) -> None: ...


class UpstreamStream:
    """An open upstream response yielding batches of parsed chunks, one batch per network
    read (so the events made from one read go to the client in one write), its first chunk
    already read. `complete` tells, at the end, whether the upstream said `[DONE]`."""

    def __init__(self, response: httpx.Response | None,
                 batches: AsyncGenerator[list[Chunk], None] | None = None,
                 wire: Wire = CHAT_WIRE) -> None:
        self._response = response
        self._batches = batches if batches is not None else self._read_sse()
        self._first: list[Chunk] = []
        self._wire = wire
        self.complete = batches is not None  # a buffered answer is whole by construction
        self.said_done = False
        """The batch that ended in `[DONE]` has been handed out: nothing more will come, though
        the rest of the body (its terminator) is still to be read by going on iterating."""

    async def prefetch(self) -> None:
        """Read ahead to the first chunk that is more than a preamble (raising ProxyError if
        the stream fails before it)."""
        async for batch in self._batches:
            self._first.extend(batch)
            if any(not self._wire.is_preamble(chunk) for chunk in batch):
                break
        for chunk in self._first:
            error = self._wire.error_of(chunk)
            if error:
                raise from_payload(error)
            if not self._wire.is_preamble(chunk):
                break

    def first_chunk(self) -> Chunk | None:
        """The first chunk read ahead (before iterating), None if there is none."""
        return self._first[0] if self._first else None

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> list[Chunk]:
        """The next batch, the prefetched one first. (An iterator, not a generator: one
        generator and its frame less per open stream.) `complete` is set as `[DONE]` is
        read, before its batch comes out; a buffered answer is whole from the start, its one
        batch the last."""
        if self._first:
            batch, self._first = self._first, []
        else:
            batch = await anext(self._batches)
        self.said_done = self.complete
        return batch

    async def aclose(self) -> None:
        await self._batches.aclose()
        if self._response is not None:
            await self._response.aclose()

    async def _read_sse(self) -> AsyncGenerator[list[Chunk], None]:
        """The `data:` payloads of each network read, parsed, until `[DONE]`.

        The SSE framing is read from the bytes (upstream/sse_data.py), one network read at a
        time so that a read's chunks stay together, and each payload is parsed from its
        bytes. A malformed JSON payload is skipped and logged.

        After `[DONE]` the body is still read to its end (the chunked-encoding terminator that
        follows it), without waiting for it: a response closed before its end takes its
        connection with it, and the next request would pay for a new one.
        """
        assert self._response is not None
        reader = DataReader()
        reads = _body_reads(self._response)
        done = False
        eager = EAGER_CHUNKS
        ends = self._wire.ends
        try:
            async for data in reads:
                if done:
                    continue
                batch: list[Chunk] = []
                handed = False  # part of this read went out already (eagerly)
                for payload in reader.feed(data):
                    if not payload:
                        continue
                    if payload.strip() == b"[DONE]":
                        self.complete = done = True
                        break
                    chunk = _parse_chunk(payload)
                    if chunk is None:
                        continue
                    batch.append(chunk)
                    if ends is not None and ends(chunk):
                        self.complete = done = True
                        break
                    if eager and not self._wire.is_preamble(chunk):
                        eager -= 1  # out before the rest of the read is parsed
                        yield batch
                        batch, handed = [], True
                chunk, payload = None, b""  # nothing of this read is kept while the next is awaited
                if batch or done or not handed:
                    yield batch  # possibly empty (a comment): the relay still sees time pass
        except httpx.HTTPError as exc:
            if done:
                return  # the answer was whole; only its connection is lost
            raise _transport_error(exc) from exc


_Endpoint = tuple[httpx.URL, dict[str, httpx.Headers], httpx.AsyncBaseTransport]


class OpenAIClient:
    def __init__(self, settings: ProviderSettings,
                 transport: httpx.AsyncBaseTransport | None = None,
                 on_retry: Callable[[], None] | None = None):
        self._on_retry = on_retry
        self._policy = RetryPolicy(settings.max_retries, settings.retry_base_delay,
                                   settings.retry_max_delay)
        timeout = httpx.Timeout(settings.request_timeout, connect=settings.connect_timeout)
        # aiohttp's pool (transport.py) keeps idle connections in a queue: unlike httpcore's,
        # it does not scan them per request, so every idle connection may be kept.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = UpstreamHttpClient(timeout=timeout, limits=limits, transport=transport)
        self.url = f"{settings.openai_base_url}/chat/completions"
        self.responses_url = responses.endpoint(settings).url
        self.messages_url = messages.endpoint(settings)
        self._messages_headers = messages.auth_headers(settings)
        self._params = ({"api-version": settings.azure_api_version}
                        if settings.azure_api_version else {})
        self._headers = self._auth_headers(settings)
        self._endpoints: dict[tuple[str, tuple[tuple[str, str], ...]], _Endpoint] = {}
        self._extensions = {"timeout": timeout.as_dict()}
        self._secrets = settings.upstream_secrets()
        self.on_headers: Callable[[httpx.Headers], None] | None = None
        """Shown every answer's headers (how the service recognises llama-server)."""

    @staticmethod
    def _auth_headers(settings: ProviderSettings) -> dict[str, str]:
        key = settings.openai_api_key.get_secret_value()
        headers = {"content-type": "application/json"}
        if not key:
            return headers
        if settings.is_azure:
            headers["api-key"] = key
        else:
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def aclose(self) -> None:
        await self._client.aclose()

    def connection_counts(self) -> dict[str, int]:
        """Open upstream connections, busy and idle (for tests and metrics)."""
        transport = self._client._transport  # httpx-private (httpx is bounded <1 for it)
        if isinstance(transport, AiohttpTransport):
            return transport.connection_counts()
        pool = getattr(transport, "_pool", None)
        connections = list(getattr(pool, "connections", []))
        idle = sum(1 for connection in connections if connection.is_idle())
        return {"active": len(connections) - idle, "idle": idle}

    # ------------------------------------------------------------ requests

    async def complete(self, body: dict[str, Any]) -> Chunk:
        """A non-streaming completion as the upstream's JSON body."""
        return await self._complete(self.url, body, self._params)

    async def open_stream(self, body: dict[str, Any]) -> UpstreamStream:
        """A streaming completion, opened and read up to its first chunk."""
        return await self._open_stream(self.url, body, self._params, CHAT_WIRE)

    async def respond(self, body: dict[str, Any]) -> Chunk:
        """A non-streaming `/responses` answer as its JSON body (a failed one raises)."""
        answer = await self._complete(self.responses_url, body, {})
        error = responses.WIRE.error_of(answer)
        if error:
            raise self._redacted(from_payload(error))
        return answer

    async def open_response_stream(self, body: dict[str, Any]) -> UpstreamStream:
        """A streaming `/responses` answer, read up to its first event after
        `response.created`/`in_progress` (so an early `response.failed` still has a status)."""
        return await self._open_stream(self.responses_url, body, {}, responses.WIRE)

    async def message(self, body: dict[str, Any], headers: Mapping[str, str]) -> Chunk:
        """A non-streaming Messages API answer (`/v1/messages`) as its JSON body; `headers`:
        the request's own (`anthropic-beta`)."""
        return await self._complete(self.messages_url, body, {}, self._messages_headers,
                                    headers)

    async def count_message_tokens(self, body: dict[str, Any],
                                   headers: Mapping[str, str]) -> Chunk:
        """The endpoint's own `/v1/messages/count_tokens` answer (`{"input_tokens": N}`)."""
        return await self._complete(self.messages_url + messages.COUNT_PATH, body, {},
                                    self._messages_headers, headers)

    async def open_message_stream(self, body: dict[str, Any],
                                  headers: Mapping[str, str]) -> UpstreamStream:
        """A streaming Messages API answer, read up to its first event after `message_start`
        (so an early `error` event still has a status)."""
        return await self._open_stream(self.messages_url, body, {}, messages.WIRE,
                                       self._messages_headers, headers)

    async def _complete(self, url: str, body: dict[str, Any], params: dict[str, str],
                        own: Mapping[str, str] | None = None,
                        extra: Mapping[str, str] | None = None) -> Chunk:
        async def attempt() -> Chunk:
            response = await self._send(url, body, params, accept="application/json",
                                        own=own, extra=extra)
            try:
                content = await response.aread()
            except httpx.HTTPError as exc:
                raise _transport_error(exc) from exc
            finally:
                await response.aclose()
            answer = _parse_json_body(content)
            _describe_to_trace(answer)
            return answer

        return await self._with_retries(attempt)

    async def _open_stream(self, url: str, body: dict[str, Any], params: dict[str, str],
                           wire: Wire, own: Mapping[str, str] | None = None,
                           extra: Mapping[str, str] | None = None) -> UpstreamStream:
        async def attempt() -> UpstreamStream:
            response = await self._send(url, body, params, accept="text/event-stream",
                                        own=own, extra=extra)
            stream = self._wrap(response, wire)
            try:
                await stream.prefetch()
            except BaseException:
                # Failed, or the client went away (cancelled): never leave it open.
                await stream.aclose()
                raise
            _describe_to_trace(stream.first_chunk())
            return stream

        return await self._with_retries(attempt)

    async def open_buffered_stream(self, body: dict[str, Any]) -> UpstreamStream:
        """A non-streaming completion, replayed as chunks (for models that stream badly)."""
        completion = await self.complete(body)
        return UpstreamStream(None, _one_batch(self._generate_buffered_stream_chunks(completion)))

    @staticmethod
    def _wrap(response: httpx.Response, wire: Wire) -> UpstreamStream:
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" in content_type:
            return UpstreamStream(response, wire=wire)
        # The upstream ignored `stream` and answered with one JSON body.
        return UpstreamStream(response, _buffered_batches(response, wire), wire=wire)

    async def _with_retries(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` until it succeeds or the policy gives up; nothing has reached the
        client yet, so every retryable failure (connection, 429, 5xx) may be tried again."""
        for number in itertools.count():
            try:
                return await attempt()
            except ProxyError as error:
                self._redacted(error)
                if not self._policy.should_retry(number, error.status):
                    status = (error.upstream_status if isinstance(error, MisconfiguredUpstream)
                              else error.status)
                    logger.warning("upstream failed (%d %s): %s; not retried", status,
                                   error.error_type, logged_message(error))
                    raise
                delay = self._policy.delay(number, error.headers.get("retry-after"))
                logger.warning("upstream failed (%d %s): %s; retry %d in %.2fs", error.status,
                               error.error_type, logged_message(error), number + 1, delay)
                mark("retry", f"{error.status} {error.error_type}, again in {delay:.2f}s")
                if self._on_retry is not None:
                    self._on_retry()
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _redacted(self, error: ProxyError) -> ProxyError:
        """An upstream that echoes a key in its error message must not leak it to clients."""
        for secret in self._secrets:
            if len(secret) >= MIN_SECRET_LENGTH and secret in error.message:
                error.message = error.message.replace(secret, "[REDACTED]")
        return error

    async def _send(self, url: str, body: dict[str, Any], params: dict[str, str], *,
                    accept: str, own: Mapping[str, str] | None = None,
                    extra: Mapping[str, str] | None = None) -> httpx.Response:
        """One POST; a non-2xx answer or a network failure raises ProxyError. `own`: the
        endpoint's headers in place of the client's (its API's auth), `extra`: this
        request's."""
        target, headers_for, transport = self._endpoint(url, params)
        content = current_record().upstream_json = encoded(body)  # for the inspector
        # A copy shares the prepared headers' tuples (made anew, each request's copy of them
        # was kept for as long as its answer is open).
        headers = self._prepared_headers(target, headers_for, accept,
                                         self._headers if own is None else own).copy()
        if extra:
            headers.update(extra)
        headers["content-length"] = str(len(content))
        trace = current_trace()
        if trace is not None:  # OpenTelemetry on: the attempt's traceparent
            trace.inject(headers)
        request = httpx.Request("POST", target, headers=headers, stream=OneShotBody(content),
                                extensions=self._extensions)
        try:
            response = await self._hand_to_transport(transport, request)
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        if self.on_headers is not None:
            self.on_headers(response.headers)
        if response.status_code < 400:
            return response
        raise await _read_error(response)

    async def _hand_to_transport(self, transport: httpx.AsyncBaseTransport,
                                 request: httpx.Request) -> httpx.Response:
        """The request handed to the endpoint's transport, the one `client.send` would pick.
        `send` itself wraps every answer for what the proxy does not use (auth flows,
        redirects, event hooks, cookies, elapsed time): 46 µs of CPU a request, measured."""
        if self._client.is_closed:  # shutting down: no new connection, no new session
            raise httpx.ConnectError("the upstream client is closed", request=request)
        return await transport.handle_async_request(request)

    def _endpoint(self, url: str, params: dict[str, str]) -> _Endpoint:
        """The endpoint's parsed URL, its headers per `accept` and its transport (direct, or
        an environment proxy's), made once (`client.build_request` parsed and merged the
        URL, the client's headers and cookies on every request: a third of httpx's cost)."""
        key = (url, tuple(params.items()))
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            target = httpx.URL(url, params=params or None)
            # httpx-private: the transport `send` would pick (mounts, proxies); httpx is
            # bounded <1 in pyproject.toml for it.
            endpoint = self._endpoints[key] = (target, {},
                                               self._client._transport_for_url(target))
        return endpoint

    def _prepared_headers(self, target: httpx.URL, made: dict[str, httpx.Headers],
                          accept: str, own: Mapping[str, str]) -> httpx.Headers:
        """The host, the client's default headers (user agent, accepted encodings) and ours,
        merged as build_request merged them."""
        headers = made.get(accept)
        if headers is None:
            headers = made[accept] = httpx.Headers({"host": target.netloc.decode("ascii")})
            headers.update(self._client.headers)
            headers.update({**own, "accept": accept})
        return headers

    @staticmethod
    def _generate_buffered_stream_chunks(response: Chunk) -> Iterator[Chunk]:
        """Cut one JSON completion into stream chunks (see chat_completions.buffered_chunks)."""
        return chat_completions.buffered_chunks(response)


async def _read_error(response: httpx.Response) -> ProxyError:
    """The client's error for a non-2xx answer; one that no retry can fix (a server not set
    up for the request) becomes a 400 saying what to change (upstream/misconfigured.py)."""
    try:
        content = await response.aread()
    except httpx.HTTPError:
        content = b""
    finally:
        await response.aclose()
    return recognise(from_upstream(response.status_code, content, dict(response.headers)))


def logged_message(error: ProxyError) -> str:
    """An upstream error's message for a log line: one line, capped (the log filter redacts
    keys; `_redacted` has already taken out this provider's own)."""
    text = " ".join(error.message.split())
    if len(text) > LOGGED_MESSAGE_CHARS:
        text = text[:LOGGED_MESSAGE_CHARS] + "…"
    return repr(text)


def _transport_error(exc: httpx.HTTPError) -> ProxyError:
    """A network failure as the client's error; the message names the failure, not the URL."""
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(504, f"upstream timed out ({type(exc).__name__})",
                          error_type="timeout_error")
    return ProxyError(502, f"upstream connection failed ({type(exc).__name__})",
                      error_type="overloaded_error")


def _describe_to_trace(answer: Chunk | None) -> None:
    """The upstream's own model and response id, for the attempt's span when OpenTelemetry is
    on: a Chat Completions body or chunk names them at its top, a Responses event in its
    `response`, a Messages stream's `message_start` in its `message`."""
    trace = current_trace()
    if trace is None or not answer:
        return
    inner = answer.get("response") or answer.get("message")
    described = inner if isinstance(inner, dict) else answer
    trace.responded(described.get("model"), described.get("id"))


def _parse_json_body(content: bytes) -> Chunk:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(502, "upstream returned a body that is not JSON",
                         error_type="api_error") from exc
    if not isinstance(data, dict):
        raise ProxyError(502, "upstream returned an unexpected JSON body", error_type="api_error")
    if data.get("error"):
        raise from_payload(data["error"])
    return data


async def _one_batch(chunks: Iterator[Chunk]) -> AsyncGenerator[list[Chunk], None]:
    yield list(chunks)


async def _buffered_batches(response: httpx.Response,
                            wire: Wire) -> AsyncGenerator[list[Chunk], None]:
    try:
        content = await response.aread()
    except httpx.HTTPError as exc:
        raise _transport_error(exc) from exc
    yield list(wire.buffered(_parse_json_body(content)))


def _body_reads(response: httpx.Response) -> AsyncIterable[bytes]:
    """The body one network read at a time: what `aiter_bytes` gives, without its layers
    when there is nothing to decompress (httpx's generators, chunkers and buffers between the
    transport and the bytes cost ~4 KiB per open stream)."""
    stream = response.stream
    if "content-encoding" in response.headers or not isinstance(stream, httpx.AsyncByteStream):
        return response.aiter_bytes()
    response.is_stream_consumed = True
    return stream


def _parse_chunk(data: bytes) -> Chunk | None:
    """An event's JSON object. Bytes that are not UTF-8 are read with U+FFFD in their place
    (as the text decoder before the bytes reader did), rather than dropping the chunk."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            chunk = orjson.loads(data.decode("utf-8", errors="replace"))
        except orjson.JSONDecodeError:
            logger.warning("skipping a malformed upstream chunk (%d bytes)", len(data))
            return None
    return chunk if isinstance(chunk, dict) else None
