"""Qwen3-Coder / Qwen3.5 XML tool calls.

``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``,
one ``<tool_call>`` block per call. Used by Qwen3-Coder, Qwen3.5/3.6, NVIDIA Nemotron-3-Nano
and StepFun-3.5. Values are text (typed with the tool schema when the request's tools are
known); see ``xmlcalls``.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .registry import register_tool_format
from .xmlcalls import XmlCalls, XmlSpec

SPEC = XmlSpec(
    call_open="<function=",
    name_ends=(">",),
    param_open="<parameter=",
    param_head_end=">",
    param_close="</parameter>",
    call_close="</function>",
    region_close="</tool_call>",
    trim_newline=True,
)


@register_tool_format("qwen3_coder")
class Qwen3CoderToolParser(RegionParser):
    """``<tool_call><function=…>`` blocks, as written by Qwen3-Coder-style templates."""

    openers = ("<tool_call>",)
    markers = ("<tool_call>", *SPEC.markers)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, SPEC, self.tools)
