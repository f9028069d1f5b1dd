"""Upstage Solar-Open tool calls.

``<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{args}
<|tool_call:end|>…<|calls|>``. Reasoning is ``<|think|>…<|end|>`` and a content message after it
starts again with ``<|begin|>assistant<|content|>``; those role markers are dropped.
"""

from __future__ import annotations

import re

from .base import Region, RegionParser
from .registry import register_tool_format
from .tagged import TaggedJsonCall, TaggedSpec

BEGIN = "<|tool_call:begin|>"
SPEC = TaggedSpec(
    headers=(
        re.compile(
            r"\s*[^<>{}]*<\|tool_call:name\|>\s*(?P<name>[^\s<>{}]+)\s*<\|tool_call:args\|>\s*"
        ),
    ),
    closes=("<|tool_call:end|>",),
    aborts=(BEGIN, "<|calls|>"),
)


@register_tool_format("solar_open")
class SolarOpenToolParser(RegionParser):
    """Solar-Open tool calls."""

    openers = (BEGIN,)
    drops = ("<|tool_calls|>", "<|calls|>", "<|begin|>assistant", "<|content|>")
    markers = (
        BEGIN,
        "<|tool_call:name|>",
        "<|tool_call:args|>",
        "<|tool_call:end|>",
        *drops,
        "<|think|>",
        "<|end|>",
    )

    def open_region(self, marker: str) -> Region:
        return TaggedJsonCall(marker, SPEC)
