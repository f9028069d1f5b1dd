"""GLM-4.5+ tool calls (also Laguna, Spark-X2.5, Ling-3.0): key/value tags.

``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n</tool_call>``; GLM-4.7
and Laguna drop the newlines. One ``<tool_call>`` per call; the name ends at a newline or at
the first ``<arg_key>``. Values are text, typed as in ``xmlcalls``.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .registry import register_tool_format
from .xmlcalls import XmlCalls, XmlSpec

SPEC = XmlSpec(
    call_open=None,
    name_ends=("\n",),
    param_open="<arg_key>",
    param_head_end="</arg_key>",
    value_open="<arg_value>",
    param_close="</arg_value>",
    call_close="</tool_call>",
)


@register_tool_format("glm45")
class Glm45ToolParser(RegionParser):
    """``<tool_call>name<arg_key>…`` calls."""

    openers = ("<tool_call>",)
    markers = ("<tool_call>", *SPEC.markers)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, SPEC, self.tools)
