"""GLM-4.5 … 5.x's tool calls (zai-org's chat template; vLLM's glm4_moe parser), left in
`content` or, under interleaved thinking, in the reasoning (anomalyco/opencode#6883):

    <tool_call>get_current_weather
    <arg_key>location</arg_key>
    <arg_value>杭州</arg_value>
    </tool_call>

(alibaba/rtp-llm#525), with or without the newlines; a call without arguments is the bare
name, `<tool_call>get_all_func</tool_call>`. Values are typed by the tool's schema, as the
Qwen XML's are; a string value is kept as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from claude_proxy.conversion.markup.envelope import (
    Markup,
    Schema,
    TextCall,
    inner,
    typed_arguments,
    whole,
)

_HEAD = re.compile(r"\s*([^\s<>{]+)(.*)", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    head = _HEAD.fullmatch(inner(raw, "<tool_call>", "</tool_call>"))
    if head is None:
        return None
    name = head.group(1)
    pairs = whole(_PAIR, head.group(2))
    if pairs is None:
        return None
    arguments = typed_arguments(((pair.group(1).strip(), pair.group(2)) for pair in pairs),
                                tools.get(name))
    return [TextCall(name, arguments)] if arguments is not None else None


GLM = Markup("glm", {"<tool_call>": ("</tool_call>",)}, read)
