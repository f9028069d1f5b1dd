"""MiniCPM5 tool calls: ``<function name="NAME"><param name="KEY">VALUE</param></function>``.

No wrapper around the calls; several in a row are parallel calls. Text holding ``<``, ``&`` or a
newline is wrapped in ``<![CDATA[…]]>``. Non-string values are written as Python reprs by the
template (``{'a': 1}``), read back by ``base.convert_value``.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .registry import register_tool_format
from .xmlcalls import XmlCalls, XmlSpec

SPEC = XmlSpec(
    call_open=None,
    name_ends=('">',),
    param_open='<param name="',
    param_head_end='">',
    param_close="</param>",
    call_close="</function>",
    cdata=True,
)


@register_tool_format("minicpm5")
class MiniCpm5ToolParser(RegionParser):
    """``<function name=…>`` calls."""

    openers = ('<function name="',)
    markers = ('<function name="', *SPEC.markers)

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, SPEC, self.tools)
