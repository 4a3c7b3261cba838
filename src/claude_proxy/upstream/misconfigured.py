"""Upstream answers that no retry can fix: the server is not set up for what was asked.

llama-server without Jinja answers any request with tools `500 tools param requires --jinja
flag`; retried as a temporary failure, the proxy tried 3 times and Claude Code 11 more (192 s
of nothing, then "usually temporary"). These answers are recognised by their words and turned
into a 400 `invalid_request_error` that says what to change, so that neither the proxy nor
the client retries. The patterns are each server's own words (llama-server, vLLM's OpenAI
server, Ollama), as they answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from claude_proxy.errors import ProxyError

JINJA = "start llama-server with --jinja (tools are rendered by the chat template only then)"


@dataclass(frozen=True)
class Misconfiguration:
    """One server answer (a pattern of its message) and what to change."""

    pattern: re.Pattern[str]
    advice: str


KNOWN: tuple[Misconfiguration, ...] = (
    # llama.cpp with --no-jinja (or an old build without --jinja): any request with tools.
    Misconfiguration(re.compile(r"tools param requires --jinja", re.I), JINJA),
    Misconfiguration(re.compile(r"unsupported param: tool_choice", re.I), JINJA),
    # vLLM started without tool calling: '"auto" tool choice requires
    # --enable-auto-tool-choice and --tool-call-parser to be set'.
    Misconfiguration(re.compile(r"requires --enable-auto-tool-choice", re.I),
                     "start vLLM with --enable-auto-tool-choice and the --tool-call-parser "
                     "of this model (Claude Code always sends tools)"),
    # Ollama: 'registry.ollama.ai/library/gemma3:270m does not support tools'.
    Misconfiguration(re.compile(r"does not support tools", re.I),
                     "choose a model that can call tools (Claude Code always sends them; "
                     "Ollama lists `tools` among a model's capabilities)"),
    # Ollama: '"nomic-embed-text" does not support chat' (an embedding model).
    Misconfiguration(re.compile(r"does not support (chat|generate|completion)", re.I),
                     "configure a chat model for this provider (this one cannot chat)"),
    # llama.cpp without a vision projector: 'image input is not supported - hint: if this
    # is unexpected, you may need to provide the mmproj' (also audio).
    Misconfiguration(re.compile(r"(image|audio) input is not supported", re.I),
                     "start llama-server with the model's --mmproj, or set `vision = false` "
                     "(VISION=false) for this provider to send images as placeholders"),
)


class MisconfiguredUpstream(ProxyError):
    """A permanent refusal caused by how the upstream server runs (400, never retried)."""

    def __init__(self, message: str, advice: str, upstream_status: int) -> None:
        super().__init__(400, message, error_type="invalid_request_error")
        self.advice = advice
        self.upstream_status = upstream_status


def recognise(error: ProxyError) -> ProxyError:
    """`error` itself, or a MisconfiguredUpstream when its message is a known one. An error
    already recognised as something else (a context overflow) stays what it is."""
    if type(error) is not ProxyError or not 400 <= error.status < 600:
        return error
    for known in KNOWN:
        if known.pattern.search(error.message):
            message = (f"the upstream server cannot take this request as it is set up: "
                       f"{error.message.strip()} ({error.status}). To fix: {known.advice}.")
            return MisconfiguredUpstream(message, known.advice, error.status)
    return error
