"""Cohere tool calls.

``cohere`` (Command-R7B, Command-A, Cohere2 MoE): ``<|START_THINKING|>plan<|END_THINKING|>
<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME, "parameters": {…}}, …]<|END_ACTION|>``,
answers in ``<|START_RESPONSE|>…<|END_RESPONSE|>`` (tags dropped). Reasoning uses the thinking
tags (see ``detect``).

``command_r`` (Command-R / R+ tool-use template): ``Action: ```json\\n[{"tool_name": NAME,
"parameters": {…}}, …]\\n```  ``.
"""

from __future__ import annotations

from .base import Region, RegionParser
from .jsonlist import JsonCallList, ListSpec
from .registry import register_tool_format

NAME_KEYS = ("tool_name", "name")
ARGS_KEYS = ("parameters", "arguments")

ACTION_SPEC = ListSpec(closes=("<|END_ACTION|>",), name_keys=NAME_KEYS, args_keys=ARGS_KEYS)


@register_tool_format("cohere")
class CohereToolParser(RegionParser):
    """``<|START_ACTION|>`` lists."""

    openers = ("<|START_ACTION|>",)
    drops = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
    markers = (
        "<|START_ACTION|>",
        "<|END_ACTION|>",
        *drops,
        "<|START_THINKING|>",
        "<|END_THINKING|>",
    )

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, ACTION_SPEC)


COMMAND_R_SPEC = ListSpec(
    closes=("```",), name_keys=NAME_KEYS, args_keys=ARGS_KEYS, prefix=("```json", "```"),
    lenient=True,
)


@register_tool_format("command_r")
class CommandRToolParser(RegionParser):
    """``Action: ```json [...] ``` `` blocks."""

    openers = ("Action:",)
    markers = ("Action:", "```json", "```")

    def open_region(self, marker: str) -> Region:
        return JsonCallList(marker, COMMAND_R_SPEC)
