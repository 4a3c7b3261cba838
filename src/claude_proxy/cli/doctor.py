"""`claude-proxy doctor`: will Claude Code work with this configuration?

For each configured upstream model it sends a tiny request without reasoning (reachable, key
accepted, model known), one with the configured reasoning fields (which field carries the
reasoning text, if any), and one with a tool (Claude Code always sends tools). Requests go
through the proxy's own conversion, so they are exactly what the proxy would send. Models that
go to the Responses API are asked there, and the report says whether reasoning summaries came
back (or were refused) and whether encrypted reasoning did.

A small local model may make about 20 tokens a second and ramble to its limit, so every probe
asks for few tokens (8 for the basic request, 64 for the tool, 1 for llama-server's template
measure) and the streamed reasoning probe stops reading as soon as its verdict is known (the
first reasoning text says where reasoning is carried; a first answer with none before it says
there is none). Each line is printed as its check completes, and each provider gets a time
limit (`--time-limit`), after which its remaining checks are reported as not run, with how fast
the server answered those that finished and the limit that would let them all finish; a limit
reached is no verdict (exit status 3 when nothing failed).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from claude_proxy.config.file import ROUTE_NAMES, ProxyConfig
from claude_proxy.config.model_table import ModelFacts
from claude_proxy.config.settings import TIERS, ProviderSettings, SearchSettings
from claude_proxy.conversion.deltas import OpaqueReasoning, ReasoningText
from claude_proxy.conversion.request_converter import convert_request
from claude_proxy.errors import ProxyError
from claude_proxy.keys.usage_log import FILE_NAME
from claude_proxy.routing.discovery import discover, windows
from claude_proxy.routing.reach import reachable
from claude_proxy.routing.router import Router
from claude_proxy.server.wiring import data_dir
from claude_proxy.state import check_durability, check_store
from claude_proxy.upstream import llamacpp, responses
from claude_proxy.upstream.api import MESSAGES, Build, api_for
from claude_proxy.upstream.capabilities import Refusals
from claude_proxy.upstream.client import OpenAIClient, UpstreamStream
from claude_proxy.upstream.misconfigured import JINJA, MisconfiguredUpstream
from claude_proxy.websearch.backends import Query, SearchBackend, SearchFailed

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking", "reasoning_details")
CLOCK_TOOL = {"name": "get_time", "description": "Current time in ISO format",
              "input_schema": {"type": "object", "properties": {}}}
TIME_LIMIT = 60.0
"""Seconds each provider's checks may take (`--time-limit`)."""
REASONING_TOKENS = 256
"""The reasoning probe's max_tokens: reasoning comes first, and reading stops at it."""
ANSWER_WITHOUT_REASONING = 64
"""Characters of answer with no reasoning before them: the verdict is that none comes."""
TOOLS_TOKENS = 64
"""The tools probe's max_tokens: enough for a call, little for a model that answers in prose."""
RESPONSES_REASONING_TOKENS = 2048
PROBE_TOKENS = {"chat": 8 + REASONING_TOKENS + TOOLS_TOKENS,
                "responses": 8 + RESPONSES_REASONING_TOKENS + TOOLS_TOKENS,
                "messages": 8 + REASONING_TOKENS + TOOLS_TOKENS}
"""The most tokens one model's checks ask for, by API (llama-server's measure adds 2)."""
MARGIN = 1.5
"""The suggested --time-limit: the time the probes' tokens take at the measured speed, this
many times over, rounded up to ten seconds."""
NOT_CHECKED = 3
"""Exit status when nothing failed but the time limit cut checks: no verdict."""

Say = Callable[[str], None]
T = TypeVar("T")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    required: bool = True

    def line(self) -> str:
        mark = "ok" if self.ok else ("FAIL" if self.required else "warn")
        return f"    {self.name:<14} {mark:<5} {self.detail}".rstrip()


def output_tokens(answer: Any) -> int:
    """The tokens an answer says it generated (Chat Completions, Responses, Messages)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return 0
    count = usage.get("completion_tokens", usage.get("output_tokens"))
    return count if isinstance(count, int) else 0


@dataclass
class Pace:
    """How fast a provider's server answered the probes that finished: tokens generated per
    second, its reading of the prompt included (a slow local server's figure)."""

    tokens: int = 0
    seconds: float = 0.0

    async def timed(self, answer: Awaitable[T]) -> T:
        started = time.perf_counter()
        result = await answer
        self.seconds += time.perf_counter() - started
        self.tokens += output_tokens(result)
        return result

    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None


@dataclass
class ModelReport:
    """One model's checks, each said as it is added."""

    model: str
    tiers: list[str]
    say: Say
    checks: list[Check] = field(default_factory=list)
    pace: Pace = field(default_factory=Pace)
    """The provider's (shared by its models' reports)."""

    def add(self, *checks: Check) -> None:
        for check in checks:
            self.checks.append(check)
            self.say(check.line())

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(check.ok or not check.required
                                         for check in self.checks)


def describe_failure(error: ProxyError) -> Check:
    """The first check a failing basic request tells about."""
    if error.status in (502, 504) and "upstream" in error.message:
        return Check("reachable", False, error.message)
    if error.status in (401, 403):
        return Check("auth", False, f"{error.status}: {error.message}")
    if error.status == 404 or (error.status == 400 and "model" in error.message.lower()):
        return Check("model exists", False, f"{error.status}: {error.message}")
    return Check("basic request", False, f"{error.status} {error.error_type}: {error.message}")


def anthropic_request(model: str, **fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"model": model, "max_tokens": 8,
                               "messages": [{"role": "user", "content": "Reply with: ok"}]}
    request.update(fields)
    return request


async def first_verdict(stream: UpstreamStream,
                        judge: Callable[[dict[str, Any]], T | None]) -> T | None:
    """Read a stream's deltas until `judge` gives a verdict, then close it (the rest would
    only cost time on a slow server); None when the stream ended first."""
    try:
        async for batch in stream:
            for choice in (choice for chunk in batch for choice in chunk.get("choices") or []):
                verdict = judge(choice.get("delta") or {})
                if verdict is not None:
                    return verdict
    finally:
        await stream.aclose()
    return None


async def check_model(client: OpenAIClient, settings: ProviderSettings, model: str,
                      report: ModelReport) -> None:
    """The checks of the API the proxy would send `model` to (upstream/api.py picks it)."""
    await MODEL_CHECKS[api_for(model, settings).name](client, settings, model, report)


async def check_chat_model(client: OpenAIClient, settings: ProviderSettings, model: str,
                           report: ModelReport) -> None:
    """A /chat/completions model: reachable, then its reasoning fields, then tools."""
    plain = convert_request(anthropic_request(model, thinking={"type": "disabled"}), settings)
    try:  # not streamed, as before: a server refusing stream_options still passes here
        await report.pace.timed(client.complete(plain.body))
    except ProxyError as error:
        report.add(describe_failure(error))
        return
    report.add(Check("reachable", True), Check("auth", True), Check("model exists", True))
    report.add(await check_reasoning(client, settings, model))
    report.add(await check_tools(client, settings, model, report.pace))


class ReasoningJudge:
    """Reasoning comes before the answer: its first text says which field carries it; an
    answer of ANSWER_WITHOUT_REASONING characters with none before says there is none ({})."""

    def __init__(self) -> None:
        self.answer = ""

    def __call__(self, delta: dict[str, Any]) -> dict[str, int] | None:
        found = {name: len(str(delta[name])) for name in REASONING_FIELDS if delta.get(name)}
        self.answer += str(delta.get("content") or "")
        if "<think>" in self.answer:
            found["<think> tags"] = 1
        if found:
            return found
        return {} if len(self.answer.strip()) >= ANSWER_WITHOUT_REASONING else None


async def check_reasoning(client: OpenAIClient, settings: ProviderSettings, model: str) -> Check:
    request = anthropic_request(model, stream=True, thinking={"type": "adaptive"},
                                messages=[{"role": "user", "content": "What is 17 * 23?"}],
                                max_tokens=REASONING_TOKENS)
    upstream = convert_request(request, settings)
    sent = upstream.extras or "no reasoning fields for this model"
    try:
        stream = await client.open_stream(upstream.body)
    except ProxyError as error:
        return Check("reasoning", False, f"{sent} refused ({error.status}: {error.message}); "
                     "the proxy will fall back to sending none", required=False)
    try:
        found = await first_verdict(stream, ReasoningJudge())
    except ProxyError as error:
        return Check("reasoning", False, f"stream failed: {error.message}", required=False)
    if not found:
        return Check("reasoning", False, f"sent {sent}; no reasoning text came back",
                     required=False)
    where = ", ".join(f"{name} ({count} chars)" for name, count in found.items())
    return Check("reasoning", True, f"sent {sent}; text in {where}")


async def check_tools(client: OpenAIClient, settings: ProviderSettings, model: str,
                      pace: Pace) -> Check:
    """Not streamed (as before, so the verdicts stay those of a plain request), TOOLS_TOKENS
    at most."""
    request = anthropic_request(model, tools=[CLOCK_TOOL], thinking={"type": "disabled"},
                                max_tokens=TOOLS_TOKENS,
                                messages=[{"role": "user", "content":
                                           "What time is it? Use the get_time tool."}])
    try:
        completion = await pace.timed(client.complete(convert_request(request, settings).body))
    except ProxyError as error:
        return Check("tools", False, f"rejected ({error.status}: {error.message})")
    choices = completion.get("choices") or [{}]
    called = bool((choices[0].get("message") or {}).get("tool_calls"))
    return Check("tools", True, "accepted; the model called get_time" if called
                 else "accepted (the model answered without calling the tool)")


async def check_search_backend(settings: SearchSettings) -> Check:
    """One real search, as WebSearch would run it."""
    backend = SearchBackend(settings)
    try:
        hits = await backend.search(Query("claude-proxy doctor", max_results=3))
    except SearchFailed as failure:
        return Check("search", False, f"{failure.code}: {failure.reason}")
    finally:
        await backend.aclose()
    return Check("search", True, f"answered with {len(hits)} result{'s' * (len(hits) != 1)}")


async def check_responses_model(client: OpenAIClient, settings: ProviderSettings,
                                model: str, report: ModelReport) -> None:
    """A /responses model: reachable, then summaries and encrypted reasoning, then tools."""
    plain = responses.convert_request(anthropic_request(model, thinking={"type": "disabled"}),
                                      settings, model=model)
    try:
        await report.pace.timed(client.respond(plain.body))
    except ProxyError as error:
        report.add(describe_failure(error))
        return
    report.add(Check("reachable", True, "Responses API"), Check("auth", True),
               Check("model exists", True))
    report.add(*await check_responses_reasoning(client, settings, model))
    request = anthropic_request(model, tools=[CLOCK_TOOL], thinking={"type": "disabled"},
                                max_tokens=TOOLS_TOKENS, messages=[{"role": "user", "content":
                                                                    "What time is it? Use the "
                                                                    "get_time tool."}])
    try:
        answer = await report.pace.timed(client.respond(responses.convert_request(
            request, settings, model=model).body))
    except ProxyError as error:
        report.add(Check("tools", False, f"rejected ({error.status}: {error.message})"))
        return
    called = any(item.get("type") == "function_call" for item in answer.get("output") or [])
    report.add(Check("tools", True, "accepted; the model called get_time" if called
                     else "accepted (the model answered without calling the tool)"))


async def check_responses_reasoning(client: OpenAIClient, settings: ProviderSettings,
                                    model: str) -> list[Check]:
    """Ask with summaries; a 400 refusing them (an unverified organisation) is reported and
    the question asked again without, as the proxy itself would."""
    request = anthropic_request(model, thinking={"type": "adaptive"},
                                max_tokens=RESPONSES_REASONING_TOKENS,
                                messages=[{"role": "user", "content": "What is 17 * 23?"}])
    body = responses.convert_request(request, settings, model=model).body
    summaries = Check("summaries", True, "")
    try:
        answer = await client.respond(body)
    except ProxyError as error:
        if error.status != 400 or not responses.refused_summary(error.message):
            return [Check("reasoning", False, f"refused ({error.status}: {error.message})",
                          required=False)]
        summaries = Check("summaries", False, f"refused ({error.message}); the proxy sends "
                          "none for this model, thinking blocks stay empty", required=False)
        body = responses.convert_request(request, settings, model=model,
                                         without_summary=True).body
        try:
            answer = await client.respond(body)
        except ProxyError as retry_error:
            return [summaries, Check("encrypted", False, f"{retry_error.status}: "
                                     f"{retry_error.message}", required=False)]
    parser = responses.ResponsesParser()
    deltas = [d for event in responses.response_events(answer) for d in parser.parse(event)]
    text = sum(len(d.text) for d in deltas if isinstance(d, ReasoningText))
    opaque = [d.item for d in deltas if isinstance(d, OpaqueReasoning)
              and d.item.get("type") == "reasoning"]
    if summaries.ok:
        summaries = Check("summaries", bool(text), f"{text} chars of reasoning summary" if text
                          else "no summary came back", required=False)
    size = sum(len(str(item.get("encrypted_content", ""))) for item in opaque)
    encrypted = Check("encrypted", bool(opaque), f"{len(opaque)} reasoning item(s), {size} chars"
                      " (carried back in the thinking signature)" if opaque
                      else "no encrypted reasoning came back", required=False)
    return [summaries, encrypted]


def configured_models(settings: ProviderSettings,
                      routed: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The provider's models, each with the tiers and routes that use it."""
    uses: dict[str, list[str]] = {}
    for tier, name in zip(TIERS, ("opus", "sonnet", "haiku"), strict=True):
        uses.setdefault(settings.model_for_tier(tier), []).append(name)
    for model, route in routed:
        uses.setdefault(model, []).append(f"route {route}")
    return list(uses.items())



async def check_messages_model(client: OpenAIClient, settings: ProviderSettings, model: str,
                               report: ModelReport) -> None:
    """A Messages API model: reachable, the model that answers (an endpoint that maps
    unknown names to another model says so only in the answer's `model`), thinking, tools;
    each probe asks for few tokens (a slow local server answers in seconds)."""
    answer, failure = await _ask_messages(client, settings, model, anthropic_request(
        model, thinking={"type": "disabled"}), report.pace)
    if answer is None:
        report.add(failure or Check("basic request", False))
        return
    report.add(Check("reachable", True, "Messages API"), Check("auth", True),
               answered_model(model, answer.get("model")))
    request = anthropic_request(model, thinking={"type": "adaptive"},
                                max_tokens=REASONING_TOKENS,
                                messages=[{"role": "user", "content": "What is 17 * 23?"}])
    answer, failure = await _ask_messages(client, settings, model, request, report.pace)
    if answer is None:
        report.add(Check("reasoning", False, failure.detail if failure else "",
                         required=False))
    else:
        blocks = [b for b in answer.get("content") or [] if isinstance(b, dict)]
        text = sum(len(str(b.get("thinking", ""))) for b in blocks if b.get("type") == "thinking")
        signed = any(b.get("signature") for b in blocks if b.get("type") == "thinking")
        report.add(Check("reasoning", bool(text), f"{text} chars of thinking"
                         f"{', signed' if signed else ', unsigned'}" if text
                         else "no thinking block came back", required=False))
    request = anthropic_request(model, tools=[CLOCK_TOOL], thinking={"type": "disabled"},
                                max_tokens=TOOLS_TOKENS, messages=[{"role": "user", "content":
                                                                    "What time is it? Use the "
                                                                    "get_time tool."}])
    answer, failure = await _ask_messages(client, settings, model, request, report.pace)
    if answer is None:
        report.add(Check("tools", False, failure.detail if failure else ""))
        return
    called = any(isinstance(b, dict) and b.get("type") == "tool_use"
                 for b in answer.get("content") or [])
    report.add(Check("tools", True, "accepted; the model called get_time" if called
                     else "accepted (the model answered without calling the tool)"))


async def _ask_messages(client: OpenAIClient, settings: ProviderSettings, model: str,
                        request: dict[str, Any], pace: Pace,
                        ) -> tuple[dict[str, Any] | None, Check | None]:
    """One request as the proxy would send it (the answer, or the failure's check)."""
    upstream = MESSAGES.build(request, settings, Build(model, Refusals()))
    try:
        return await pace.timed(MESSAGES.send_once(client, upstream)), None
    except ProxyError as error:
        return None, describe_failure(error)


def answered_model(asked: str, answered: Any) -> Check:
    """Whether the endpoint answered with the model asked for (a dated name of it counts)."""
    if not isinstance(answered, str) or not answered:
        return Check("model", False, "the answer names no model", required=False)
    if answered == asked or answered.startswith(asked + "-"):
        return Check("model", True, f"answered as {answered}")
    return Check("model", False, f"asked for {asked}, answered as {answered}: the endpoint "
                 "substitutes another model for this name", required=False)


ModelChecks = Callable[[OpenAIClient, ProviderSettings, str, ModelReport], Awaitable[None]]
MODEL_CHECKS: dict[str, ModelChecks] = {"chat": check_chat_model,
                                       "responses": check_responses_model,
                                       "messages": check_messages_model}
"""Each upstream API's checks, by the API's name."""


Verdict = bool | None
"""Whether a model works; None: its checks were cut by the time limit (no verdict)."""


async def diagnose_provider(name: str, settings: ProviderSettings, routed: list[tuple[str, str]],
                            say: Say, time_limit: float = TIME_LIMIT) -> dict[str, Verdict]:
    """Say one provider's lines as its checks complete; whether each of its models works
    (None for a model whose checks the time limit cut short: nobody judged it)."""
    props = await server_props(settings) if (settings.provider_name == llamacpp.PROFILE or
                                             llamacpp.recognisable(settings)) else None
    if props is not None and settings.provider is None:
        settings = settings.model_copy(update={"provider": llamacpp.PROFILE})  # recognised
    say(f"provider {name}: upstream {settings.openai_base_url} "
        f"(profile {settings.provider_name}"
        f"{', llama-server ' + props.build if props is not None else ''})")
    say(f"    {'configuration':<14} {'ok':<5} key "
        f"{'set' if settings.upstream_secrets() else 'unset'}"
        f", dialect {settings.dialect}, passback {settings.passback}, reasoning with tools "
        f"{'on' if settings.reasons_with_tools else 'off'}")
    client = OpenAIClient(settings.model_copy(update={"max_retries": 0}))
    models = configured_models(settings, routed)
    works: dict[str, Verdict] = dict.fromkeys(model for model, _ in models)
    pace = Pace()
    report: ModelReport | None = None
    try:
        async with asyncio.timeout(time_limit):
            for model, uses in models:
                say(f"  {model} ({', '.join(uses)})")
                report = ModelReport(model, uses, say, pace=pace)
                await check_model(client, settings, model, report)
                if settings.provider_name == llamacpp.PROFILE and report.checks[0].ok:
                    await llamacpp_checks(client, settings, model, props, report)
                works[model] = report.ok
    except TimeoutError:
        if report is not None and any(c.required and not c.ok for c in report.checks):
            works[report.model] = False  # a FAIL seen before the limit is a verdict
        say(time_limit_check(name, settings, works, report, pace, time_limit).line())
    finally:
        await client.aclose()
    return works


def time_limit_check(name: str, settings: ProviderSettings, works: dict[str, Verdict],
                     cut: ModelReport | None, pace: Pace, time_limit: float) -> Check:
    """What the time limit left unchecked, how fast the server answered the probes that
    finished, and the --time-limit that would let them all finish at that speed."""
    unchecked = [model for model, verdict in works.items() if verdict is None]
    where = [f"{model} (after its {cut.checks[-1].name} check)"
             if cut is not None and model == cut.model and cut.checks else model
             for model in unchecked]
    rate = pace.rate()
    if rate is None:
        speed = "the server finished no probe within it, so its speed is unknown"
    else:
        tokens = sum(PROBE_TOKENS[api_for(model, settings).name]
                     + 2 * (settings.provider_name == llamacpp.PROFILE) for model in works)
        enough = max(time_limit, math.ceil(tokens / rate * MARGIN / 10) * 10)
        speed = (f"the server answered at {rate:.1f} tokens/s; --time-limit {enough:g} should "
                 f"let them finish ({tokens} tokens at most)")
    return Check("time limit", False, f"{time_limit:g} s reached for provider {name} "
                 f"(--time-limit): not checked: {', '.join(where)}; {speed}", required=False)


def printed(line: str) -> None:
    print(line, flush=True)


async def diagnose(config: ProxyConfig, say: Say | None = None,
                   time_limit: float = TIME_LIMIT) -> tuple[list[str], Verdict]:
    """Every provider's models, then every route: the route works if its model does. Each
    line is kept and, as it is known, given to `say`. The verdict: None when nothing failed
    but the time limit cut checks."""
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    router = Router(config.providers, config.router)
    routes = [(name, c) for name in ROUTE_NAMES for c in router.route(name)]
    routes += [("fallback", c) for c in router.fallbacks()]
    out(f"claude-proxy doctor: {len(config.providers)} provider"
        f"{'s' if len(config.providers) > 1 else ''} from {config.source}")
    works: dict[tuple[str, str], Verdict] = {}
    for name, settings in config.providers.items():
        routed = [(c.model, route) for route, c in routes if c.provider == name]
        provider_works = await diagnose_provider(name, settings, routed, out, time_limit)
        works.update({(name, model): ok for model, ok in provider_works.items()})
    await discover(config)
    known = windows(config)
    for route, c in routes:
        verdict = works.get((c.provider, c.model), False)
        mark = "ok" if verdict else "FAIL" if verdict is False else "?"
        out(f"  route {route:<12} {mark:<5} {c.provider},{c.model}"
            f" {window_note(known.get(c.provider, {}).get(c.model))}")
    if not routes:
        for provider, models in known.items():
            for model, facts in models.items():
                out(f"  {provider},{model} {window_note(facts)}")
    ok = all(verdict is not False for verdict in works.values())
    if config.settings.web_search_backend:
        out(f"web search backend {config.settings.web_search_backend}")
        search = await check_search_backend(config.settings)
        out(search.line())
        ok = ok and search.ok
    for line in keys_report(config):
        out(line)
    settings = config.settings
    if settings.redis_url is not None:
        out("state store (REDIS_URL)")
        works_shared, said = await check_store(settings.redis_url.get_secret_value(),
                                               settings.redis_prefix, settings.redis_timeout)
        out(Check("redis", works_shared, said, required=False).line())
    spend = await check_spend(config)
    if spend is not None:
        out(spend.line())
    unchecked = sorted({provider for (provider, _), verdict in works.items() if verdict is None})
    if not ok:
        out("Claude Code will NOT work yet: fix the FAIL lines above.")
        return lines, False
    if unchecked:
        out(f"No verdict: the time limit cut the checks of {', '.join(unchecked)} (see its "
            "time limit line); nothing failed before it.")
        return lines, None
    out("Claude Code will work with this configuration.")
    return lines, True


async def check_spend(config: ProxyConfig) -> Check | None:
    """Whether the spend of keys with budgets survives a restart (None without such keys):
    with REDIS_URL what Redis says of its persistence and eviction, else the usage file."""
    if not any(spec.budget_usd is not None for spec in config.keys.values()):
        return None
    settings = config.settings
    if settings.redis_url is None:
        return Check("spend", True, f"kept in {data_dir(config) / FILE_NAME} (one process; "
                     "several share a budget only through REDIS_URL)")
    found = await check_durability(settings.redis_url.get_secret_value(),
                                   settings.redis_timeout)
    if found is None:
        return Check("spend", False, "Redis did not say how it keeps data", required=False)
    if found["warning"]:
        return Check("spend", False, str(found["warning"]), required=False)
    return Check("spend", True, f"kept by Redis: {found['persistence']}, maxmemory-policy "
                 f"{found['eviction']}")


def keys_report(config: ProxyConfig) -> list[str]:
    """The `[keys]` tables (never a key or its hash): each key's budget, limits and what it
    may use, then the price of every model a key can be routed to and where it came from."""
    if not config.keys:
        return []
    width = max(len(name) for name in config.keys)
    lines = [f"keys ({len(config.keys)})"]
    reached: dict[tuple[str, str], None] = {}
    for spec in config.keys.values():
        limits = [f"budget ${spec.budget_usd:.2f} per {spec.budget_period}"
                  if spec.budget_usd is not None else "no budget"]
        limits += [f"{name} {value}" for name, value in (("rpm", spec.rpm), ("tpm", spec.tpm))
                   if value is not None]
        uses = [f"providers {', '.join(spec.providers)}" if spec.providers else "all providers",
                f"routes {', '.join(spec.routes)}" if spec.routes else "all routes"]
        lines.append(f"  {spec.name:<{width}}  {', '.join(limits)}; {', '.join(uses)}")
        reached.update(dict.fromkeys(reachable(config, spec)))
    lines.append("prices (USD per million tokens: input / output / cache read / cache write)")
    named = {pair: f"{pair[0]},{pair[1]}" for pair in reached}
    width = max(len(name) for name in named.values())
    for pair, name in named.items():
        lines.append(f"  {name:<{width}}  {price_note(config.models.facts(*pair))}")
    return lines


def price_note(facts: ModelFacts) -> str:
    prices = facts.prices()
    if prices is None:
        return "unpriced: spend not counted (a key with a budget may not use it)"
    figures = " / ".join(f"{price:g}" for price in prices)
    return f"{figures} ({facts.sources.get('price_input', '')})"


def window_note(facts: dict[str, Any] | None) -> str:
    """`window 131072 (source)`, or that none is known (no pre-flight for that model)."""
    if not facts or facts.get("context_window") is None:
        return "window unknown (no pre-flight; set context_window)"
    output = facts.get("max_output_tokens")
    return (f"window {facts['context_window']}"
            f"{f', output {output}' if output else ''} ({facts['source']})")


# ---------------------------------------------------------------- llama.cpp's llama-server
# Jinja, the context size, and whether the chat template renders tools: each a way
# llama-server fails Claude Code silently or late. Without Jinja every request with tools is
# refused; a context smaller than Claude Code's first request overflows on every request; a
# template that cannot render tools makes the server drop them without a word (Claude Code's
# first request shrank from 13,870 to 4,048 tokens). The last is measured: the same request
# with and without a tool must not cost the same number of prompt tokens.

CLAUDE_CODE_FIRST_REQUEST = 20_000
"""Tokens of Claude Code's first request with its tools and system prompt (13,870 measured
on Gemma 3's tokenizer; more with MCP servers): a smaller context cannot hold it."""
COMFORTABLE_CONTEXT = 65_536
ADVICE_CONTEXT = "start llama-server with -c 65536 (or more)"


async def server_props(settings: ProviderSettings) -> llamacpp.Props | None:
    """`/props` of the provider's server, when it is llama-server."""
    key = settings.openai_api_key.get_secret_value()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient() as client:
        return await llamacpp.read_props(client, settings.openai_base_url, headers)


def check_context(props: llamacpp.Props) -> Check:
    if props.n_ctx is None:
        return Check("context", False, "/props did not say n_ctx", required=False)
    if props.n_ctx < CLAUDE_CODE_FIRST_REQUEST:
        return Check("context", False, f"n_ctx {props.n_ctx}: Claude Code's first request "
                     f"alone is about {CLAUDE_CODE_FIRST_REQUEST} tokens; {ADVICE_CONTEXT}")
    if props.n_ctx < COMFORTABLE_CONTEXT:
        return Check("context", False, f"n_ctx {props.n_ctx}: sessions will compact early; "
                     f"{ADVICE_CONTEXT}", required=False)
    return Check("context", True, f"n_ctx {props.n_ctx}")


async def check_template_tools(client: OpenAIClient, settings: ProviderSettings,
                               model: str, pace: Pace) -> Check:
    """Jinja on, and the template renders tools (a tool costs prompt tokens)."""
    plain = anthropic_request(model, max_tokens=1, thinking={"type": "disabled"})
    try:
        without = await pace.timed(client.complete(convert_request(plain, settings).body))
        with_tool = await pace.timed(client.complete(convert_request(
            {**plain, "tools": [CLOCK_TOOL]}, settings).body))
    except MisconfiguredUpstream as error:
        detail = JINJA if error.advice == JINJA else error.advice
        return Check("jinja", False, detail)
    except ProxyError as error:
        return Check("jinja", False, f"{error.status}: {error.message}", required=False)
    sizes = [_prompt_tokens(without), _prompt_tokens(with_tool)]
    if None in sizes:
        return Check("template", False, "no prompt token counts came back", required=False)
    if sizes[0] == sizes[1]:
        return Check("template", False, f"the chat template drops tools ({sizes[0]} prompt "
                     "tokens with and without one): give llama-server a template that "
                     "renders them (--chat-template-file)")
    return Check("template", True, f"renders tools ({sizes[0]} → {sizes[1]} prompt tokens "
                 "with one tool)")


def _prompt_tokens(completion: dict[str, Any]) -> int | None:
    usage = completion.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


async def llamacpp_checks(client: OpenAIClient, settings: ProviderSettings, model: str,
                          props: llamacpp.Props | None, report: ModelReport) -> None:
    """The llama-server lines of one model: Jinja and tools, then the context size."""
    report.add(await check_template_tools(client, settings, model, report.pace))
    if props is not None:
        report.add(check_context(props))


def run_doctor(config: ProxyConfig, time_limit: float = TIME_LIMIT) -> int:
    """Each line printed (flushed) as soon as it is known; exit status 0 (will work), 1 (a
    FAIL line) or NOT_CHECKED (cut by the time limit, nothing failed)."""
    _, verdict = asyncio.run(diagnose(config, printed, time_limit))
    return {True: 0, False: 1, None: NOT_CHECKED}[verdict]
