"""GigaChat 3 / 3.1 tool calls: one JSON call object after a role switch.

GigaChat3 ends its text turn and opens a ``function call`` message:
``<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": …, "arguments": {…}}``;
GigaChat3.1 writes ``<|function_call|>{"name": …, "arguments": {…}}``. One call per turn.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

V3 = "<|message_sep|>\n\nfunction call<|role_sep|>"
V31 = "<|function_call|>"
SPEC = ListSpec(bare=True, seps="")


@register_tool_format("gigachat")
class GigaChatToolParser(RegionParser):
    """GigaChat ``function call`` messages."""

    openers = (V3, V31)
    markers = ("<|message_sep|>", "<|role_sep|>", V31)

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, SPEC)
