"""The markers and call-syntax specs of the families in ``table``: those shared by more than one
row or by a family's parser, or long enough to read apart from the table."""

from __future__ import annotations

import re

from .record import TemplatePatch
from .shapes import ListSpec, TaggedSpec, XmlSpec

# --- end-of-turn markers, read by the families' parsers too ---------------------------------

HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")  # gpt-oss: a message, a call, the answer
LLAMA3_ENDS = ("<|eom_id|>", "<|eot_id|>")  # Llama 3.x: end of message (a tool call), of turn
PYTHON_TAG = "<|python_tag|>"  # Llama 3.x: code for the built-in interpreter follows

# --- specs shared by more than one row, or long enough to read apart -------------------------

# Kimi-K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
# <|tool_call_argument_begin|>{args}<|tool_call_end|>…<|tool_calls_section_end|>
K2_CALL, K2_END = "<|tool_call_begin|>", "<|tool_call_end|>"
K2_ARGS = "<|tool_call_argument_begin|>"
K2_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
K2_SPEC = TaggedSpec(
    headers=(
        re.compile(
            r"\s*(?:functions\.)?(?P<name>[^\s<>{}]+?)(?::\d+)?\s*" + re.escape(K2_ARGS) + r"\s*"
        ),
    ),
    closes=(K2_END,),
    aborts=(K2_CALL, K2_SECTION[1]),
)

# Kimi-K3: a tagged message; <|open|>think<|sep|>…<|close|>think<|sep|> is reasoning (opened by
# the generation prompt), response tags are dropped, and the tools section holds
# <|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K" type="string"<|sep|>V
# <|close|>argument<|sep|>…<|close|>call<|sep|>.
K3_THINK = ("<|open|>think<|sep|>", "<|close|>think<|sep|>")
K3_SPEC = XmlSpec(
    call_open='<|open|>call tool="',
    name_ends=("<|sep|>",),
    name_re=re.compile(r'\s*(?P<name>[^"<>]+)"(?:\s+index="[^"]*")?\s*'),
    param_open='<|open|>argument key="',
    param_head_end="<|sep|>",
    param_re=re.compile(r'\s*(?P<key>[^"<>]+)"(?:\s+type="(?P<type>[^"]*)")?\s*'),
    param_close="<|close|>argument<|sep|>",
    call_close="<|close|>call<|sep|>",
    region_close="<|close|>tools<|sep|>",
)

# DeepSeek V3/R1/V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>HEADER{args}TAIL
# <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>, HEADER function<｜tool▁sep｜>NAME\n```json\n (V3, R1 and
# its distills, TAIL \n```) or NAME<｜tool▁sep｜> (V3.1).
DS_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
DS_CALL, DS_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DS_V3_SPEC = TaggedSpec(
    headers=(
        re.compile(r"\s*function" + DS_SEP + r"(?P<name>[^\n`]+?)\s*```(?:json)?\s*"),
        re.compile(r"\s*(?P<name>[^\s<>{}]+?)\s*" + DS_SEP + r"\s*"),
    ),
    closes=(DS_END,),
    tail=re.compile(r"\s*(?:```)?\s*"),
    aborts=(DS_CALL, DS_CALLS[1]),
)


def _dsml(region: str) -> XmlSpec:
    """DeepSeek V3.2 (``function_calls``) / V4 (``tool_calls``) DSML; ``string="false"`` marks
    a JSON value."""
    return XmlSpec.attribute_tags(
        "｜DSML｜invoke",
        "｜DSML｜parameter",
        f"</｜DSML｜{region}>",
        param_re=re.compile(r'\s*(?P<key>[^"<>]+?)\s*(?:"\s+string="(?P<string>true|false))?'),
    )


# Solar-Open: <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{args}
# <|tool_call:end|>…<|calls|>; a content message after reasoning restarts with
# <|begin|>assistant<|content|>, dropped.
SOLAR_CALL = "<|tool_call:begin|>"
SOLAR_SPEC = TaggedSpec(
    headers=(
        re.compile(
            r"\s*[^<>{}]*<\|tool_call:name\|>\s*(?P<name>[^\s<>{}]+)\s*<\|tool_call:args\|>\s*"
        ),
    ),
    closes=("<|tool_call:end|>",),
    aborts=(SOLAR_CALL, "<|calls|>"),
)

# Cohere: Command-R7B/A/Cohere2 write [{"tool_call_id": "0", "tool_name": NAME, "parameters":
# {…}}, …] in <|START_ACTION|>; the Command-R/R+ tool-use template writes Action: ```json[…]```.
COHERE_NAMES, COHERE_ARGS = ("tool_name", "name"), ("parameters", "arguments")

# Functionary v3.1 (Llama-3.1 based): <function=NAME>{args}</function>, several in a row, and
# <|python_tag|>code for the code interpreter (a call to ``python``).
FUNCTION = "<function="
FUNCTIONARY_V31_SPEC = TaggedSpec(
    headers=(re.compile(r"\s*(?P<name>[^\s<>{}]+)\s*>\s*"),),
    closes=("</function>",),
    aborts=(FUNCTION, PYTHON_TAG),
)

# GigaChat3 ends its text turn and opens a ``function call`` message; GigaChat3.1 writes
# <|function_call|>. Either way one JSON call object per turn.
GIGACHAT_V3, GIGACHAT_V31 = "<|message_sep|>\n\nfunction call<|role_sep|>", "<|function_call|>"
GIGACHAT_SPEC = ListSpec(bare=True, seps="")

# Qwen3 writes an assistant turn's <think> block only while the turn is last or has reasoning.
QWEN3_STABLE_THINK = TemplatePatch(
    name="qwen3-stable-think-block",
    why="Qwen3 writes an assistant turn's <think> block only while the turn is last or has "
    "reasoning (`loop.last`), so appending a tool result re-renders the turn it follows. "
    "Writing the block whenever the turn follows the last user query keeps it stable; "
    "the render of ordinary chats is unchanged.",
    old="{%- if loop.last or (not loop.last and reasoning_content) %}",
    new="{%- if true %}",
)
