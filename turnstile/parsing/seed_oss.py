"""ByteDance Seed-OSS tool calls: the Qwen3-Coder XML shape inside ``<seed:tool_call>``.

``<seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE</parameter>\\n</function>\\n</seed:tool_call>``.
The template writes non-string values with Jinja's ``{{ }}``, i.e. as Python reprs
(``{'a': 1}``); ``base.convert_value`` reads those back.
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
    region_close="</seed:tool_call>",
)


@register_tool_format("seed_oss")
class SeedOssToolParser(RegionParser):
    """``<seed:tool_call>`` blocks."""

    openers = ("<seed:tool_call>",)
    markers = ("<seed:tool_call>", *SPEC.markers)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, SPEC, self.tools)
