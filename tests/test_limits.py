"""``server.limits.check`` against a recursive reference written from the rule: a request is
refused when any string anywhere in the body is longer than ``max_string`` or any object or
array sits deeper than ``max_depth`` (the body's own fields are at depth 1), and the refusal
names one field that breaks a limit (``a.b[0].c``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.errors import APIError
from turnstile.server.limits import Checked, Limits, check

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


MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]), "content": JSON})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(MESSAGE, max_size=5),
    st.lists(MESSAGE, max_size=5),
    st.integers(0, 5),
    st.integers(1, 5),
    st.integers(2, 6),
)
def test_a_checked_history_lets_nothing_new_through(
    first: list[dict], later: list[dict], cut: int, max_string: int, max_depth: int
) -> None:
    """A session's next body (its history resent, cut anywhere, then anything appended or
    changed) is refused exactly when the stateless walk refuses it: what passed before is
    skipped only where it is equal, so an oversized message anywhere still fails."""
    lim = Limits(max_string=max_string, max_depth=max_depth)
    checked = Checked(lim)
    try:
        checked.check("s", {"messages": first, "tools": []})
    except APIError:
        pass
    body = {"messages": [*first[:cut], *later], "tools": []}
    bad = set().union(*(violations(v, k, 1, lim) for k, v in body.items()))
    try:
        checked.check("s", body)
    except APIError as exc:
        assert exc.param in bad, (exc.param, bad)
    else:
        assert not bad, bad


def test_an_oversized_message_after_a_passed_history_is_refused() -> None:
    lim = Limits(max_string=10)
    checked = Checked(lim)
    hist = [{"role": "user", "content": "short"}, {"role": "tool", "content": "ok"}]
    checked.check("s", {"messages": hist})
    # appended, replacing an old one in place, nested in parts, or one level too deep
    for msgs, where in (
        ([*hist, {"role": "tool", "content": "x" * 11}], "messages[2].content"),
        ([hist[0], {"role": "tool", "content": "x" * 11}], "messages[1].content"),
        ([*hist, {"content": [{"text": "y" * 11}]}], "messages[2].content[0].text"),
        ([*hist, "z" * 11], "messages[2]"),
    ):
        with pytest.raises(APIError) as exc:
            checked.check("s", {"messages": msgs})
        assert exc.value.param == where
        checked.check("s", {"messages": hist})  # the session's last passed body again
    deep: object = "a"
    for _ in range(70):
        deep = [deep]
    with pytest.raises(APIError):
        checked.check("s", {"messages": [*hist, {"content": deep}]})
    # another session has its own history; a forgotten one is walked whole again
    with pytest.raises(APIError):
        checked.check("t", {"messages": [{"content": "x" * 11}]})
    checked.forget("s")
    checked.check("s", {"messages": hist})
