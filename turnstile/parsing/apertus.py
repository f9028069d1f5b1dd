"""Swiss AI Apertus tool calls: ``<|tools_prefix|>[{"NAME": {args}}, …]<|tools_suffix|>``.

The function name is the key of each element. Reasoning is ``<|inner_prefix|>…<|inner_suffix|>``
(see ``detect``).
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

SPEC = ListSpec(closes=("<|tools_suffix|>",), keyed=True)


@register_tool_format("apertus")
class ApertusToolParser(RegionParser):
    """``<|tools_prefix|>`` lists of ``{name: arguments}``."""

    openers = ("<|tools_prefix|>",)
    markers = ("<|tools_prefix|>", "<|tools_suffix|>", "<|inner_prefix|>", "<|inner_suffix|>")

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
