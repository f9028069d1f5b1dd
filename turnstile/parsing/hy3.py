"""Tencent Hunyuan 3 tool calls: the GLM key/value shape with ``:opensource`` tags.

``<tool_calls:opensource>\\n<tool_call:opensource>NAME<tool_sep:opensource>\\n``
``<arg_key:opensource>K</arg_key:opensource>\\n<arg_value:opensource>V</arg_value:opensource>\\n``
``</tool_call:opensource>\\n</tool_calls:opensource>``.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .registry import register_tool_format
from .xmlcalls import XmlCalls, XmlSpec

SPEC = XmlSpec(
    call_open="<tool_call:opensource>",
    name_ends=("<tool_sep:opensource>",),
    param_open="<arg_key:opensource>",
    param_head_end="</arg_key:opensource>",
    value_open="<arg_value:opensource>",
    param_close="</arg_value:opensource>",
    call_close="</tool_call:opensource>",
    region_close="</tool_calls:opensource>",
)


@register_tool_format("hy3")
class Hy3ToolParser(RegionParser):
    """``<tool_calls:opensource>`` sections."""

    openers = ("<tool_calls:opensource>",)
    markers = ("<tool_calls:opensource>", *SPEC.markers)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, SPEC, self.tools)
