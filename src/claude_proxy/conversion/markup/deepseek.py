"""DeepSeek V3.1's special tokens, and the V3 / R1 form before it (vllm-project/vllm#23454;
raullenchai/Rapid-MLX#795), left in `content` when the server ran the wrong parser or none:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {ARGS}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
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

_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
_CALL = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
_ONE = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
_FENCED = re.compile(r"\s*([^\s`]+)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*", re.DOTALL)


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    text = inner(raw, *_SECTION) if raw.startswith(_SECTION[0]) else raw
    return every_call(whole(_ONE, text),
                      lambda match: _call(match.group(1).strip(), match.group(2)))


def _call(head: str, body: str) -> TextCall | None:
    """V3.1 names the tool before the separator; V3 / R1 write `function` there, then the
    name and the arguments in a JSON code fence."""
    fenced = _FENCED.fullmatch(body) if head == "function" else None
    name, arguments = (fenced.group(1), fenced.group(2)) if fenced else (head, body)
    parsed = json_object(arguments)
    return TextCall(name, parsed) if parsed is not None and name else None


DEEPSEEK = Markup("deepseek", {_SECTION[0]: (_SECTION[1],), _CALL[0]: (_CALL[1],)}, read)
