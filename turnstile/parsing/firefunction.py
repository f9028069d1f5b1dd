"""Fireworks FireFunction-v2 tool calls: `` functools[{"name": …, "arguments": {…}}, …]``.

No closing marker: the list ends the message.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

SPEC = ListSpec()


@register_tool_format("firefunction_v2")
class FireFunctionV2ToolParser(RegionParser):
    """``functools[...]`` lists."""

    openers = ("functools",)
    markers = ("functools",)

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
