"""DeepSeek's DSML (V4's `tool_calls` block, V3.2's `function_calls`), as its own encoder
writes it (`encoding_dsv4.py`) and as it leaks into `content` through resellers and
self-hosted vLLM/SGLang (sgl-project/sglang#35736, TokenRhythm/opensquilla#985):

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="Bash">
    <｜DSML｜parameter name="command" string="true">pwd</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

The bars come as `｜` (the encoder's), `‖`, `｜｜` (lsdefine/GenericAgent#804) or ASCII `|`
(cline/cline#13348); one envelope keeps its bar. `string="true"` values are the text as
written; `string="false"` ones are JSON (the encoder's rule: an invalid one makes the call
invalid); a parameter without the attribute is typed by the tool's schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from claude_proxy.conversion.markup.envelope import (
    Markup,
    Schema,
    TextCall,
    every_call,
    inner,
    properties,
    typed_value,
    whole,
)

_BARS = ("｜", "‖", "｜｜", "|")
_BLOCKS = ("tool_calls", "function_calls")
_ENVELOPES = {f"<{bar}DSML{bar}{block}>": (bar, f"</{bar}DSML{bar}{block}>")
              for bar in _BARS for block in _BLOCKS}


def _patterns(bar: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    tag = re.escape(f"{bar}DSML{bar}")
    return (re.compile(rf'<{tag}invoke\s+name="([^"]*)"\s*>(.*?)</{tag}invoke>', re.DOTALL),
            re.compile(rf'<{tag}parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>'
                       rf'(.*?)</{tag}parameter>', re.DOTALL))


_PATTERNS = {bar: _patterns(bar) for bar in _BARS}


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    opening = next((tag for tag in _ENVELOPES if raw.startswith(tag)), None)
    if opening is None:
        return None
    bar, closing = _ENVELOPES[opening]
    invoke, parameter = _PATTERNS[bar]

    def call(match: re.Match[str]) -> TextCall | None:
        name = match.group(1)
        arguments = _arguments(parameter, match.group(2), tools.get(name))
        return TextCall(name, arguments) if arguments is not None else None

    return every_call(whole(invoke, inner(raw, opening, closing)), call)


def _arguments(parameter: re.Pattern[str], body: str,
               schema: Schema | None) -> dict[str, Any] | None:
    matches = whole(parameter, body)
    if matches is None:
        return None
    known = properties(schema)
    arguments: dict[str, Any] = {}
    for match in matches:
        key, string, value = match.groups()
        if key in arguments:
            return None
        if string == "false":
            try:
                arguments[key] = orjson.loads(value)
            except orjson.JSONDecodeError:
                return None
        else:
            arguments[key] = value if string == "true" else typed_value(value, known.get(key))
    return arguments


DSML = Markup("dsml", {opening: (closing,) for opening, (_, closing) in _ENVELOPES.items()}, read)
