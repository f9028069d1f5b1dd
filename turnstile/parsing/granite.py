"""IBM Granite 3.x tool calls: ``<|tool_call|>[{"name": …, "arguments": {…}}, …]``.

Granite 3.3 with reasoning writes ``<think>…</think><response>…</response>``; the response
tags are dropped from content. (Granite 4 uses the Hermes ``<tool_call>`` format.)
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

SPEC = ListSpec()


@register_tool_format("granite")
class GraniteToolParser(RegionParser):
    """``<|tool_call|>`` JSON lists."""

    openers = ("<|tool_call|>",)
    drops = ("<response>", "</response>")
    markers = ("<|tool_call|>", *drops)

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
