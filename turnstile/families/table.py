"""Every model family Turnstile knows, declared once (the record is ``record.Family``).

The parsing registry, ``parsing.detect`` and ``parsing.grammar`` are derived from this table,
and the chat layer reads the end-of-turn markers and template patches from it. Its order is the
detection order: the first family with a matching template wins, so families are listed from
the most specific marker to the most generic (``<tool_call>`` is shared by GLM, Qwen3-Coder and
Hermes, which are told apart by what sits inside it). The expected result for every template
of the llama.cpp corpus is pinned in ``tests/test_parsing_roundtrip.py``.

A family whose syntax one of the shared regions describes (``tagged``, ``jsonlist``,
``xmlcalls``) is a ``Regions`` row here and nothing else; one that needs code of its own has a
module named after it (``hermes``, ``mistral``, ``harmony``, ``glimmer``, ``gemma4``, ``lfm2``,
``llama3_json``, ``functionary_v3_2``, ``minimax_m3``) in ``turnstile.parsing``, and its row
names the class (``Code``): the table is data, and importing it imports no parser.
"""

from __future__ import annotations

from .record import Code, Family, JsonGrammar, Regions, Template, XmlGrammar, has
from .shapes import ListSpec, XmlSpec
from .specs import (
    COHERE_ARGS,
    COHERE_NAMES,
    DS_CALL,
    DS_CALLS,
    DS_SEP,
    DS_V3_SPEC,
    FUNCTION,
    FUNCTIONARY_V31_SPEC,
    GIGACHAT_SPEC,
    GIGACHAT_V3,
    GIGACHAT_V31,
    HARMONY_ENDS,
    K2_ARGS,
    K2_CALL,
    K2_SECTION,
    K2_SPEC,
    K3_SPEC,
    K3_THINK,
    LLAMA3_ENDS,
    PYTHON_TAG,
    QWEN3_STABLE_THINK,
    SOLAR_CALL,
    SOLAR_SPEC,
    _dsml,
)

#: End-of-turn markers of chat formats that have no tool-call family of their own here.
OTHER_ENDS = ("<end_of_turn>",)  # Gemma 2/3

FAMILIES: tuple[Family, ...] = (
    Family(  # gpt-oss
        "harmony",
        Code("HarmonyToolParser"),
        detect=(
            Template(
                "gpt-oss harmony", has("<|channel|>", "<|message|>", "functions."), think=None
            ),
        ),
        ends=HARMONY_ENDS,
    ),
    Family(  # Muse Glimmer
        "glimmer",
        Code("GlimmerToolParser"),
        detect=(Template("muse glimmer (ATEM)", has("<atem:function_calls>"), think=None),),
    ),
    Family(
        "kimi_k3",
        Regions(
            {"<|open|>tools<|sep|>": K3_SPEC},
            drops=(
                "<|open|>response<|sep|>",
                "<|close|>response<|sep|>",
                "<|close|>message<|sep|>",
            ),
            markers=K3_THINK,
        ),
        detect=(
            Template(
                "kimi-k3",
                has("<|open|>", "<|sep|>", "<|close|>"),
                think=K3_THINK,
                think_if=lambda s: "open_tag('think')" in s or "<|open|>think" in s,
            ),
        ),
    ),
    Family(
        "kimi_k2",
        Regions({K2_CALL: K2_SPEC}, drops=K2_SECTION, markers=(K2_ARGS,)),
        detect=(Template("kimi-k2", has("<|tool_calls_section_begin|>")),),
        id_style="kimi",
    ),
    Family(
        "deepseek_dsml",
        Regions({f"<｜DSML｜{r}>": _dsml(r) for r in ("function_calls", "tool_calls")}),
        detect=(Template("deepseek v3.2/v4 DSML", has("｜DSML｜")),),
    ),
    Family(
        "deepseek_v3",
        Regions({DS_CALL: DS_V3_SPEC}, drops=DS_CALLS, markers=(DS_SEP,)),
        detect=(Template("deepseek v3/r1/v3.1", has("tool▁call▁begin")),),
        ends=("<｜end▁of▁sentence｜>",),
    ),
    Family(
        "minimax_m3",
        Code("MiniMaxM3ToolParser"),
        detect=(Template("minimax-m3", has("]<]minimax[>["), think=("<mm:think>", "</mm:think>")),),
    ),
    # <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>…
    Family(
        "minimax_m2",
        Regions(
            {
                "<minimax:tool_call>": XmlSpec.attribute_tags(
                    "invoke", "parameter", "</minimax:tool_call>"
                )
            }
        ),
        detect=(Template("minimax-m2", has("<minimax:tool_call>")),),
    ),
    # <seed:tool_call>\n<function=NAME>\n<parameter=K>V</parameter>\n</function>\n
    # </seed:tool_call>; non-string values are Python reprs ({'a': 1}), see base.convert_value
    Family(
        "seed_oss",
        Regions({"<seed:tool_call>": XmlSpec.function_tags("</seed:tool_call>")}),
        detect=(
            Template("seed-oss", has("<seed:tool_call>"), think=("<seed:think>", "</seed:think>")),
        ),
    ),
    # Hunyuan 3: the GLM key/value shape with :opensource tags, <tool_calls:opensource>\n
    # <tool_call:opensource>NAME<tool_sep:opensource>\n<arg_key:opensource>K</arg_key:opensource>
    # \n<arg_value:opensource>V</arg_value:opensource>\n</tool_call:opensource>…
    Family(
        "hy3",
        Regions(
            {
                "<tool_calls:opensource>": XmlSpec.key_value_tags(
                    ":opensource",
                    "<tool_call:opensource>",
                    ("<tool_sep:opensource>",),
                    "</tool_calls:opensource>",
                )
            }
        ),
        detect=(
            Template(
                "hunyuan-3",
                has(":opensource", "tool_call"),
                think=("<think:opensource>", "</think:opensource>"),
                think_if=lambda s: "think" in s,
            ),
        ),
    ),
    Family(
        "gemma4",
        Code("Gemma4ToolParser"),
        detect=(
            Template("gemma-4", has("<|tool_call>"), think=("<|channel>thought", "<channel|>")),
        ),
        ends=("<turn|>",),
    ),
    Family(
        "lfm2",
        Code("Lfm2ToolParser"),
        detect=(
            Template(
                "lfm2",
                lambda s: (
                    "<|tool_call_start|>" in s
                    or "<|tool_list_start|>" in s
                    or has("List of tools: [", "<|im_start|>")(s)
                ),
            ),
        ),
    ),
    Family(
        "solar_open",
        Regions(
            {SOLAR_CALL: SOLAR_SPEC},
            drops=("<|tool_calls|>", "<|calls|>", "<|begin|>assistant", "<|content|>"),
            markers=("<|tool_call:name|>", "<|tool_call:args|>", "<|think|>", "<|end|>"),
        ),
        detect=(Template("solar-open", has(SOLAR_CALL), think=("<|think|>", "<|end|>")),),
    ),
    # Apertus: <|tools_prefix|>[{"NAME": {args}}, …]<|tools_suffix|>, the name as the key
    Family(
        "apertus",
        Regions(
            {"<|tools_prefix|>": ListSpec(closes=("<|tools_suffix|>",), keyed=True)},
            markers=("<|inner_prefix|>", "<|inner_suffix|>"),
        ),
        detect=(
            Template(
                "apertus", has("<|tools_prefix|>"), think=("<|inner_prefix|>", "<|inner_suffix|>")
            ),
        ),
    ),
    Family(
        "cohere",
        Regions(
            {
                "<|START_ACTION|>": ListSpec(
                    closes=("<|END_ACTION|>",), name_keys=COHERE_NAMES, args_keys=COHERE_ARGS
                )
            },
            drops=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
            markers=("<|START_THINKING|>", "<|END_THINKING|>"),
        ),
        detect=(
            Template(
                "cohere command-r7b/a",
                has("<|START_ACTION|>"),
                think=("<|START_THINKING|>", "<|END_THINKING|>"),
            ),
        ),
    ),
    Family(
        "command_r",
        Regions(
            {
                "Action:": ListSpec(
                    closes=("```",),
                    prefix=("```json", "```"),
                    lenient=True,
                    name_keys=COHERE_NAMES,
                    args_keys=COHERE_ARGS,
                )
            }
        ),
        detect=(
            Template(
                "cohere command-r tool_use",
                has("Action:", "```json", "<|CHATBOT_TOKEN|>"),
                think=None,
            ),
        ),
    ),
    # Apriel: <tool_calls>[{"name": …, "arguments": {…}}, …]</tool_calls>. Apriel-1.6 reasons
    # first without an opening tag and answers after [BEGIN FINAL RESPONSE].
    Family(
        "apriel",
        Regions(
            {"<tool_calls>": ListSpec(closes=("</tool_calls>",))},
            drops=("[END FINAL RESPONSE]",),
            markers=("[BEGIN FINAL RESPONSE]",),
        ),
        detect=(
            Template(
                "apriel-1.6",
                has("<tool_calls>", "Here are my reasoning steps:"),
                think=("", "[BEGIN FINAL RESPONSE]"),
                started_after=("Here are my reasoning steps:",),
            ),
            Template("apriel", has("<tool_calls>", "<|assistant|>"), think=None),
        ),
    ),
    # MiniMax-M1: <tool_calls>\n{"name": …, "arguments": {…}}\n{…}\n</tool_calls>, one per line
    Family(
        "minimax_m1",
        Regions({"<tool_calls>": ListSpec(closes=("</tool_calls>",), bare=True, seps=",")}),
        detect=(Template("minimax-m1", has("<tool_calls>")),),
    ),
    Family(
        "mistral",
        Code("MistralToolParser"),
        detect=(Template("mistral", has("[TOOL_CALLS]"), think=("[THINK]", "[/THINK]")),),
        id_style="mistral9",
    ),
    # Nemotron-Nano-v2: <TOOLCALL>[{"name": …, "arguments": {…}}]</TOOLCALL>
    Family(
        "nemotron_v2",
        Regions({"<TOOLCALL>": ListSpec(closes=("</TOOLCALL>",))}),
        detect=(Template("nemotron-nano-v2", has("<TOOLCALL>")),),
    ),
    # FireFunction-v2: functools[{"name": …, "arguments": {…}}, …], the list ends the message
    Family(
        "firefunction_v2",
        Regions({"functools": ListSpec()}),
        detect=(Template("firefunction-v2", has("functools["), think=None),),
    ),
    Family(
        "functionary_v3_2",
        Code("FunctionaryV32ToolParser"),
        detect=(Template("functionary v3.2", has(">>>all", "recipient"), think=None),),
    ),
    Family(
        "functionary_v3_1",
        Regions(
            {FUNCTION: FUNCTIONARY_V31_SPEC, PYTHON_TAG: Code("PythonTag", "llama3_json")},
            drops=LLAMA3_ENDS,  # end-of-turn tokens, should the stop token remain
        ),
        detect=(
            Template(
                "functionary v3.1",
                lambda s: (
                    has("<function=", "</function>", "<|start_header_id|>")(s)
                    and "<parameter=" not in s
                ),
                think=None,
            ),
        ),
    ),
    # MiniCPM5: <function name="NAME"><param name="K">V</param></function>, no wrapper; text
    # holding <, & or a newline is in <![CDATA[…]]>; non-strings are Python reprs
    Family(
        "minicpm5",
        Regions(
            {
                '<function name="': XmlSpec.attribute_tags(
                    "function", "param", opened=True, cdata=True
                )
            }
        ),
        detect=(Template("minicpm5", has("<function name=", "<param name=")),),
    ),
    # Granite 3.x: <|tool_call|>[{"name": …, "arguments": {…}}, …]; 3.3 with reasoning wraps
    # its answer in <response>…</response> (dropped). Granite 4 writes Hermes calls.
    Family(
        "granite",
        Regions({"<|tool_call|>": ListSpec()}, drops=("<response>", "</response>")),
        detect=(Template("granite 3.x", has("<|tool_call|>")),),
    ),
    Family(
        "gigachat",
        Regions(
            {GIGACHAT_V3: GIGACHAT_SPEC, GIGACHAT_V31: GIGACHAT_SPEC},
            markers=("<|message_sep|>", "<|role_sep|>"),
        ),
        detect=(
            Template(
                "gigachat",
                lambda s: has("function call", "<|role_sep|>")(s) or "<|function_call|>" in s,
                think=None,
            ),
        ),
    ),
    # GLM-4.5+ (Laguna, Spark-X2.5, Ling-3.0): <tool_call>NAME\n<arg_key>K</arg_key>\n
    # <arg_value>V</arg_value>\n</tool_call>; GLM-4.7 and Laguna drop the newlines
    Family(
        "glm45",
        Regions({"<tool_call>": XmlSpec.key_value_tags()}),
        detect=(Template("glm-4.5+", has("<tool_call>", "<arg_key>")),),
    ),
    # Qwen3-Coder, Qwen3.5/3.6, Nemotron-3-Nano, StepFun-3.5: <tool_call>\n<function=NAME>\n
    # <parameter=K>\nV\n</parameter>\n</function>\n</tool_call>, one block per call
    Family(
        "qwen3_coder",
        Regions({"<tool_call>": XmlSpec.function_tags("</tool_call>", trim_newline=True)}),
        detect=(Template("qwen3-coder xml", has("<tool_call>", "<function=", "<parameter=")),),
        grammar=XmlGrammar(
            "<tool_call>\n",
            "</tool_call>",
            "<function={name}>\n",
            "<parameter={key}>\n",
            "\n</parameter>\n",
            "</function>\n",
            separator="\n",
        ),
    ),
    # Hermes-2/3, Qwen2.5/3, QwQ, Granite 4, MiMo, Bielik, Reka, SmolLM3
    Family(
        "hermes",
        Code("HermesToolParser"),
        detect=(
            Template("hermes", has("<tool_call>")),
            # SmolLM3 models emit Hermes calls; the corpus copy of its template omits the tools
            Template("smollm3", has("SmolLM")),
        ),
        grammar=JsonGrammar("<tool_call>\n", "arguments", "\n</tool_call>", separator="\n"),
        patches=(QWEN3_STABLE_THINK,),
        ends=("<|im_end|>", "<|endoftext|>"),  # ChatML, and Qwen's end of text
    ),
    Family(
        "llama3_json",
        Code("Llama3ToolParser"),
        detect=(
            Template(
                "llama-3.x json",
                lambda s: (
                    "<|start_header_id|>" in s and ("<|python_tag|>" in s or '"parameters": ' in s)
                ),
                think=None,
            ),
        ),
        grammar=JsonGrammar("", "parameters", ""),  # one call per turn: templates refuse more
        ends=(*LLAMA3_ENDS, "<|end_of_text|>"),
    ),
)
