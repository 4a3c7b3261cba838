"""llama.cpp's `llama-server`: how to recognise it, and what its `/props` says.

Every answer of llama-server carries `Server: llama.cpp`, so a provider whose profile was only
guessed from its URL (PROVIDER unset) is recognised from its first answer and gets the
`llamacpp` profile from then on (reasoning passed back as `reasoning_content`, which the `vllm`
profile's `reasoning` field is not). `GET /props` (at the server's root, beside `/v1`) tells
the context size (`default_generation_settings.n_ctx`) and the chat template; `doctor` reads
it, and start-up discovery of context windows can reuse `read_props`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from claude_proxy.config.settings import ProviderSettings

PROFILE = "llamacpp"
SERVER_PREFIX = "llama.cpp"
PROPS_TIMEOUT = 5.0


def recognisable(settings: ProviderSettings) -> bool:
    """A provider whose profile is only a guess (PROVIDER unset, a host the URL hints do
    not know): its server may say that it is llama-server."""
    return (settings.provider is None and not settings.azure_api_version
            and settings.provider_name == "generic")


def is_llamacpp(headers: Mapping[str, str]) -> bool:
    """Whether an answer came from llama-server (its `Server` header)."""
    return str(headers.get("server", "")).lower().startswith(SERVER_PREFIX)


def props_url(base_url: str) -> str:
    """`/props` beside the OpenAI-compatible API (`http://host:8080/v1` → `…:8080/props`)."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return f"{root}/props"


@dataclass(frozen=True)
class Props:
    """What `/props` tells about the running server."""

    n_ctx: int | None
    chat_template: str
    build: str
    raw: dict[str, Any]

    @property
    def template_takes_tools(self) -> bool | None:
        """`chat_template_caps.supports_tools` where the build reports it, else None."""
        caps = self.raw.get("chat_template_caps")
        value = caps.get("supports_tools") if isinstance(caps, dict) else None
        return value if isinstance(value, bool) else None


def parse_props(data: Any) -> Props | None:
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx <= 0:
        n_ctx = data.get("n_ctx") if isinstance(data.get("n_ctx"), int) else None
    template = data.get("chat_template")
    build = data.get("build_info")
    return Props(n_ctx, template if isinstance(template, str) else "",
                 build if isinstance(build, str) else "", data)


async def read_props(client: httpx.AsyncClient, base_url: str,
                     headers: Mapping[str, str] | None = None) -> Props | None:
    """The server's `/props`, or None when it has none (not llama-server) or fails."""
    try:
        response = await client.get(props_url(base_url), headers=dict(headers or {}),
                                    timeout=PROPS_TIMEOUT)
        if response.status_code != 200:
            return None
        return parse_props(response.json())
    except (httpx.HTTPError, ValueError):
        return None
