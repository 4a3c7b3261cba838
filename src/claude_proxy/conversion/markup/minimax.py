"""MiniMax M2 … M3's tool calls, left as text even by MiniMax's own Anthropic-format API
(MiniMax-AI/MiniMax-M2.5#10), sometimes without the opening tag (farion1231/cc-switch#1308):

    <minimax:tool_call>
    <invoke name="exec">
    <parameter name="command">ls</parameter>
    </invoke>
    </minimax:tool_call>

Each value loses one leading and one trailing newline and is typed by the tool's schema, as
the Qwen XML's are.
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
    typed_arguments,
    whole,
)

_OPENING, _CLOSING = "<minimax:tool_call>", "</minimax:tool_call>"
_BARE = '<invoke name="'
"""An envelope whose opening tag is missing begins at its first invoke; it still ends at
`</minimax:tool_call>`, or with the answer."""
_INVOKE = re.compile(r'<invoke\s+name="([^"]*)"\s*>(.*?)</invoke>', re.DOTALL)
_PARAMETER = re.compile(r'<parameter\s+name="([^"]*)"\s*>(.*?)</parameter>', re.DOTALL)


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    def call(invoke: re.Match[str]) -> TextCall | None:
        name = invoke.group(1)
        parameters = whole(_PARAMETER, invoke.group(2))
        if parameters is None:
            return None
        arguments = typed_arguments(
            ((match.group(1), match.group(2).removeprefix("\n").removesuffix("\n"))
             for match in parameters), tools.get(name))
        return TextCall(name, arguments) if arguments is not None else None

    return every_call(whole(_INVOKE, inner(raw, _OPENING, _CLOSING)), call)


MINIMAX = Markup("minimax", {_OPENING: (_CLOSING,), _BARE: (_CLOSING,)}, read)
