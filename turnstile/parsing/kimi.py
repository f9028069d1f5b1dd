"""Moonshot Kimi tool calls.

``kimi_k2`` (Kimi-K2 Instruct/Thinking): ``<|tool_calls_section_begin|><|tool_call_begin|>
functions.NAME:IDX<|tool_call_argument_begin|>{args}<|tool_call_end|>…<|tool_calls_section_end|>``.

``kimi_k3``: a tagged message, ``<|open|>think<|sep|>…<|close|>think<|sep|>`` (reasoning,
opened by the generation prompt), ``<|open|>response<|sep|>CONTENT<|close|>response<|sep|>``,
``<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K"
type="string"<|sep|>V<|close|>argument<|sep|>…<|close|>call<|sep|><|close|>tools<|sep|>``, and
``<|close|>message<|sep|>``. Reasoning is split with the think tags (see ``detect``); here the
response tags are dropped and the tools section is parsed.
"""

from __future__ import annotations

import re

from .base import Region, RegionParser
from .registry import register_tool_format
from .tagged import TaggedJsonCall, TaggedSpec
from .xmlcalls import XmlCalls, XmlSpec

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

K2_SPEC = TaggedSpec(
    headers=(
        re.compile(
            r"\s*(?:functions\.)?(?P<name>[^\s<>{}]+?)(?::\d+)?\s*" + re.escape(ARG_BEGIN) + r"\s*"
        ),
    ),
    closes=(CALL_END,),
    aborts=(CALL_BEGIN, SECTION_END),
)


@register_tool_format("kimi_k2")
class KimiK2ToolParser(RegionParser):
    """Kimi-K2 tool-call sections."""

    openers = (CALL_BEGIN,)
    drops = (SECTION_BEGIN, SECTION_END)
    markers = (SECTION_BEGIN, CALL_BEGIN, ARG_BEGIN, CALL_END, SECTION_END)

    def open_region(self, marker: str) -> Region:
        return TaggedJsonCall(marker, K2_SPEC)


K3_TOOLS = "<|open|>tools<|sep|>"
K3_SPEC = XmlSpec(
    call_open='<|open|>call tool="',
    name_ends=("<|sep|>",),
    name_re=re.compile(r'\s*(?P<name>[^"<>]+)"(?:\s+index="[^"]*")?\s*'),
    param_open='<|open|>argument key="',
    param_head_end="<|sep|>",
    param_re=re.compile(r'\s*(?P<key>[^"<>]+)"(?:\s+type="(?P<type>[^"]*)")?\s*'),
    param_close="<|close|>argument<|sep|>",
    call_close="<|close|>call<|sep|>",
    region_close="<|close|>tools<|sep|>",
)
K3_THINK = ("<|open|>think<|sep|>", "<|close|>think<|sep|>")


@register_tool_format("kimi_k3")
class KimiK3ToolParser(RegionParser):
    """Kimi-K3 tagged messages (response tags dropped, tools section parsed)."""

    openers = (K3_TOOLS,)
    drops = ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>")
    markers = (K3_TOOLS, *drops, *K3_SPEC.markers, *K3_THINK)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, K3_SPEC, self.tools)
