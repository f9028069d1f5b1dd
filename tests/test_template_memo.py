"""The memoised ``tojson`` of compiled templates (chat.template.memo_tojson) answers exactly
what ``json.dumps`` answers, whatever came before: values that orjson writes alike but
json.dumps does not (NaN / infinities vs null) are never served from the cache."""

from __future__ import annotations

import json
import math

import pytest

from turnstile.chat.template import memo_tojson

pytestmark = pytest.mark.unit


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):  # noqa: ANN001, ANN201
    # transformers' filter, as chat_template_utils defines it
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


VALUES = [
    None,
    math.nan,
    math.inf,
    -math.inf,
    {"a": None},
    {"a": math.nan},
    [None, 1],
    [math.inf, 1],
    1,
    1.0,
    True,
    0.0,
    -0.0,
    "1",
    "é ☃ \\u2028",
    {"b": 1, "a": 2},
    {"a": 2, "b": 1},
    (1, 2),
    [1, 2],
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {1: "int key"},
    2**70,
    "\ud800",
]


@pytest.mark.parametrize("kwargs", [{}, {"indent": 2}, {"ensure_ascii": True}, {"sort_keys": True}])
def test_memo_answers_as_json_dumps_in_any_order(kwargs: dict) -> None:
    memo = memo_tojson(tojson)
    for order in (VALUES, VALUES[::-1], VALUES + VALUES):
        for v in order:
            assert memo(v, **kwargs) == tojson(v, **kwargs), v


def test_memo_refuses_what_tojson_refuses() -> None:
    memo = memo_tojson(tojson)

    class Obj:
        pass

    for _ in range(2):
        with pytest.raises(TypeError):
            memo(Obj())
        with pytest.raises(TypeError):
            memo({"when": __import__("datetime").date(2020, 1, 1)})  # orjson writes dates
