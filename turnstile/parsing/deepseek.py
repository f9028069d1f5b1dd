"""DeepSeek tool calls: V3/R1 and V3.1 (special-token JSON) and V3.2/V4 (DSML markup).

``deepseek_v3``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>HEADER{args}TAIL<｜tool▁call▁end｜>…
<｜tool▁calls▁end｜>`` where HEADER is ``function<｜tool▁sep｜>NAME\\n```json\\n`` (V3, R1 and its
distills, TAIL ``\\n```) or ``NAME<｜tool▁sep｜>`` (V3.1).

``deepseek_dsml``: ``<｜DSML｜function_calls>`` (V3.2; ``<｜DSML｜tool_calls>`` in V4) holding
``<｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
</｜DSML｜invoke>``; ``string="false"`` marks a JSON value.
"""

from __future__ import annotations

import re

from .base import Region, RegionParser
from .registry import register_tool_format
from .tagged import TaggedJsonCall, TaggedSpec
from .xmlcalls import XmlCalls, XmlSpec

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

V3_SPEC = TaggedSpec(
    headers=(
        re.compile(r"\s*function" + SEP + r"(?P<name>[^\n`]+?)\s*```(?:json)?\s*"),
        re.compile(r"\s*(?P<name>[^\s<>{}]+?)\s*" + SEP + r"\s*"),
    ),
    closes=(CALL_END,),
    tail=re.compile(r"\s*(?:```)?\s*"),
    aborts=(CALL_BEGIN, CALLS_END),
)


@register_tool_format("deepseek_v3")
class DeepSeekV3ToolParser(RegionParser):
    """DeepSeek V3 / R1 / V3.1 special-token tool calls."""

    openers = (CALL_BEGIN,)
    drops = (CALLS_BEGIN, CALLS_END)
    markers = (CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)

    def open_region(self, marker: str) -> Region:
        return TaggedJsonCall(marker, V3_SPEC)


def _dsml_spec(region: str) -> XmlSpec:
    return XmlSpec(
        call_open='<｜DSML｜invoke name="',
        name_ends=('">',),
        param_open='<｜DSML｜parameter name="',
        param_head_end='">',
        param_close="</｜DSML｜parameter>",
        call_close="</｜DSML｜invoke>",
        region_close=f"</｜DSML｜{region}>",
        param_re=re.compile(r'\s*(?P<key>[^"<>]+?)\s*(?:"\s+string="(?P<string>true|false))?'),
    )


DSML_SPECS = {f"<｜DSML｜{r}>": _dsml_spec(r) for r in ("function_calls", "tool_calls")}


@register_tool_format("deepseek_dsml")
class DeepSeekDsmlToolParser(RegionParser):
    """DeepSeek V3.2 / V4 DSML tool calls."""

    openers = tuple(DSML_SPECS)
    markers = (*DSML_SPECS, *{m for spec in DSML_SPECS.values() for m in spec.markers})

    def open_region(self, marker: str) -> Region:
        return XmlCalls(marker, DSML_SPECS[marker], self.tools)
