"""ServiceNow Apriel tool calls: ``<tool_calls>[{"name": …, "arguments": {…}}, …]</tool_calls>``.

Apriel-1.6 reasons first, without an opening tag (the generation prompt ends with "Here are my
reasoning steps:\\n"), and starts its answer after ``[BEGIN FINAL RESPONSE]`` (see ``detect``).
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

SPEC = ListSpec(closes=("</tool_calls>",))


@register_tool_format("apriel")
class AprielToolParser(RegionParser):
    """``<tool_calls>`` JSON lists."""

    openers = ("<tool_calls>",)
    drops = ("[END FINAL RESPONSE]",)
    markers = ("<tool_calls>", "</tool_calls>", "[BEGIN FINAL RESPONSE]", *drops)

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
