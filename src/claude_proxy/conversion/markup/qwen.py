"""Qwen3-Coder's XML and the Hermes JSON of Qwen 2.5 / Qwen3 (vllm-project/vllm#21571,
gpustack/gpustack#2660, ggml-org/llama.cpp#15012):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

`</parameter>` or `</function>` are sometimes missing, and the `<tool_call>` envelope too;

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
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
    properties,
    typed_value,
)

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
# A parameter ends at its closing tag, or where the next parameter or the function ends.
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)",
                        re.DOTALL)


def read(raw: str, tools: Mapping[str, Schema]) -> list[TextCall] | None:
    inner = raw.strip().removeprefix("<tool_call>").removesuffix("</tool_call>").strip()
    if inner.startswith("{"):
        calls = [_hermes_call(inner)]
    else:
        calls = [_xml_call(name.strip(), body, tools.get(name.strip()))
                 for name, body in _FUNCTION.findall(inner)]
    if not calls or None in calls:
        return None
    return [call for call in calls if call is not None]


def _hermes_call(inner: str) -> TextCall | None:
    try:
        data = orjson.loads(inner)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments: Any = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return None
    return TextCall(data["name"], arguments) if isinstance(arguments, dict) else None


def _xml_call(name: str, body: str, schema: Schema | None) -> TextCall | None:
    """Each `<parameter=NAME>` value loses one leading and one trailing newline, then takes
    the type the tool's schema gives it."""
    if schema is None:
        return None
    known = properties(schema)
    return TextCall(name, {key.strip(): typed_value(value.removeprefix("\n").removesuffix("\n"),
                                                    known.get(key.strip()))
                           for key, value in _PARAMETER.findall(body)})


QWEN = Markup("qwen", {"<tool_call>": ("</tool_call>",), "<function=": ("</function>",)}, read)
