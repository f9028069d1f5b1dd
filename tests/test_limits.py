"""``server.limits.check`` against a recursive reference written from the rule: a request is
refused when any string anywhere in the body is longer than ``max_string`` or any object or
array sits deeper than ``max_depth`` (the body's own fields are at depth 1), and the refusal
names one field that breaks a limit (``a.b[0].c``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.errors import APIError
from turnstile.server.limits import Limits, check

pytestmark = pytest.mark.unit

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=7)
)
KEYS = st.sampled_from(["a", "b", "content", "role"])
JSON = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)),
    max_leaves=25,
)


def violations(v: object, name: str, depth: int, lim: Limits) -> set[str]:
    if isinstance(v, str):
        return {name} if len(v) > lim.max_string else set()
    if isinstance(v, (dict, list)):
        out = {name} if depth > lim.max_depth else set()
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            out |= violations(
                x, f"{name}[{k}]" if isinstance(k, int) else f"{name}.{k}", depth + 1, lim
            )
        return out
    return set()


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, JSON, max_size=4), st.integers(0, 6), st.integers(0, 4))
def test_check_refuses_exactly_what_breaks_a_limit(
    body: dict, max_string: int, max_depth: int
) -> None:
    lim = Limits(max_string=max_string, max_depth=max_depth)
    bad = set().union(*(violations(v, k, 1, lim) for k, v in body.items()))
    try:
        check(body, lim)
    except APIError as exc:
        assert exc.status == 400 and exc.param in bad, (exc.param, bad)
    else:
        assert not bad, bad
