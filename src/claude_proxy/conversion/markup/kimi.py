"""Kimi K2's tool-call tokens, left in `content` (vllm-project/vllm#31207, Bedrock,
NousResearch/hermes-agent#24534) or in the reasoning when `</think>` is omitted
(vllm-project/vllm#32216, Bike4Mind/bike4mind#1119):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|><|tool_calls_section_end|>

(one line, cut here). The section's singular spelling `<|tool_call_section_begin|>` too
(vLLM's parser takes both), and a call without its section or without
`<|tool_call_argument_begin|>`. The id is `functions.NAME:N` (or `NAME:N`); it is kept as
the call's id, which Kimi wants back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from claude_proxy.conversion.markup.envelope import (
    Markup,
    Schema,
    TextCall,
    every_call,
    inner,
    json_object,
    whole,
)

_SECTIONS = {"<|tool_calls_section_begin|>": "<|tool_calls_section_end|>",
             "<|tool_call_section_begin|>": "<|tool_call_section_end|>"}
_CALL = ("<|tool_call_begin|>", "<|tool_call_end|>")
_ONE = re.compile(r"<\|tool_call_begin\|>\s*([^\s<]+)\s*(?:<\|tool_call_argument_begin\|>)?"
                  r"(.*?)<\|tool_call_end\|>", re.DOTALL)
_ID = re.compile(r"(?:functions\.)?([^\s:]+)(?::\d+)?")


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    opening = next((tag for tag in _SECTIONS if raw.startswith(tag)), None)
    text = inner(raw, opening, _SECTIONS[opening]) if opening else raw
    return every_call(whole(_ONE, text), _call)


def _call(match: re.Match[str]) -> TextCall | None:
    call_id = match.group(1)
    name = _ID.fullmatch(call_id)
    arguments = json_object(match.group(2))
    if name is None or arguments is None:
        return None
    return TextCall(name.group(1), arguments, call_id)


KIMI = Markup("kimi", {**{opening: (closing,) for opening, closing in _SECTIONS.items()},
                       _CALL[0]: (_CALL[1],)}, read)
