"""The family table is the one place a model family is declared.

A family that reuses an existing parser shape is one ``Family`` record: ``ACME`` below is
declared only here, and detection, reasoning, parsing (whole and streamed), tool-call IDs,
template patches and the forced-call grammar all follow from it. The layout rule is checked
too: a parser module exists only for a family whose syntax needs code, and is named after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from turnstile.chat.patches import apply_patches
from turnstile.parsing import (
    Event,
    Family,
    JsonGrammar,
    Parser,
    Regions,
    Template,
    TemplatePatch,
    Text,
    ToolCallParser,
    create_tool_parser,
    detect_format,
    families,
    register_family,
    register_tool_format,
    tool_formats,
    unregister_family,
)
from turnstile.parsing.grammar import supports, tool_call_grammar
from turnstile.parsing.jsonlist import ListSpec
from turnstile.parsing.registry import family, format_class

pytestmark = pytest.mark.integration

ACME = Family(
    "acme",
    Regions({"<acme:call>": ListSpec(closes=("</acme:call>",), bare=True)}),
    (Template("acme chat", lambda src: "<acme:call>" in src, ("<acme:think>", "</acme:think>")),),
    grammar=JsonGrammar("<acme:call>", "arguments", "</acme:call>", separator="\n"),
    id_style="mistral9",
    patches=(TemplatePatch("acme-stable", "test repair", "{{ unstable }}", "{{ stable }}"),),
    ends=("<acme:end>",),
)

ACME_TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% if m.tool_calls %}<acme:call>{{ m.tool_calls "
    "| tojson }}</acme:call>{% endif %}{% endfor %}{{ unstable }}<acme:think></acme:think>"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "required": ["city", "days"],
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                    "days": {"type": "integer"},
                },
            },
        },
    }
]
COMPLETION = (
    "<acme:think>Look it up.</acme:think>Checking."
    '<acme:call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</acme:call>'
)


@pytest.fixture
def acme() -> Iterator[Family]:
    register_family(ACME)
    try:
        yield ACME
    finally:
        unregister_family(ACME.name)


def test_declared_family_is_detected_with_its_reasoning(acme: Family) -> None:
    choice = detect_format(ACME_TEMPLATE)
    assert (
        choice.tool_format,
        choice.reasoning,
        choice.reasoning_tags,
        choice.family,
        choice.id_style,
    ) == ("acme", True, ("<acme:think>", "</acme:think>"), "acme chat", "mistral9")
    assert choice.reasoning_started("user: hi\n<acme:think>\n")
    assert not choice.reasoning_started("user: hi\n")
    assert "acme" in tool_formats()
    assert families()[-1] is acme


def _messages(parser: Parser, chunks: list[str]) -> tuple[dict, list[dict]]:
    deltas = [d for chunk in chunks for d in parser.feed(chunk)] + parser.finish()
    return parser.result().to_openai(), deltas


def test_declared_family_parses_whole_and_streamed(acme: Family) -> None:
    choice = detect_format(ACME_TEMPLATE)
    whole, _ = _messages(choice.parser("user: hi\n", TOOLS), [COMPLETION])
    streamed, deltas = _messages(choice.parser("user: hi\n", TOOLS), list(COMPLETION))
    assert whole["reasoning_content"] == "Look it up." and whole["content"] == "Checking."
    (call,) = whole["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])  # the declared ID style
    for message in (whole, streamed):
        for c in message["tool_calls"]:
            c.pop("id")
    assert streamed == whole and deltas
    assert create_tool_parser("acme").markers == ("<acme:call>", "</acme:call>")


def test_declared_family_patches_its_template(acme: Family) -> None:
    patched, applied = apply_patches(ACME_TEMPLATE)
    assert applied == ["acme-stable"] and "{{ stable }}" in patched
    assert apply_patches(ACME_TEMPLATE, enabled=False) == (ACME_TEMPLATE, [])


def test_declared_family_ends_stop_generation(acme: Family) -> None:
    """A tokenizer's token with the text of a declared end-of-turn marker is an end token: the
    chat layer reads the family records (``turnstile.families``), not a list of its own."""
    import tokenizers

    from turnstile.chat.loaded_tokenizer import eog_ids

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0}, unk_token="a"))
    tok.add_special_tokens(["<acme:end>", "<acme:other>"])
    end, other = tok.token_to_id("<acme:end>"), tok.token_to_id("<acme:other>")
    assert end in eog_ids(tok, None, ()) and other not in eog_ids(tok, None, ())
    unregister_family(acme.name)
    assert end not in eog_ids(tok, None, ())


def test_declared_family_grammar(acme: Family) -> None:
    assert supports("acme")
    g = tool_call_grammar("acme", TOOLS, "get_weather", parallel=True)
    root, call = g.splitlines()[:2]
    assert root == 'root ::= call ( "\\n" call )*'
    assert call.startswith('call ::= "<acme:call>" ( ') and call.endswith(' ) "</acme:call>"')


def test_family_is_gone_after_unregistering() -> None:
    register_family(ACME)
    unregister_family(ACME.name)
    assert "acme" not in tool_formats() and not supports("acme")
    assert detect_format(ACME_TEMPLATE).tool_format is None
    assert apply_patches(ACME_TEMPLATE) == (ACME_TEMPLATE, [])


def test_register_before_another_family_takes_precedence() -> None:
    early = Family("acme_hermes", ACME.parser, (Template("acme", lambda s: "<tool_call>" in s),))
    register_family(early, before="hermes")
    try:
        assert detect_format("<tool_call>").tool_format == "acme_hermes"
    finally:
        unregister_family(early.name)
    assert detect_format("<tool_call>").tool_format == "hermes"


def test_names_are_declared_once() -> None:
    with pytest.raises(ValueError, match="already declared"):
        register_family(Family("hermes", ACME.parser))
    with pytest.raises(ValueError, match="unknown tool format"):
        create_tool_parser("acme")
    with pytest.raises(ValueError, match="unknown tool format"):
        register_family(ACME, before="no_such_family")
    assert "acme" not in tool_formats()


def test_register_tool_format_declares_a_family_without_detection() -> None:
    """The older decorator still works: the class becomes a family with no template or
    grammar, chosen only by name (``--tool-parser``)."""

    @register_tool_format("acme_plain")
    class Plain(ToolCallParser):
        def feed(self, text: str) -> list[Event]:
            return [Text(text)]

        def finish(self) -> list[Event]:
            return []

    try:
        assert Plain.names == ("acme_plain",) and "acme_plain" in tool_formats()
        assert family("acme_plain").detect == () and not supports("acme_plain")
        assert isinstance(create_tool_parser("acme_plain"), Plain)
    finally:
        unregister_family("acme_plain")


# Modules of the parsing package that are shared machinery, not a family's parser.
SHARED = {
    "__init__",
    "base",
    "call_ids",
    "detect",
    "family",
    "grammar",
    "jsoncalls",
    "jsonlist",
    "markers",
    "parser",
    "reasoning",
    "registry",
    "tagged",
    "types",
    "xmlcalls",
}


def test_parser_modules_exist_only_for_code_and_carry_their_family_name() -> None:
    package = Path(__file__).resolve().parent.parent / "turnstile" / "parsing"
    modules = {p.stem for p in package.glob("*.py")} - SHARED
    with_code = {f.name for f in families() if not isinstance(f.parser, Regions)}
    assert modules == with_code
    for f in families():
        if f.name in with_code:
            assert format_class(f.name).__module__ == f"turnstile.parsing.{f.name}"


@pytest.mark.timeout(300)
def test_declared_family_grammar_samples_parse_back(
    acme: Family, llama_tiny: str, tiny_qwen2: Path
) -> None:
    """What a random model samples under the declared family's grammar is read back by the
    declared family's parser as a call to the offered tool."""
    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_qwen2))
    prompt = tok.encode("<|im_start|>user\nCall a tool.<|im_end|>\n<|im_start|>assistant\n")
    g = tool_call_grammar("acme", TOOLS, "get_weather")
    body = {
        "prompt": prompt,
        "n_predict": 120,
        "temperature": 1.0,
        "top_k": 0,
        "min_p": 0,
        "seed": 0,
        "grammar": g,
    }
    out = httpx.post(llama_tiny + "/completion", json=body, timeout=120).json()
    assert out["stop_type"] == "eos", out["content"]
    parser = detect_format(ACME_TEMPLATE).parser("", TOOLS)
    parser.feed(out["content"])
    parser.finish()
    message = parser.result()
    assert message.parse_status == "ok", out["content"]
    (call,) = message.tool_calls
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["city"] in ("Paris", "Oslo")
    assert isinstance(args["days"], int)
