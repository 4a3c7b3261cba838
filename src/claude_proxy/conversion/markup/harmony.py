"""gpt-oss's harmony tool calls, left in `content` when the server's harmony parser missed
them (kekzl/imp#1719, lmstudio-ai/lmstudio-bug-tracker#942, lablup/mlxcel#654):

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city":"Berlin"}<|call|>

(one line, cut here). The recipient may also stand before the channel (`<|start|>assistant
to=functions.X<|channel|>commentary …`, ggml-org/llama.cpp#15181), `<|start|>assistant` may
be missing, and `<|call|>` is an end-of-generation token, so the frame is often cut before
it: an envelope then ends with the answer. Only the `commentary` channel carries calls (the
harmony spec; jundot/omlx#2143); a message ended by `<|end|>` or `<|return|>` is no call, and
stays text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from claude_proxy.conversion.markup.envelope import Markup, Schema, TextCall, json_object

_ENDS = ("<|call|>", "<|end|>", "<|return|>")
_CALL = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:to=functions\.(?P<before>[^\s<]+))?\s*"
    r"<\|channel\|>commentary\s*(?:to=functions\.(?P<after>[^\s<]+))?\s*"
    r"(?:<\|constrain\|>\s*)?(?:json\s*)?<\|message\|>(?P<body>.*?)(?:<\|call\|>)?",
    re.DOTALL)


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    match = _CALL.fullmatch(raw)
    if match is None or bool(match.group("before")) == bool(match.group("after")):
        return None
    arguments = json_object(match.group("body"))
    if arguments is None or not match.group("body").strip():
        return None
    return [TextCall(match.group("before") or match.group("after"), arguments)]


HARMONY = Markup("harmony", {"<|start|>assistant": _ENDS, "<|channel|>commentary": _ENDS}, read)
