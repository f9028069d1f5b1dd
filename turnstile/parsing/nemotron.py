"""NVIDIA Nemotron-Nano-v2 tool calls: ``<TOOLCALL>[{"name": …, "arguments": {…}}]</TOOLCALL>``.

(Nemotron-3 uses the Qwen3-Coder XML format.)
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

SPEC = ListSpec(closes=("</TOOLCALL>",))


@register_tool_format("nemotron_v2")
class NemotronV2ToolParser(RegionParser):
    """``<TOOLCALL>`` JSON lists."""

    openers = ("<TOOLCALL>",)
    markers = ("<TOOLCALL>", "</TOOLCALL>")

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
