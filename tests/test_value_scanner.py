"""``parsing.jsoncalls.ValueScanner`` finds where a streamed JSON object or array ends,
whatever the chunking: checked against ``json.dumps`` (the value's own length, with text
after it) and against the plain character-by-character rule on any text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.parsing.jsoncalls import ValueScanner

pytestmark = pytest.mark.unit

TEXT = st.text(alphabet=st.sampled_from('{}[]"\\ a:,é\n'), max_size=60)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(), max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=20,
)


def _chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _end(scanner: ValueScanner, chunks: list[str]) -> int | None:
    """The offset in the whole text just past the value, as fed chunk by chunk."""
    at = 0
    for chunk in chunks:
        got = scanner.feed(chunk)
        if got is not None:
            return at + got
        at += len(chunk)
    return None


@settings(max_examples=400)
@given(
    value=st.one_of(st.lists(JSON_VALUES, max_size=4), st.dictionaries(st.text(), JSON_VALUES)),
    after=TEXT,
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
)
def test_the_end_of_a_json_value(value, after: str, cuts: list[int], ascii_only: bool, indent):  # noqa: ANN001
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert _end(ValueScanner(depth=0), _chunks(raw + after, cuts)) == len(raw)
    # after the opening bracket, as the Hermes parser starts it
    assert _end(ValueScanner(depth=1), _chunks(raw[1:] + after, cuts)) == len(raw) - 1


class _CharByChar:
    """The rule, one character at a time."""

    def __init__(self, depth: int) -> None:
        self.depth, self.in_string, self.escaped = depth, False, False

    def feed(self, text: str) -> int | None:
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


@settings(max_examples=600)
@given(text=TEXT, cuts=st.lists(st.integers(0, 100), max_size=8), depth=st.integers(0, 2))
def test_any_text_as_the_rule_one_character_at_a_time(text: str, cuts: list[int], depth: int):
    ours, rule = ValueScanner(depth), _CharByChar(depth)
    for chunk in _chunks(text, cuts):
        assert ours.feed(chunk) == rule.feed(chunk)
        state = (ours.depth, ours._in_string, ours._escaped)
        assert state == (rule.depth, rule.in_string, rule.escaped)
