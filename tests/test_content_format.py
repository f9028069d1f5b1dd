"""Content as a list of text parts reaches each template in the shape it reads.

The truth is the template's own behaviour, rendered by transformers without Turnstile's
normalisation: a template detected as reading parts (``openai``) must render raw parts cleanly,
and no template may get the Python repr of a part list in its prompt once normalised.
"""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

import turnstile_testbed as testbed
from turnstile.chat.content import detect_content_format, normalise
from turnstile.chat.history_hash import message_key

pytestmark = pytest.mark.unit

TEMPLATES = sorted(testbed.templates_dir().glob("*.jinja"))
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
PARTS = [{"type": "text", "text": "MARK-A"}, {"type": "text", "text": "MARK-B"}]


def _render(source: str, messages: list[dict]) -> str | None:
    try:
        out, _ = render_jinja_template(
            conversations=[messages], chat_template=source, add_generation_prompt=True, **SPECIAL
        )
    except Exception:  # noqa: BLE001 - a template that refuses this conversation
        return None
    return out[0]


def _repr_in(text: str) -> bool:
    return "{'type'" in text or "'text':" in text


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_detected_format_agrees_with_the_templates_behaviour(path) -> None:  # noqa: ANN001
    source = path.read_text()
    fmt = detect_content_format(source)
    raw = _render(source, [{"role": "user", "content": PARTS}])
    if fmt == "openai":  # it iterates parts: raw parts must render as their text
        assert raw is not None and "MARK-A" in raw and "MARK-B" in raw and not _repr_in(raw)
    elif raw is not None and _repr_in(raw):
        pass  # a string template given parts prints their repr: exactly why we join them
    normalised = _render(source, normalise([{"role": "user", "content": PARTS}], fmt))
    if normalised is not None:
        assert "MARK-A" in normalised and "MARK-B" in normalised
        assert not _repr_in(normalised)
    # strings, null content and tool results: never a repr either
    convo = [
        {"role": "user", "content": "MARK-U"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call00001",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call00001", "content": "MARK-T"},
        {"role": "assistant", "content": "MARK-A"},
    ]
    whole = _render(source, normalise(convo, fmt))
    if whole is not None:
        assert not _repr_in(whole)


def test_the_corpus_has_both_kinds() -> None:
    kinds = {detect_content_format(p.read_text()) for p in TEMPLATES}
    assert kinds == {"string", "openai"}


@pytest.mark.parametrize(
    ("source", "want"),
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
        (
            "{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}"
            "{% endfor %}",
            "openai",
        ),
        # through set / slices / filters, as system-splitting templates do
        (
            "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}"
            "{% for c in m.content | list %}{{ c }}{% endfor %}{% endfor %}",
            "openai",
        ),
        (
            "{% set a = messages %}{% set b = a %}{% for i, m in b | enumerate %}"
            "{{ m.content }}{% endfor %}",
            "string",
        ),
        # a loop over some other list's content is not a message's content
        (
            "{% for d in documents %}{% for c in d.content %}{{ c }}{% endfor %}{% endfor %}",
            "string",
        ),
        ("{% for m in messages %", "string"),  # does not parse
    ],
)
def test_detection_follows_the_syntax_tree(source: str, want: str) -> None:
    assert detect_content_format(source) == want


def test_normalise_matches_the_engines_message_shapes() -> None:
    msgs = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}],
            "extra": 1,
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "r",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x":1}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "out", "name": "f"},
    ]
    s = normalise(msgs, "string")
    assert s[0] == {"role": "system", "content": "s1\ns2"}  # unknown keys dropped
    assert s[1]["content"] == "" and s[1]["reasoning"] == s[1]["reasoning_content"] == "r"
    assert [c["function"]["arguments"] for c in s[1]["tool_calls"]] == [{}, {"x": 1}]
    assert s[2] == {"role": "tool", "content": "out", "tool_call_id": "c1", "name": "f"}
    o = normalise(msgs, "openai")
    assert o[0]["content"] == [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]
    assert o[1]["content"] == "" and o[2]["content"] == "out"  # strings stay strings
    assert msgs[1]["tool_calls"][1]["function"]["arguments"] == '{"x":1}'  # not mutated


def test_history_keys_follow_what_the_template_sees() -> None:
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    joined = {"role": "user", "content": "a\nb"}
    glued = {"role": "user", "content": "ab"}
    assert message_key(parts, "string") == message_key(joined, "string")
    assert message_key(parts, "string") != message_key(glued, "string")
    # a template that reads parts renders two parts (or one) differently from a string
    assert message_key(parts, "openai") != message_key(joined, "openai")
    one = {"role": "user", "content": [{"type": "text", "text": "a\nb"}]}
    assert message_key(one, "openai") != message_key(joined, "openai")
    assert message_key({"role": "assistant", "content": None}, "openai") == message_key(
        {"role": "assistant", "content": ""}, "openai"
    )
