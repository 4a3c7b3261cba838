"""Settings, read from the environment (and an optional `.env.<provider>` file).

Names follow the widely used `claude-code-proxy` convention so existing `.env` files keep
working. Provider profiles supply defaults (models, output limits) that a variable overrides.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PrefixList = Annotated[list[str] | None, NoDecode]

PROVIDERS = (
    "kimi",
    "glm",
    "deepseek",
    "dashscope",
    "openrouter",
    "vllm",
    "llamacpp",
    "ollama",
    "azure",
    "openai",
    "minimax",
    "gemini",
    "generic",
)


Dialect = Literal["enable_thinking", "thinking", "reasoning_effort", "openrouter",
                  "chat_template_kwargs", "minimax", "gemini"]
Passback = Literal["reasoning_content", "reasoning", "reasoning_details", "none"]
Effort = Literal["minimal", "low", "medium", "high"]
CacheMode = Literal["breakpoints", "last_breakpoint", "automatic", "off"]
Tier = Literal["big", "middle", "small"]
"""The three model slots Claude Code's names map to: opus → big, sonnet → middle, haiku → small."""
TIERS: tuple[Tier, ...] = ("big", "middle", "small")
WebSearchMode = Literal["native", "backend", "off"]
GuardMode = Literal["off", "observe", "repair"]
"""TOOL_GUARD: what the tool-call guard does (docs/tool-calls.md)."""
WebSearchBackend = Literal["searxng", "brave", "tavily", "exa"]

OPENAI_REASONING_MODELS = ("o1", "o3", "o4", "gpt-5")


@dataclass(frozen=True)
class ProviderProfile:
    """Defaults for one upstream family; every field can be overridden by a variable."""

    name: str
    big_model: str
    middle_model: str
    small_model: str
    max_output_tokens: int
    reasoning_max_output_tokens: int
    dialect: Dialect
    passback: Passback
    chat_prefixes: tuple[str, ...] = ()
    model_prefixes: tuple[str, ...] = ()
    reasoning_with_tools: bool = False


# Each profile's `reasoning_with_tools` is what its `.env.<provider>` file says
# (tests/test_profiles.py holds the two together): the current Kimi, GLM, DeepSeek, Qwen and
# local models think while calling tools, and Claude Code always sends tools.
PROFILES: dict[str, ProviderProfile] = {
    "kimi": ProviderProfile("kimi", "kimi-k3", "kimi-k3", "kimi-k3", 32768, 32768,
                            "thinking", "reasoning_content", ("kimi-k2", "kimi-k3"),
                            reasoning_with_tools=True),
    "glm": ProviderProfile("glm", "glm-5.3", "glm-5.3", "glm-5.3-flash", 32768, 32768,
                           "thinking", "reasoning_content",
                           ("glm-4.5", "glm-4.6", "glm-4.7", "glm-5"), reasoning_with_tools=True),
    "deepseek": ProviderProfile("deepseek", "deepseek-v4-pro", "deepseek-v4-pro",
                                "deepseek-v4-flash", 8192, 32768, "thinking", "reasoning_content",
                                ("deepseek-",), reasoning_with_tools=True),
    "dashscope": ProviderProfile("dashscope", "qwen3.8-max", "qwen-plus", "qwen-flash", 32768,
                                 32768, "enable_thinking", "none",
                                 ("qwen3", "qwen-plus", "qwen-flash", "qwen-turbo", "qwq",
                                  "glm-", "deepseek-v3"), reasoning_with_tools=True),
    "openrouter": ProviderProfile("openrouter", "moonshotai/kimi-k3", "moonshotai/kimi-k3",
                                  "openai/gpt-5.4-mini", 32768, 32768, "openrouter", "none",
                                  ("*",), reasoning_with_tools=True),
    "vllm": ProviderProfile("vllm", "default", "default", "default", 16384, 16384,
                            "chat_template_kwargs", "reasoning", ("*",),
                            reasoning_with_tools=True),
    # llama.cpp's llama-server: one model whatever the name; Jinja templates read
    # chat_template_kwargs; it takes earlier reasoning back as `reasoning_content` only.
    "llamacpp": ProviderProfile("llamacpp", "default", "default", "default", 16384, 16384,
                                "chat_template_kwargs", "reasoning_content", ("*",),
                                reasoning_with_tools=True),
    "ollama": ProviderProfile("ollama", "qwen3", "qwen3", "qwen3", 16384, 16384, "reasoning_effort",
                              "reasoning", ("qwen3", "deepseek-r1", "gpt-oss", "magistral"),
                              reasoning_with_tools=True),
    "azure": ProviderProfile("azure", "gpt-5.5", "gpt-5.5", "gpt-5.4-mini", 16384, 32768,
                             "reasoning_effort", "none", (), OPENAI_REASONING_MODELS, True),
    "openai": ProviderProfile("openai", "gpt-5.5", "gpt-5.5", "gpt-5.4-mini", 16384, 32768,
                              "reasoning_effort", "none", (), OPENAI_REASONING_MODELS, True),
    # MiniMax M2/M3: reasoning_split puts the reasoning in reasoning_details, which interleaved
    # thinking needs back on tool turns (conversion/dialects.py).
    "minimax": ProviderProfile("minimax", "MiniMax-M3", "MiniMax-M3", "MiniMax-M2.7", 32768, 32768,
                               "minimax", "reasoning_details", ("minimax-m2", "minimax-m3"),
                               (), True),
    # Gemini 3 through Google's OpenAI-compatible endpoint (AI Studio, Vertex): thought
    # signatures travel on the tool calls (conversion/dialects.py).
    "gemini": ProviderProfile("gemini", "gemini-3.8-flash", "gemini-3.8-flash",
                              "gemini-3.5-flash-lite", 32768, 32768, "gemini", "none",
                              ("gemini-",), (), True),
    # A host no hint names: OpenAI's shapes, with the original design's rule that thinking
    # goes off when the request has tools (older models cannot call functions while
    # thinking) unless REASONING_WITH_TOOLS=true.
    "generic": ProviderProfile("generic", "gpt-5.5", "gpt-5.5", "gpt-5.4-mini", 16384, 32768,
                               "reasoning_effort", "none", (), OPENAI_REASONING_MODELS, False),
}

DEFAULT_THINK_TAG_PREFIXES = ("deepseek-r1", "qwq", "minimax-m2", "minimax-m3")
# Models whose servers (vLLM, SGLang, llama.cpp, resellers) sometimes leave a tool call
# written as text in the content, by the markup family that reads it: each is on for the
# models that ship its format (docs/text-tool-calls.md; conversion/text_tool_calls.py).
DEFAULT_TOOL_CALL_MARKUP: dict[str, tuple[str, ...]] = {
    "qwen": ("qwen3-coder", "qwen3.5", "qwen3.6"),
    "deepseek": ("deepseek",),
    "kimi": ("kimi", "moonshot"),
    "glm": ("glm",),
    "minimax": ("minimax",),
    "harmony": ("gpt-oss",),
}

# Substrings of the upstream host (or URL) that identify a provider when PROVIDER is unset.
_URL_HINTS: tuple[tuple[str, str], ...] = (
    ("moonshot", "kimi"),
    ("kimi", "kimi"),
    ("bigmodel.cn", "glm"),
    ("z.ai", "glm"),
    ("deepseek", "deepseek"),
    ("dashscope", "dashscope"),
    ("aliyuncs", "dashscope"),
    ("openrouter", "openrouter"),
    ("minimax", "minimax"),
    ("generativelanguage.googleapis.com", "gemini"),
    ("aiplatform.googleapis.com", "gemini"),
    ("azure", "azure"),
    (":11434", "ollama"),
    ("ollama", "ollama"),
    ("api.openai.com", "openai"),
)


def infer_provider(base_url: str) -> str:
    """Guess the provider family from the upstream base URL; unknown hosts are 'generic'
    (only api.openai.com, or PROVIDER=openai, gets the OpenAI profile)."""
    parts = urlsplit(base_url.lower())
    where = parts.netloc + parts.path
    for hint, provider in _URL_HINTS:
        if hint in where:
            return provider
    return "generic"


class ProviderSettings(BaseModel):
    """Everything about one upstream: where it is, its key, its models, its reasoning dialect,
    its limits and retries. Read from the environment for a single provider (`Settings`), or
    from one `[providers.NAME]` table of a config file (same names, lower case)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    openai_api_key: SecretStr = Field(default=SecretStr(""))
    openai_base_url: str = "https://api.openai.com/v1"
    azure_api_version: str | None = None
    provider: str | None = None

    big_model: str | None = None
    middle_model: str | None = None
    small_model: str | None = None
    provider_max_output_tokens: int | None = Field(default=None, ge=1)
    vision: bool = True

    request_timeout: float = Field(default=600.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    retry_base_delay: float = Field(default=0.5, ge=0)
    retry_max_delay: float = Field(default=8.0, ge=0)

    reasoning_chat_prefixes: PrefixList = None
    reasoning_model_prefixes: PrefixList = None
    reasoning_default_enabled: bool = False
    reasoning_effort: Effort = "medium"
    reasoning_verbosity: Literal["low", "medium", "high"] | None = None
    reasoning_chat_max_output_tokens: int | None = Field(default=None, ge=1)
    reasoning_dialect: Dialect | None = None
    reasoning_with_tools: bool | None = None
    reasoning_passback: Passback | None = None
    think_tag_prefixes: PrefixList = None
    text_tool_call_prefixes: PrefixList = None
    """TEXT_TOOL_CALL_PREFIXES: models whose tool calls written as text (Qwen3-Coder's
    `<function=…>` XML, `<tool_call>` JSON) become tool_use blocks."""
    deepseek_tool_call_prefixes: PrefixList = None
    """DEEPSEEK_TOOL_CALL_PREFIXES: the same for DeepSeek's DSML and special tokens."""
    kimi_tool_call_prefixes: PrefixList = None
    glm_tool_call_prefixes: PrefixList = None
    minimax_tool_call_prefixes: PrefixList = None
    harmony_tool_call_prefixes: PrefixList = None
    reasoning_tool_call_prefixes: PrefixList = None
    """REASONING_TOOL_CALL_PREFIXES: models whose reasoning is read for those formats too
    (opt-in: a section the reasoning ends in may be a plan, not a call)."""
    buffer_stream_model_prefixes: PrefixList = None
    responses_api: bool = True
    upstream_api: Literal["chat", "messages"] = "chat"
    """UPSTREAM_API (`api` in a config file): `chat` (OpenAI's Chat Completions, and the
    Responses API for REASONING_MODEL_PREFIXES models) or `messages` (the provider's own
    Anthropic Messages API at `{OPENAI_BASE_URL}/v1/messages`)."""

    tool_groups_disabled: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    tool_group_patterns: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    prompt_cache: CacheMode | None = None
    """How the client's `cache_control` breakpoints reach this upstream; unset means the
    default for the profile and model (`conversion/caching.py`)."""
    web_search: WebSearchMode | None = None
    """How Claude Code's WebSearch runs for this provider: `native` (the provider's own
    search), `backend` (the process's WEB_SEARCH_BACKEND; the default when one is set) or
    `off` (the Anthropic `unavailable` error, never an answer from memory)."""
    tool_guard: GuardMode | None = None
    """TOOL_GUARD: `repair` (the default) holds each tool call until it is complete, checks it
    against the tool's schema and repairs what provably validates; `observe` only counts;
    `off`. Unset for Anthropic's own API: `observe` (its calls stream as they come)."""
    tool_guard_max_hold_bytes: int = Field(default=4 * 1024 * 1024, ge=0)
    """TOOL_GUARD_MAX_HOLD_BYTES: the most of one call's arguments held (characters); past
    it the call streams as it comes, unchecked."""
    tool_guard_reask: bool = False
    """TOOL_GUARD_REASK: a non-streamed answer whose tool call nothing could repair is asked
    for once more, with the validation error as that call's result."""

    @field_validator("reasoning_chat_prefixes", "reasoning_model_prefixes", "think_tag_prefixes",
                     "text_tool_call_prefixes", "deepseek_tool_call_prefixes",
                     "kimi_tool_call_prefixes", "glm_tool_call_prefixes",
                     "minimax_tool_call_prefixes", "harmony_tool_call_prefixes",
                     "reasoning_tool_call_prefixes", "buffer_stream_model_prefixes",
                     mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        """`a,b, c` in the environment; an explicit empty value means 'none'."""
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("reasoning_effort", "reasoning_verbosity", "reasoning_dialect",
                     "reasoning_passback", "prompt_cache", "web_search", "upstream_api",
                     "tool_guard", mode="before")
    @classmethod
    def _lower_choice(cls, value: object) -> object:
        if value == "":
            return None
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("provider", mode="before")
    @classmethod
    def _known_provider(cls, value: object) -> object:
        if value in (None, ""):
            return None
        name = str(value).strip().lower()
        if name not in PROVIDERS:
            raise ValueError(f"must be one of {', '.join(PROVIDERS)}")
        return name

    @field_validator("openai_base_url", mode="after")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL such as https://api.openai.com/v1")
        return value.rstrip("/")

    @property
    def provider_name(self) -> str:
        """The active provider profile: PROVIDER, else Azure mode, else guessed from the URL."""
        if self.provider:
            return self.provider
        if self.azure_api_version:
            return "azure"
        return infer_provider(self.openai_base_url)

    @property
    def profile(self) -> ProviderProfile:
        return PROFILES[self.provider_name]

    @property
    def is_azure(self) -> bool:
        return bool(self.azure_api_version) or self.provider_name == "azure"

    @property
    def max_output_tokens(self) -> int:
        return self.provider_max_output_tokens or self.profile.max_output_tokens

    @property
    def dialect(self) -> Dialect:
        return self.reasoning_dialect or self.profile.dialect

    @property
    def passback(self) -> Passback:
        """Azure rejects unknown message fields, so nothing is passed back there."""
        if self.is_azure:
            return "none"
        return self.reasoning_passback or self.profile.passback

    @property
    def chat_prefixes(self) -> tuple[str, ...]:
        if self.is_azure and self.reasoning_chat_prefixes is None:
            return ()
        if self.reasoning_chat_prefixes is None:
            return self.profile.chat_prefixes
        return tuple(self.reasoning_chat_prefixes)

    @property
    def model_prefixes(self) -> tuple[str, ...]:
        if self.reasoning_model_prefixes is None:
            return self.profile.model_prefixes
        return tuple(self.reasoning_model_prefixes)

    @property
    def reasons_with_tools(self) -> bool:
        """REASONING_WITH_TOOLS, else the profile's default (OpenAI's reasoning models think
        while calling tools; older DeepSeek cannot)."""
        if self.reasoning_with_tools is None:
            return self.profile.reasoning_with_tools
        return self.reasoning_with_tools

    @property
    def think_tag_models(self) -> tuple[str, ...]:
        if self.think_tag_prefixes is None:
            return DEFAULT_THINK_TAG_PREFIXES
        return tuple(self.think_tag_prefixes)

    def tool_call_markup(self, model: str) -> tuple[str, ...]:
        """The markup families (DEFAULT_TOOL_CALL_MARKUP's names) read from this model's
        text: each family's `*_TOOL_CALL_PREFIXES`, else its default."""
        chosen = {"qwen": self.text_tool_call_prefixes,
                  "deepseek": self.deepseek_tool_call_prefixes,
                  "kimi": self.kimi_tool_call_prefixes, "glm": self.glm_tool_call_prefixes,
                  "minimax": self.minimax_tool_call_prefixes,
                  "harmony": self.harmony_tool_call_prefixes}
        return tuple(family for family, default in DEFAULT_TOOL_CALL_MARKUP.items()
                     if matches_prefix(model, default if chosen[family] is None
                                       else tuple(chosen[family] or ())))

    def reads_reasoning_tool_calls(self, model: str) -> bool:
        return matches_prefix(model, tuple(self.reasoning_tool_call_prefixes or ()))

    @property
    def guard_mode(self) -> GuardMode:
        """TOOL_GUARD, else `observe` for Anthropic's own Messages API (a route to Claude
        keeps streaming tool arguments as they come) and `repair` for every other upstream."""
        if self.tool_guard is not None:
            return self.tool_guard
        host = urlsplit(self.openai_base_url).hostname or ""
        anthropic = host == "anthropic.com" or host.endswith(".anthropic.com")
        return "observe" if anthropic and self.upstream_api == "messages" else "repair"

    @property
    def buffered_models(self) -> tuple[str, ...]:
        return tuple(self.buffer_stream_model_prefixes or ())

    @property
    def reasoning_max_output_tokens(self) -> int:
        """The output cap while reasoning is on, in place of PROVIDER_MAX_OUTPUT_TOKENS:
        reasoning tokens count against it, and some providers allow more in thinking mode
        (DeepSeek: 8K without, 32K+ with)."""
        return self.reasoning_chat_max_output_tokens or self.profile.reasoning_max_output_tokens

    def model_for_tier(self, tier: Tier) -> str:
        """The upstream model configured for opus (big), sonnet (middle) or haiku (small)."""
        configured = {"big": self.big_model, "middle": self.middle_model,
                      "small": self.small_model}[tier]
        if configured:
            return configured
        return {"big": self.profile.big_model, "middle": self.profile.middle_model,
                "small": self.profile.small_model}[tier]

    def upstream_secrets(self) -> list[str]:
        """This provider's secret values, for log and response redaction."""
        key = self.openai_api_key.get_secret_value()
        return [key] if key else []


class SearchSettings(BaseModel):
    """The search backend, one for the process: WEB_SEARCH_* in the environment, or the
    `[web_search]` table of a config file (the same names without the prefix)."""

    model_config = ConfigDict(extra="forbid")

    web_search_backend: WebSearchBackend | None = None
    web_search_url: str | None = None
    """SearXNG's base URL; for the keyed services an override of the service's API base."""
    web_search_api_key: SecretStr | None = None
    web_search_max_results: int = Field(default=8, ge=1, le=20)
    web_search_timeout: float = Field(default=15.0, gt=0)

    @field_validator("web_search_backend", mode="before")
    @classmethod
    def _backend_name(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().lower() or None
        return value

    @field_validator("web_search_url", mode="after")
    @classmethod
    def _search_url(cls, value: str | None) -> str | None:
        if not value or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL such as http://localhost:8888")
        return value.strip().rstrip("/")


class Settings(BaseSettings, ProviderSettings, SearchSettings):
    """The process-wide knobs, read from the environment (and an optional `.env` file), plus
    the single provider that the environment describes when no config file is used."""

    model_config = SettingsConfigDict(
        env_file=None,
        env_file_encoding="utf-8",
        extra="ignore",
        case_sensitive=False,
        populate_by_name=True,
    )

    anthropic_api_key: SecretStr | None = None
    config_file: str | None = None

    host: str = "0.0.0.0"
    port: int = Field(default=8082, ge=0, le=65535)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_file: str = "logs/claude-proxy.log"

    context_window: int | None = Field(default=None, ge=1)
    """CONTEXT_WINDOW: the single provider's context window in tokens (the config file's
    `context_window` for several; see config/model_table.py)."""
    total_timeout: float = Field(default=1800.0, gt=0)
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    thinking_signature_secret: SecretStr | None = None

    data_dir: str | None = None
    """DATA_DIR: where spend is kept across restarts without Redis (SQLite; default a
    `data/` folder beside the config file, created with mode 0700). Only used with `[keys]`."""

    ui_enabled: bool = True
    """The dashboard at /ui (ui/)."""
    inspect_requests: int = Field(default=50, ge=0, le=10_000)
    """How many of the last requests the dashboard keeps whole (bodies, thinking, answer);
    0 keeps metadata only."""
    inspect_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    """INSPECT_BYTES: the most the kept requests' bodies may take together; the oldest go
    first (the last request is always kept). Late in a Claude Code session a request and its
    upstream copy are a few MB: 50 of them held hundreds of MB, and filling that much fresh
    memory cost each request page faults."""
    session_memo_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """SESSION_MEMO_BYTES: the most this process keeps of its sessions' last request bodies,
    so that a session's next request is parsed and converted only where it changed
    (server/incremental.py, conversion/reuse.py); the least recently used go first, 0 keeps
    none. A body of 800 KB counts 3.2 MB (its bytes, its parsed messages, their conversion
    and the upstream body written from it)."""
    metrics_public: bool = False
    """Serve /metrics without the client key even when ANTHROPIC_API_KEY is set."""

    redis_url: SecretStr | None = None
    """REDIS_URL (redis://, rediss://, unix://; may hold a password): every worker and replica
    shares what it learns through it (state/redis.py). Unset: each process on its own."""
    redis_prefix: str = "claude-proxy:"
    """REDIS_PREFIX: the start of every key, so several proxies can share one Redis."""
    redis_timeout: float = Field(default=0.1, gt=0, le=10)
    """REDIS_TIMEOUT: seconds any Redis call may take before the proxy goes on without it."""
    safeguards_route: str | None = None
    """SAFEGUARDS_ROUTE: `PROVIDER,MODEL` that judges the tool calls of requests carrying
    `safeguards` (Claude Code's Auto mode); the config file's `[router] safeguards` wins.
    Unset: the answer says `unsupported`, never a verdict nobody made."""
    safeguards_timeout: float = Field(default=30.0, gt=0)
    """SAFEGUARDS_TIMEOUT: seconds the judge may take per tool call; then `unavailable`."""
    refusal_ttl: float = Field(default=24 * 3600, gt=0)
    """REFUSAL_TTL: seconds a field an upstream model refused is left out (then tried again)."""

    tool_groups_disabled: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: scan_prefixed(os.environ, TOOL_GROUPS_DISABLED))
    tool_group_patterns: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: scan_prefixed(os.environ, TOOL_GROUP))

    @field_validator("redis_url", mode="after")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if urlsplit(value.get_secret_value()).scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


    def process_secrets(self) -> list[str]:
        """The client key, the signing secret and the search key (never an upstream key)."""
        return [secret.get_secret_value() for secret in (self.anthropic_api_key,
                                                        self.thinking_signature_secret,
                                                        self.web_search_api_key)
                if secret is not None and secret.get_secret_value()] + self.redis_secrets()

    def redis_secrets(self) -> list[str]:
        """The password in REDIS_URL, for redaction (it is never logged; this is the net)."""
        if self.redis_url is None:
            return []
        parts = urlsplit(self.redis_url.get_secret_value())
        return [value for value in (parts.password,) if value]

    def secrets(self) -> list[str]:
        """Every configured secret value, for log and response redaction."""
        return self.upstream_secrets() + self.process_secrets()


@functools.lru_cache(maxsize=4096)
def matches_prefix(model: str, prefixes: tuple[str, ...]) -> bool:
    """Case-insensitive prefix match on the model name or its last path segment
    (`deepseek-ai/DeepSeek-R1` matches `deepseek-r1`); `*` matches every model. Kept per
    (model, prefixes): a request asks four times, with the same few models all day."""
    name = model.lower()
    short = name.rsplit("/", 1)[-1]
    return any(prefix == "*" or name.startswith(prefix.lower()) or short.startswith(
        prefix.lower()) for prefix in prefixes)


TOOL_GROUPS_DISABLED = "TOOL_GROUPS_DISABLED_"
TOOL_GROUP = "TOOL_GROUP_"


def scan_prefixed(values: Mapping[str, str | None], prefix: str) -> dict[str, tuple[str, ...]]:
    """`PREFIX<NAME>=a,b` entries as {NAME: (a, b)} (variable names chosen by the user)."""
    found: dict[str, tuple[str, ...]] = {}
    for key, value in values.items():
        if key.upper().startswith(prefix) and len(key) > len(prefix) and value is not None:
            found[key[len(prefix):].upper()] = tuple(
                item.strip() for item in value.split(",") if item.strip())
    return found


def load_settings(env_file: str | Path | None = None) -> Settings:
    """Build Settings from the environment, plus `env_file` when given (it must exist)."""
    if env_file is None:
        return Settings()
    path = Path(env_file)
    if not path.is_file():
        raise FileNotFoundError(f"env file not found: {path}")
    from_file = dotenv_values(path)

    def merged(prefix: str) -> dict[str, tuple[str, ...]]:
        return {**scan_prefixed(from_file, prefix), **scan_prefixed(os.environ, prefix)}

    return Settings(_env_file=path, tool_groups_disabled=merged(TOOL_GROUPS_DISABLED),
                    tool_group_patterns=merged(TOOL_GROUP))
