"""Tests for turnstile.parsing: whole-text results against hand-written expectations, and
streaming (char by char and random chunkings) against the whole-text result."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

import pytest

from turnstile.parsing import (
    STATUS_MALFORMED_TOOL_CALL,
    STATUS_OK,
    STATUS_UNCLOSED_REASONING,
    ParsedMessage,
    Parser,
    parse,
    tool_formats,
)

pytestmark = pytest.mark.unit

OK, BAD, UNCLOSED = STATUS_OK, STATUS_MALFORMED_TOOL_CALL, STATUS_UNCLOSED_REASONING


def call(body: str) -> str:
    """A Hermes tool-call block as Qwen templates render it."""
    return f"<tool_call>\n{body}\n</tool_call>"


@dataclass
class Case:
    id: str
    text: str
    content: str | None
    reasoning: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments text)
    status: str = OK
    think: bool = True
    tools: str | None = "hermes"
    started: bool = False


CASES = [
    # --- plain text ---
    Case("plain", "Hello, world!", "Hello, world!"),
    Case("plain_no_parsing", "Hello, world!", "Hello, world!", think=False, tools=None),
    Case("empty", "", ""),
    Case("whitespace_only", "  \n", "  \n"),
    Case("angle_brackets", "a < b, <tools> and <th> x", "a < b, <tools> and <th> x"),
    Case("partial_open_at_end", "Hi <tool_c", "Hi <tool_c"),
    Case("partial_think_at_end", "  <thi", "  <thi"),
    Case(
        "no_tool_parsing",
        "x " + call('{"name": "f", "arguments": {}}'),
        "x " + call('{"name": "f", "arguments": {}}'),
        tools=None,
    ),
    # --- reasoning ---
    Case(
        "reasoning",
        "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
        "The answer is 4.",
        "\nLet me think.\n",
    ),
    Case("reasoning_leading_ws", "\n  <think>r</think>c", "c", "r"),
    Case("reasoning_crlf_after", "<think>a</think>\r\n\r\n  b\n", "  b\n", "a"),
    Case("reasoning_only", "<think>abc</think>", "", "abc"),
    Case("reasoning_empty_block", "<think></think>\n\nHi", "Hi", ""),
    Case("reasoning_disabled", "<think>x</think>y", "<think>x</think>y", think=False),
    Case("think_not_at_start", "Answer: <think>no</think>", "Answer: <think>no</think>"),
    Case("started", "step 1\n</think>\n\nanswer", "answer", "step 1\n", started=True),
    Case(
        "started_unclosed_partial_tag",
        "abc</thi",
        None,
        "abc</thi",
        status=UNCLOSED,
        started=True,
    ),
    Case(
        "unclosed_reasoning",
        "<think>still thinking <tool_call>",
        None,
        "still thinking <tool_call>",
        status=UNCLOSED,
    ),
    Case("nested_think_text", "<think>a <think> b</think>c", "c", "a <think> b"),
    # --- tool calls ---
    Case(
        "one_call",
        call('{"name": "get_weather", "arguments": {"city": "Paris"}}'),
        None,
        calls=[("get_weather", '{"city": "Paris"}')],
    ),
    Case(
        "one_call_compact",
        '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>',
        None,
        calls=[("f", '{"a":1}')],
    ),
    Case(
        "two_parallel",
        call('{"name": "a", "arguments": {"x": 1}}')
        + "\n"
        + call('{"name": "b", "arguments": {"y": [true, null]}}')
        + "\n",
        None,
        calls=[("a", '{"x": 1}'), ("b", '{"y": [true, null]}')],
    ),
    Case(
        "nested_args",
        call('{"name": "q", "arguments": {"q": {"a": [1, 2, {"b": null}], "c": "}{]["}, "d": 1}}'),
        None,
        calls=[("q", '{"q": {"a": [1, 2, {"b": null}], "c": "}{]["}, "d": 1}')],
    ),
    Case(
        "unicode",
        call('{"name": "天气", "arguments": {"city": "Zürich", "emoji": "🌧️", "cjk": "東京"}}'),
        None,
        calls=[("天气", '{"city": "Zürich", "emoji": "🌧️", "cjk": "東京"}')],
    ),
    Case(
        "escapes",
        call(r'{"name": "sh", "arguments": {"cmd": "echo \"hi}\" \\ done\n", "p": "C:\\tmp"}}'),
        None,
        calls=[("sh", r'{"cmd": "echo \"hi}\" \\ done\n", "p": "C:\\tmp"}')],
    ),
    Case(
        "escaped_name",
        call(r'{"name": "my\"tool", "arguments": {}}'),
        None,
        calls=[('my"tool', "{}")],
    ),
    Case(
        "parameters_key",
        call('{"name": "f", "parameters": {"a": 1}}'),
        None,
        calls=[("f", '{"a": 1}')],
    ),
    Case(
        "extra_key_after_args",
        call('{"name": "f", "arguments": {"a": 1}, "id": "x"}'),
        None,
        calls=[("f", '{"a": 1}')],
    ),
    # uncommitted shapes, parsed whole at </tool_call>
    Case(
        "args_before_name",
        call('{"arguments": {"x": 1}, "name": "f"}'),
        None,
        calls=[("f", '{"x": 1}')],
    ),
    Case(
        "stringified_args",
        call(r'{"name": "f", "arguments": "{\"x\": 1}"}'),
        None,
        calls=[("f", '{"x": 1}')],
    ),
    Case("no_args", call('{"name": "f"}'), None, calls=[("f", "{}")]),
    Case(
        "head_too_long_parsed_whole",
        call('{"name": "f",' + " " * 1500 + '"arguments": {"a": 1}}'),
        None,
        calls=[("f", '{"a": 1}')],
    ),
    # --- malformed ---
    Case(
        "malformed_json_uncommitted",
        "Sure. " + call('{"name": "f", "arguments": }'),
        "Sure. " + call('{"name": "f", "arguments": }'),
        status=BAD,
    ),
    Case(
        "malformed_args_committed",
        call('{"name": "f", "arguments": {"a": tru}}'),
        None,
        calls=[("f", '{"a": tru}')],
        status=BAD,
    ),
    Case(
        "junk_after_args_committed",
        call('{"name": "f", "arguments": {"a": 1}, }'),
        None,
        calls=[("f", '{"a": 1}')],
        status=BAD,
    ),
    Case(
        "missing_name",
        call('{"arguments": {"a": 1}}'),
        call('{"arguments": {"a": 1}}'),
        status=BAD,
    ),
    Case(
        "name_not_string",
        call('{"name": 3, "arguments": {}}'),
        call('{"name": 3, "arguments": {}}'),
        status=BAD,
    ),
    Case(
        "empty_name",
        call('{"name": "", "arguments": {}}'),
        call('{"name": "", "arguments": {}}'),
        status=BAD,
    ),
    Case(
        "not_json",
        "<tool_call>get_weather(city='Paris')</tool_call>",
        "<tool_call>get_weather(city='Paris')</tool_call>",
        status=BAD,
    ),
    Case(
        "good_then_malformed",
        call('{"name": "a", "arguments": {}}') + "\n" + call("oops") + "\n",
        "\n" + call("oops") + "\n",
        calls=[("a", "{}")],
        status=BAD,
    ),
    Case(
        "malformed_then_good",
        call("{bad json") + "\n" + call('{"name": "b", "arguments": {"k": "v"}}'),
        call("{bad json") + "\n",
        calls=[("b", '{"k": "v"}')],
        status=BAD,
    ),
    Case(
        "unclosed_uncommitted",
        'Sure.<tool_call>\n{"name": "f"',
        'Sure.<tool_call>\n{"name": "f"',
        status=BAD,
    ),
    Case(
        "unclosed_in_args",
        '<tool_call>\n{"name": "f", "arguments": {"a": "x</tool_c',
        None,
        calls=[("f", '{"a": "x</tool_c')],
        status=BAD,
    ),
    Case(
        "unclosed_after_args",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n',
        None,
        calls=[("f", '{"a": 1}')],
        status=BAD,
    ),
    Case(
        "close_tag_inside_string",
        call('{"name": "f", "arguments": {"s": "a</tool_call>b"}}'),
        'b"}}\n</tool_call>',
        calls=[("f", '{"s": "a')],
        status=BAD,
    ),
    # --- text around calls ---
    Case(
        "text_before_and_after",
        "Let me look.\n" + call('{"name": "f", "arguments": {}}') + "\nI called it.",
        "Let me look.\n\nI called it.",
        calls=[("f", "{}")],
    ),
    Case(
        "whitespace_before_dropped",
        "\n\n" + call('{"name": "f", "arguments": {}}') + "\n\n",
        None,
        calls=[("f", "{}")],
    ),
    Case(
        "text_between_calls",
        "A"
        + call('{"name": "f", "arguments": {}}')
        + " then "
        + call('{"name": "g", "arguments": {}}')
        + "\n",
        "A then ",
        calls=[("f", "{}"), ("g", "{}")],
    ),
    # --- reasoning + calls ---
    Case(
        "reasoning_and_calls",
        '<think>\nI should call f. <tool_call>{"name": "fake"}</tool_call>\n</think>\n\n'
        + call('{"name": "f", "arguments": {"n": 2}}')
        + "\n"
        + call('{"name": "g", "arguments": {}}'),
        None,
        '\nI should call f. <tool_call>{"name": "fake"}</tool_call>\n',
        calls=[("f", '{"n": 2}'), ("g", "{}")],
    ),
    Case(
        "started_reasoning_then_text_and_call",
        "plan</think>\n\nOK." + call('{"name": "f", "arguments": {}}'),
        "OK.",
        "plan",
        calls=[("f", "{}")],
        started=True,
    ),
    Case(
        "call_without_reasoning_parsing",
        "<think>x</think>" + call('{"name": "f", "arguments": {}}'),
        "<think>x</think>",
        calls=[("f", "{}")],
        think=False,
    ),
]

CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def make_parser(case: Case) -> Parser:
    return Parser(case.think, case.tools, case.started)


def strip_ids(message: ParsedMessage) -> tuple:
    calls = []
    for tc in message.tool_calls:
        assert set(tc) == {"id", "type", "function"}
        assert tc["type"] == "function"
        assert set(tc["function"]) == {"name", "arguments"}
        calls.append((tc["function"]["name"], tc["function"]["arguments"]))
    return message.content, message.reasoning_content, calls, message.parse_status


def stream(case: Case, chunks: list[str]) -> tuple[list[dict], ParsedMessage]:
    parser = make_parser(case)
    deltas: list[dict] = []
    for chunk in chunks:
        deltas += parser.feed(chunk)
    deltas += parser.finish()
    return deltas, parser.result()


def reassemble(deltas: list[dict]) -> tuple[str, str, list[dict]]:
    """What a streaming OpenAI client would rebuild, checking the delta shapes on the way."""
    content, reasoning, calls = [], [], []
    for delta in deltas:
        assert len(delta) == 1, delta
        key, value = next(iter(delta.items()))
        if key == "content":
            assert isinstance(value, str) and value
            content.append(value)
        elif key == "reasoning_content":
            assert isinstance(value, str) and value
            reasoning.append(value)
        else:
            assert key == "tool_calls"
            for tc in value:
                index = tc["index"]
                if "id" in tc:  # header: a new call, indexes dense and increasing
                    assert index == len(calls)
                    assert tc["type"] == "function"
                    assert tc["function"]["name"]
                    calls.append(
                        {
                            "id": tc["id"],
                            "type": "function",
                            "function": {
                                "name": tc["function"]["name"],
                                "arguments": tc["function"]["arguments"],
                            },
                        }
                    )
                else:  # fragment: only for the call in progress
                    assert index == len(calls) - 1
                    assert set(tc) == {"index", "function"}
                    assert set(tc["function"]) == {"arguments"}
                    assert tc["function"]["arguments"]
                    calls[index]["function"]["arguments"] += tc["function"]["arguments"]
    return "".join(content), "".join(reasoning), calls


def random_chunks(text: str, rng: random.Random) -> list[str]:
    chunks, i = [], 0
    while i < len(text):
        n = rng.randint(1, 8)
        chunks.append(text[i : i + n])
        i += n
    return chunks


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_whole_text(case: Case) -> None:
    message = parse(case.text, case.think, case.tools, case.started)
    assert strip_ids(message) == (case.content, case.reasoning, case.calls, case.status)
    for tc in message.tool_calls:
        assert CALL_ID.fullmatch(tc["id"])
    assert len({tc["id"] for tc in message.tool_calls}) == len(message.tool_calls)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_streaming_matches_whole(case: Case) -> None:
    whole = strip_ids(parse(case.text, case.think, case.tools, case.started))
    chunkings = [list(case.text), [case.text]]
    rng = random.Random(f"turnstile-{case.id}")
    chunkings += [random_chunks(case.text, rng) for _ in range(5)]
    for chunks in chunkings:
        deltas, result = stream(case, chunks)
        content, reasoning, calls = reassemble(deltas)
        assert content == (result.content or "")
        assert reasoning == (result.reasoning_content or "")
        assert calls == result.tool_calls  # ids included: stream ids == result ids
        assert strip_ids(result) == whole


# Texts where every marker is a real marker, so content must never show a piece of one.
MARKER_TEXTS = [
    "<think>r</think>\n\nHello" + call('{"name": "f", "arguments": {"a": 1}}') + "Bye",
    "Hi" + call('{"arguments": {"a": 1}, "name": "f"}') + "\n" + call('{"name": "g"}'),
    "  <think>x</think>ok",
]


@pytest.mark.parametrize("text", MARKER_TEXTS)
def test_no_partial_markers_in_content(text: str) -> None:
    for chunks in (list(text), random_chunks(text, random.Random(7))):
        parser = Parser(True, "hermes")
        deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
        for delta in deltas:
            assert "<" not in delta.get("content", ""), delta
            assert "<" not in delta.get("reasoning_content", ""), delta


def test_content_is_not_held_back_more_than_needed() -> None:
    parser = Parser(True, "hermes")
    assert parser.feed("Hel") == [{"content": "Hel"}]  # "H" rules out <think>
    assert parser.feed("lo <") == [{"content": "lo "}]
    assert parser.feed("tool") == []
    assert parser.feed("s>") == [{"content": "<tools>"}]
    assert parser.feed(" a <b") == [{"content": " a <b"}]
    assert parser.feed("\n<tool_call>\n{") == [{"content": "\n"}]
    assert parser.finish() == [{"content": "<tool_call>\n{"}]
    assert parser.result().parse_status == BAD


def test_reasoning_streams_and_holds_only_close_tag_prefix() -> None:
    parser = Parser(True, None)
    assert parser.feed("\n") == []
    assert parser.feed("<th") == []
    assert parser.feed("ink>plan") == [{"reasoning_content": "plan"}]
    assert parser.feed(" a</th") == [{"reasoning_content": " a"}]
    assert parser.feed("e") == [{"reasoning_content": "</the"}]
    assert parser.feed("</think>\n") == []
    assert parser.feed("\nDone") == [{"content": "Done"}]
    assert parser.finish() == []
    assert parser.result() == ParsedMessage("Done", "plan a</the", [], OK)


def test_arguments_stream_before_call_closes() -> None:
    parser = Parser(False, "hermes", id_factory=lambda i, _n: f"id{i}")
    assert parser.feed('<tool_call>\n{"name": "search", "argu') == []
    assert parser.feed('ments": {"q": "cats') == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "id0",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "cats'},
                }
            ]
        }
    ]
    assert parser.feed(' and dogs"') == [
        {"tool_calls": [{"index": 0, "function": {"arguments": ' and dogs"'}}]}
    ]
    assert parser.feed("}}\n</tool_") == [
        {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}
    ]
    assert parser.feed("call>") == []
    assert parser.finish() == []
    message = parser.result()
    assert message.parse_status == OK
    assert json.loads(message.tool_calls[0]["function"]["arguments"]) == {"q": "cats and dogs"}


def test_uncommitted_call_is_emitted_whole_at_close() -> None:
    parser = Parser(False, "hermes", id_factory=lambda i, _n: f"id{i}")
    assert parser.feed('<tool_call>{"arguments": {"x": 1}, ') == []
    assert parser.feed('"name": "f"}') == []
    assert parser.feed("</tool_call>") == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "id0",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                }
            ]
        }
    ]


def test_call_ids() -> None:
    text = call('{"name": "a", "arguments": {}}') + call('{"name": "b", "arguments": {}}')
    ids = [tc["id"] for tc in parse(text, False, "hermes").tool_calls]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(CALL_ID.fullmatch(i) for i in ids)
    custom = Parser(False, "hermes", call_id_prefix="chatcmpl-tool-")
    custom.feed(text)
    custom.finish()
    assert all(tc["id"].startswith("chatcmpl-tool-") for tc in custom.result().tool_calls)
    fixed = parse(text, False, "hermes", id_factory=lambda i, _n: f"call_{i}")
    assert [tc["id"] for tc in fixed.tool_calls] == ["call_0", "call_1"]


def test_to_openai() -> None:
    text = "<think>hm</think>" + call('{"name": "f", "arguments": {"a": 1}}')
    message = parse(text, True, "hermes", id_factory=lambda i, _n: "call_x")
    assert message.to_openai() == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "hm",
        "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
    assert parse("hi", False, None).to_openai() == {"role": "assistant", "content": "hi"}


def test_registry_and_lifecycle() -> None:
    assert "hermes" in tool_formats()
    with pytest.raises(ValueError, match="unknown tool format"):
        Parser(False, "no-such-format")
    parser = Parser(False, None)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


FUZZ_PIECES = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "\n",
    " ",
    "x",
    "<",
    "</",
    "<tool",
    "<thi",
    "</think",
    '"',
    "\\",
    "{",
    "}",
    "[",
    '{"name": "f", "arguments": {',
    '"a": "v"',
    '{"arguments": {"b": 2}, "name": "g"}',
    '{"name": "h", "arguments": {"c": [1, {}]}}',
]


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_chunking_independence(seed: int) -> None:
    """Random marker soup: streaming must agree with whole-text parsing, whatever happens."""
    rng = random.Random(seed)
    for _ in range(100):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(0, 14)))
        case = Case("fuzz", text, None, think=rng.random() < 0.8, started=rng.random() < 0.2)
        whole = strip_ids(parse(text, case.think, case.tools, case.started))
        for chunks in (list(text), random_chunks(text, rng)):
            deltas, result = stream(case, chunks)
            content, reasoning, calls = reassemble(deltas)
            assert content == (result.content or "")
            assert reasoning == (result.reasoning_content or "")
            assert calls == result.tool_calls
            assert strip_ids(result) == whole, text
