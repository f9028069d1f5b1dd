"""Every tool-call format: family features, malformed output, streaming granularity, detection.

The corpus round trip (``test_parsing_roundtrip.py``) shows each format reads what its template
writes; these tests cover what a model may write beyond that: other spellings the family uses,
broken calls (always content or a call plus ``malformed_tool_call``, never an exception), and
the promise that streaming does not depend on chunking and announces a call before its end.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from turnstile.parsing import Parser, ThinkSplitter, ToolSchemas, parse, tool_formats
from turnstile.parsing.base import convert_value
from turnstile.parsing.detect import FormatChoice, detect_format
from turnstile.parsing.registry import format_class

pytestmark = pytest.mark.unit

OK, BAD = "ok", "malformed_tool_call"
DS_CALLS, DS_CALL, DS_SEP, DS_END = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
)
DSML = "｜DSML｜"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": "integer"},
                    "o": {"type": "object"},
                    "u": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                },
            },
        },
    }
]


def calls_of(text: str, fmt: str, **kw: Any) -> tuple[str | None, list[tuple[str, Any]], str]:
    msg = parse(text, kw.pop("reasoning", False), fmt, **kw)
    calls = []
    for tc in msg.tool_calls:
        try:
            args = json.loads(tc["function"]["arguments"])
        except ValueError:
            args = tc["function"]["arguments"]
        calls.append((tc["function"]["name"], args))
    return msg.content, calls, msg.parse_status


# (format, completion text, expected content, expected calls, expected status)
CASES: list[tuple[str, str, str | None, list[tuple[str, Any]], str]] = [
    # Mistral: both forms, call ids, text before, a broken list
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123def"}]',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[CALL_ID]x9[ARGS]{}',
        "Sure.",
        [("f", {"a": 1}), ("g", {})],
        OK,
    ),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": ', None, [("f", '{"a": ')], BAD),
    ("mistral", "[TOOL_CALLS]no args here", "[TOOL_CALLS]no args here", [], BAD),
    # Llama 3: a whole-message call, chained calls, a JSON answer, <|python_tag|> forms
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}',
        None,
        [("f", {"a": 1}), ("g", {})],
        OK,
    ),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', [], OK),
    (
        "llama3_json",
        'The JSON is {"name": "f", "parameters": {}}',
        'The JSON is {"name": "f", "parameters": {}}',
        [],
        OK,
    ),
    (
        "llama3_json",
        '<|python_tag|>brave_search.call(query="cats")',
        None,
        [("brave_search", {"query": "cats"})],
        OK,
    ),
    ("llama3_json", "<|python_tag|>print(1 + 1)", None, [("python", {"code": "print(1 + 1)"})], OK),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    # DeepSeek: V3/R1 and V3.1 headers, a missing close, a header without arguments
    (
        "deepseek_v3",
        f"{DS_CALLS}{DS_CALL}function{DS_SEP}f\n```json\n"
        f'{{"a": 1}}\n```{DS_END}<｜tool▁calls▁end｜>',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    (
        "deepseek_v3",
        f'{DS_CALL}f{DS_SEP}{{"a": 1}}{DS_CALL}g{DS_SEP}{{}}{DS_END}',
        None,
        [("f", {"a": 1}), ("g", {})],
        BAD,
    ),
    ("deepseek_v3", f"{DS_CALL}f{DS_END}", f"{DS_CALL}f{DS_END}", [], BAD),
    (
        "deepseek_dsml",
        f'<{DSML}function_calls>\n<{DSML}invoke name="f">\n<{DSML}parameter '
        f'name="s" string="true">007</{DSML}parameter>\n<{DSML}parameter name="o" '
        f'string="false">{{"k": [1]}}</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}function_calls>',
        None,
        [("f", {"s": "007", "o": {"k": [1]}})],
        OK,
    ),
    # Kimi-K2: ids after the name, several calls
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_call_begin|>functions.g:1'
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        None,
        [("f", {"a": 1}), ("g", {})],
        OK,
    ),
    # Hermes-like JSON lists
    ("granite", '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}]', None, [("f", {"a": 1})], OK),
    ("granite", "<|tool_call|>oops", "<|tool_call|>oops", [], BAD),
    (
        "apertus",
        '<|tools_prefix|>[{"f": {"a": 1}}, {"g": {}}]<|tools_suffix|>',
        None,
        [("f", {"a": 1}), ("g", {})],
        OK,
    ),
    ("cohere", "<|START_RESPONSE|>Hi<|END_RESPONSE|>", "Hi", [], OK),
    (
        "cohere",
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {"a": 1}}'
        ", oops]<|END_ACTION|>",
        "oops]",
        [("f", {"a": 1})],
        BAD,
    ),
    ("command_r", "Action: none needed", "Action: none needed", [], OK),
    (
        "minimax_m1",
        '<tool_calls>\n{"name": "f", "arguments": {}}\n{"name": "g", "arguments": '
        '{"b": 2}}\n</tool_calls>',
        None,
        [("f", {}), ("g", {"b": 2})],
        OK,
    ),
    (
        "nemotron_v2",
        '<TOOLCALL>[{"name": "f", "arguments": {"a": 1}}</TOOLCALL>',
        None,
        [("f", {"a": 1})],
        BAD,
    ),
    (
        "gigachat",
        '<|function_call|>{"name": "f", "arguments": {"a": 1}}',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    # XML families: typing by schema, missing close tags, junk
    (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=s>\n007\n</parameter>\n<parameter=n>\n"
        "7\n</parameter>\n</function>\n</tool_call>",
        None,
        [("f", {"s": "007", "n": 7})],
        OK,
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=s>\nx\n</function>\n</tool_call>",
        None,
        [("f", {"s": "x"})],
        BAD,
    ),
    (
        "qwen3_coder",
        "<tool_call>\nnot a function\n</tool_call>",
        "<tool_call>\nnot a function\n</tool_call>",
        [],
        BAD,
    ),
    (
        "glm45",
        "<tool_call>f\n<arg_key>o</arg_key>\n<arg_value>{'a': True}</arg_value>\n</tool_call>",
        None,
        [("f", {"o": {"a": True}})],
        OK,
    ),
    ("glm45", "<tool_call>f</tool_call>", None, [("f", {})], OK),
    (
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="f">\n<parameter name="u">null</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        None,
        [("f", {"u": None})],
        OK,
    ),
    (
        "minicpm5",
        '<function name="f"><param name="s"><![CDATA[a</param>b]]></param></function>',
        None,
        [("f", {"s": "a</param>b"})],
        OK,
    ),
    (
        "minimax_m3",
        ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="f">]<]minimax[>[<o>'
        "]<]minimax[>[<k>]<]minimax[>[<item>1]<]minimax[>[</item>]<]minimax[>[</k>]<]minimax[>[</o>"
        "]<]minimax[>[<s>7]<]minimax[>[</s>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
        None,
        [("f", {"o": {"k": [1]}, "s": "7"})],
        OK,
    ),
    (
        "kimi_k3",
        "<|open|>response<|sep|>Hi<|close|>response<|sep|><|open|>tools<|sep|><|open|>call "
        'tool="f" index="1"<|sep|><|open|>argument key="n" type="integer"<|sep|>3<|close|>argument'
        "<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
        "Hi",
        [("f", {"n": 3})],
        OK,
    ),
    # Gemma 4 notation
    (
        "gemma4",
        '<|tool_call>call:f{o:{<|"|>k y<|"|>:[1,None,true]},s:<|"|>a,b}<|"|>}<tool_call|>',
        None,
        [("f", {"o": {"k y": [1, None, True]}, "s": "a,b}"})],
        OK,
    ),
    ("gemma4", '<|tool_call>call:f{s:<|"|>x}<tool_call|>', None, [("f", {})], BAD),
    # LFM2 Python calls
    (
        "lfm2",
        "<|tool_call_start|>[f(s='x', o={\"a\": null}), g()]<|tool_call_end|>",
        None,
        [("f", {"s": "x", "o": {"a": None}}), ("g", {})],
        OK,
    ),
    ("lfm2", "<|tool_call_start|>[f(1, 2)]<|tool_call_end|>", None, [("f", {})], BAD),
    # Functionary
    (
        "functionary_v3_1",
        '<function=f>{"a": 1}</function><function=g>{}</function>',
        None,
        [("f", {"a": 1}), ("g", {})],
        OK,
    ),
    (
        "functionary_v3_2",
        'all\nLet me check.>>>f\n{"a": 1}',
        "Let me check.",
        [("f", {"a": 1})],
        OK,
    ),
    ("functionary_v3_2", "python\nprint(2)", None, [("python", {"code": "print(2)"})], OK),
    # Solar, FireFunction, Apriel
    (
        "solar_open",
        "<|tool_calls|><|tool_call:begin|>id1<|tool_call:name|>f<|tool_call:args|>"
        '{"a": 1}<|tool_call:end|><|calls|>',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    (
        "firefunction_v2",
        ' functools[{"name": "f", "arguments": {"a": 1}}]',
        None,
        [("f", {"a": 1})],
        OK,
    ),
    (
        "apriel",
        '<tool_calls>[{"name": "f", "arguments": {}}]</tool_calls>\n[END FINAL RESPONSE]',
        None,
        [("f", {})],
        OK,
    ),
]


@pytest.mark.parametrize(("fmt", "text", "content", "calls", "status"), CASES)
def test_format_cases(
    fmt: str, text: str, content: str | None, calls: list[tuple[str, Any]], status: str
) -> None:
    got = calls_of(text, fmt, tools=TOOLS)
    assert got == (content, calls, status)


HARMONY_CASES = [
    # reasoning, then a call with the recipient in the channel header and a constraint
    (
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.f <|constrain|>json<|message|>{"a": 1}',
        None,
        "Think.",
        [("f", {"a": 1})],
        OK,
    ),
    # the template's own spelling: recipient in the role header
    (
        ' to=functions.f<|channel|>commentary json<|message|>{"a": 1}<|call|>',
        None,
        None,
        [("f", {"a": 1})],
        OK,
    ),
    # a preamble, then the final answer
    (
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Done.",
        "Checking.Done.",
        None,
        [],
        OK,
    ),
    # plain text without any harmony markup
    ("Just text.", "Just text.", None, [], OK),
    # a header that never reaches <|message|>
    ("<|channel|>final", "<|channel|>final", None, [], BAD),
    # invalid JSON arguments
    ('<|channel|>commentary to=functions.f<|message|>{"a": ', None, None, [("f", '{"a": ')], BAD),
]


@pytest.mark.parametrize(("text", "content", "reasoning", "calls", "status"), HARMONY_CASES)
def test_harmony(
    text: str, content: str | None, reasoning: str | None, calls: list, status: str
) -> None:
    msg = parse(text, True, "harmony")
    got = [(tc["function"]["name"], _loads(tc["function"]["arguments"])) for tc in msg.tool_calls]
    assert (msg.content, msg.reasoning_content, got, msg.parse_status) == (
        content,
        reasoning,
        calls,
        status,
    )


def test_glimmer_channels() -> None:
    text = (
        " to=self<|message|>Plan.<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n"
        '<atem:invoke name="f">\n<atem:parameter name="s">x</atem:parameter>\n</atem:invoke>\n'
        "</atem:function_calls><|eom|><|start|>assistant to=user<|message|>Done."
    )
    msg = parse(text, True, "glimmer", tools=TOOLS)
    assert msg.reasoning_content == "Plan."
    assert msg.content == "Done."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.tool_calls
    ] == [("f", {"s": "x"})]


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# --- streaming ----------------------------------------------------------------------------------


def feed_all(parser: Parser, chunks: list[str]) -> list[list[dict]]:
    return [parser.feed(c) for c in chunks]


def test_xml_call_name_and_string_value_stream_before_the_call_closes() -> None:
    parser = Parser(False, "qwen3_coder", tools=TOOLS, id_factory=lambda i, n: "c0")
    steps = feed_all(
        parser,
        [
            "<tool_call>\n<function=f>\n",
            "<parameter=s>\nline one\n",
            "line two\n</param",
            "eter>\n<parameter=n>\n4",
            "2\n</parameter>\n</function>\n</tool_call>",
        ],
    )
    assert steps[0] == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        }
    ]
    first = '{"s": "line one'
    assert steps[1] == [{"tool_calls": [{"index": 0, "function": {"arguments": first}}]}]
    assert steps[2] == [{"tool_calls": [{"index": 0, "function": {"arguments": "\\nline two"}}]}]
    assert steps[3] == [{"tool_calls": [{"index": 0, "function": {"arguments": '"'}}]}]
    assert steps[4] == [{"tool_calls": [{"index": 0, "function": {"arguments": ', "n": 42}'}}]}]
    parser.finish()
    args = parser.result().tool_calls[0]["function"]["arguments"]
    assert json.loads(args) == {"s": "line one\nline two", "n": 42}


def test_json_arguments_stream_verbatim() -> None:
    parser = Parser(False, "kimi_k2", id_factory=lambda i, n: "c0")
    steps = feed_all(
        parser,
        [
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>",
            '{"q": "ca',
            'ts"}<|tool_call_end|>',
        ],
    )
    assert steps[0] == []  # the name is known, but the call is announced with its arguments
    assert steps[1][0]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"q": "ca'}
    assert steps[2] == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ts"}'}}]}]


def test_harmony_streams_reasoning_then_call() -> None:
    parser = Parser(True, "harmony", id_factory=lambda i, n: "c0")
    steps = feed_all(
        parser,
        [
            "<|channel|>analysis<|message|>Let me",
            " see.<|end|><|start|>assistant",
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{",
            '"a": 1}',
        ],
    )
    assert steps[0] == [{"reasoning_content": "Let me"}]
    assert steps[1] == [{"reasoning_content": " see."}]
    assert steps[2][0]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{"}
    assert steps[3] == [{"tool_calls": [{"index": 0, "function": {"arguments": '"a": 1}'}}]}]
    assert parser.finish() == []
    assert parser.result().parse_status == OK


def _pieces(fmt: str) -> list[str]:
    cls = format_class(fmt)
    markers = [*cls.markers, *getattr(cls, "openers", ()), *getattr(cls, "drops", ())]
    halves = [m[: max(1, len(m) // 2)] for m in markers]
    return [
        *markers,
        *halves,
        "\n",
        " ",
        "x",
        "<",
        "</",
        '"',
        "\\",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "=",
        ">",
        '">',
        "f",
        "Paris",
        '{"a": [1, {"b": "c"}]}',
        "<think>",
        "</think>",
        '{"name": "f", "arguments": {"a": 1}}',
        '"name"',
        "true",
        "7",
    ]


def _run(fmt: str, chunks: list[str], think: bool, started: bool) -> tuple[list[dict], Any]:
    parser = Parser(think, fmt, started, tools=TOOLS, id_factory=lambda i, _n: f"c{i}")
    deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    return deltas, parser.result()


def _reassemble(deltas: list[dict]) -> tuple[str, str, list[dict]]:
    content, reasoning, calls = "", "", []
    for delta in deltas:
        ((key, value),) = delta.items()
        if key == "content":
            content += value
        elif key == "reasoning_content":
            reasoning += value
        else:
            for tc in value:
                if "id" in tc:
                    calls.append(
                        {"id": tc["id"], "type": "function", "function": dict(tc["function"])}
                    )
                else:
                    calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return content, reasoning, calls


@pytest.mark.parametrize("fmt", tool_formats())
def test_fuzz_chunking_independence(fmt: str) -> None:
    """Marker soup in every format: no exception, and streaming equals whole-text parsing."""
    rng = random.Random(fmt)
    pieces = _pieces(fmt)
    for _ in range(60):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        think, started = rng.random() < 0.5, rng.random() < 0.2
        _, whole = _run(fmt, [text], think, started)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 5))) if text else []
        bounds = zip([0, *cuts], [*cuts, len(text)], strict=True)
        chunkings = [list(text), [text[i:j] for i, j in bounds]]
        for chunks in chunkings:
            deltas, result = _run(fmt, chunks, think, started)
            assert result == whole, (fmt, text)
            content, reasoning, calls = _reassemble(deltas)
            assert (content, reasoning, calls) == (
                result.content or "",
                result.reasoning_content or "",
                result.tool_calls,
            ), (fmt, text)


# --- reasoning, typing, detection ---------------------------------------------------------------


def test_think_splitter_custom_tags_and_orphan_close() -> None:
    splitter = ThinkSplitter(False, "[THINK]", "[/THINK]")
    assert splitter.feed("[THINK]a[/THI") == [("reasoning", "a")]
    assert splitter.feed("NK]b") == [("content", "b")]
    assert (
        parse("</mm:think>Hi", True, None, reasoning_tags=("<mm:think>", "</mm:think>")).content
        == "Hi"
    )
    apriel = parse(
        "step 1\n[BEGIN FINAL RESPONSE]\nAnswer",
        True,
        None,
        True,
        reasoning_tags=("", "[BEGIN FINAL RESPONSE]"),
    )
    assert (apriel.reasoning_content, apriel.content) == ("step 1\n", "Answer")


@pytest.mark.parametrize(
    ("raw", "types", "hint", "value"),
    [
        ("7", None, None, 7),
        ("7", frozenset({"string"}), None, "7"),
        ("007", frozenset({"string", "integer"}), None, "007"),
        ("true", None, None, True),
        ("true", None, "string", "true"),
        ("{'a': [1, None]}", None, None, {"a": [1, None]}),
        ("[1, 2]", frozenset({"array"}), None, [1, 2]),
        ("Paris", frozenset({"integer"}), None, "Paris"),
        ("NaN", None, None, "NaN"),
        ("x", None, "json", "x"),
    ],
)
def test_convert_value(
    raw: str, types: frozenset[str] | None, hint: str | None, value: Any
) -> None:
    assert convert_value(raw, types, hint) == value


def test_tool_schemas() -> None:
    schemas = ToolSchemas(TOOLS + [{"type": "function", "function": {"name": "g"}}])
    assert schemas.types("f", "u") == {"string", "null"}
    assert schemas.types("f", "missing") is None
    assert schemas.types("g", "x") is None


def test_reasoning_started_follows_the_prompt() -> None:
    choice = FormatChoice("hermes", True, ("<think>", "</think>"))
    assert choice.reasoning_started("<|im_start|>assistant\n<think>\n")
    assert not choice.reasoning_started("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not choice.reasoning_started("<|im_start|>assistant\n")
    assert not FormatChoice("hermes", False, None).reasoning_started("<think>\n")
    parser = choice.parser("x<think>\n", tools=TOOLS)
    parser.feed("plan</think>answer")
    parser.finish()
    assert (parser.result().reasoning_content, parser.result().content) == ("plan", "answer")


def test_tool_calls_off_keeps_channel_formats() -> None:
    hermes = FormatChoice("hermes", False, None).parser("", tool_calls=False)
    hermes.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    hermes.finish()
    assert hermes.result().tool_calls == [] and hermes.result().content.startswith("<tool_call>")
    harmony = FormatChoice("harmony", True, None).parser("", tool_calls=False)
    harmony.feed(
        "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|message|>a"
    )
    harmony.finish()
    assert (harmony.result().reasoning_content, harmony.result().content) == ("r", "a")


def test_detect_override_and_unknown() -> None:
    choice = detect_format("{{ messages }}")
    assert (choice.tool_format, choice.reasoning) == (None, False)
    forced = choice.with_tool_format("hermes")
    assert forced.tool_format == "hermes" and "overridden" in forced.family
    assert detect_format("{{ '<tool_call>' }}{{ '<arg_key>' }}").tool_format == "glm45"
    assert detect_format("<tool_call><function=x><parameter=y>").tool_format == "qwen3_coder"


def test_every_format_is_detectable_or_documented() -> None:
    """Each registered format is reached by some detection rule."""
    from turnstile.parsing import families

    assert {f.name for f in families() if f.detect} >= set(tool_formats())
