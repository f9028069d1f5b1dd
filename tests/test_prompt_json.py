"""The prompt's token IDs as JSON from kept blocks (``engines/prompt_json.py``): byte for byte
what orjson writes for the whole list, for generated sessions of prompts that extend, edit and
branch from each other, with blocks dropped under a small memory bound and with every block's
hash colliding (only the byte comparison then keeps the IDs apart)."""

from __future__ import annotations

from array import array

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.engines import prompt_json
from turnstile.engines.prompt_json import PromptJSON, wire_ids

pytestmark = pytest.mark.unit

INT32 = st.integers(-(2**31), 2**31 - 1)
TOKEN = st.one_of(st.integers(0, 200_000), INT32)


@st.composite
def sessions(draw) -> list[list[int]]:
    """Prompts as a gateway sends them: each a new one, or an earlier one extended, edited at
    one position, or cut and extended (a branch)."""
    prompts: list[list[int]] = [draw(st.lists(TOKEN, max_size=40))]
    for _ in range(draw(st.integers(1, 12))):
        base = list(draw(st.sampled_from(prompts)))
        how = draw(st.sampled_from(["new", "extend", "edit", "branch"]))
        if how == "new":
            base = draw(st.lists(TOKEN, max_size=40))
        elif how == "edit" and base:
            base[draw(st.integers(0, len(base) - 1))] = draw(TOKEN)
        elif how == "branch":
            base = base[: draw(st.integers(0, len(base)))]
        if how in ("extend", "branch"):
            base += draw(st.lists(TOKEN, max_size=20))
        prompts.append(base)
    return prompts


@settings(max_examples=300, deadline=None)
@given(sessions(), st.integers(1, 9), st.integers(0, 400), st.sampled_from([0.0, 60.0]))
def test_equal_to_orjson_for_every_prompt_of_generated_sessions(prompts, block, max_bytes, idle):
    cache = PromptJSON(max_bytes=max_bytes, block=block, idle_s=idle)
    for ids in prompts:
        assert cache.dumps(array("i", ids)) == orjson.dumps(ids)
        assert cache.bytes <= max_bytes
        kept = sum(len(a) + len(b) for a, b, _ in cache._kept.values())
        assert cache.bytes == kept


@settings(max_examples=150, deadline=None)
@given(sessions(), st.integers(1, 5))
def test_exact_when_every_block_hash_collides(prompts, block):
    cache = PromptJSON(max_bytes=1 << 20, block=block)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prompt_json.xxhash, "xxh3_64_intdigest", lambda _b: 7)
        for ids in prompts:
            assert cache.dumps(array("i", ids)) == orjson.dumps(ids)


def test_blocks_are_reused_and_shared_between_prompts():
    """The second prompt's kept blocks are the first one's (the same bytes objects), and only
    the new blocks are added."""
    cache = PromptJSON(block=4)
    first = array("i", range(100, 120))
    cache.dumps(first)
    kept = dict(cache._kept)
    assert len(kept) == 5
    second = array("i", range(100, 130))
    assert cache.dumps(second) == orjson.dumps(list(second))
    assert len(cache._kept) == 7
    assert all(cache._kept[k] is v for k, v in kept.items())


def test_wire_ids_writes_an_int32_array_as_a_fragment_and_a_list_as_is():
    ids = array("i", range(prompt_json.BLOCK * 2 + 3))
    body = orjson.dumps({"token_ids": wire_ids(ids), "stream": False})
    assert orjson.loads(body) == {"token_ids": list(ids), "stream": False}
    assert wire_ids([1, 2]) == [1, 2]
    assert wire_ids(array("q", [1, 2])) == [1, 2]


def test_the_least_recently_used_block_is_dropped_first():
    cache = PromptJSON(block=2, idle_s=0)
    a, b, c = array("i", [1, 2]), array("i", [3, 4]), array("i", [5, 6])
    cache.dumps(a)
    cache.max_bytes = 2 * cache.bytes  # room for two blocks
    cache.dumps(b)
    cache.dumps(a)  # a is used again: b is now the oldest
    cache.dumps(c)
    assert [ids for ids, *_ in cache._kept.values()] == [a.tobytes(), c.tobytes()]


def test_a_round_of_sessions_bigger_than_the_cache_still_finds_blocks():
    """Three sessions in turn, room for two: least-recently-used alone would drop each block
    just before it is asked for again (no hits); blocks in use are kept instead, and once
    unused for ``idle_s`` make room."""
    t = [0.0]
    cache = PromptJSON(block=2, idle_s=60, clock=lambda: t[0])
    a, b, c = array("i", [1, 2]), array("i", [3, 4]), array("i", [5, 6])
    cache.dumps(a)
    cache.max_bytes = 2 * cache.bytes
    hits = 0
    for _ in range(5):
        for ids in (a, b, c):
            t[0] += 1
            before = {k: v[2] for k, v in cache._kept.items()}
            assert cache.dumps(ids) == orjson.dumps(list(ids))
            hits += any(cache._kept[k][2] != before[k] for k in before if k in cache._kept)
    assert hits == 9  # a every round, b from the second on (c never: no room while in use)
    assert [ids for ids, *_ in cache._kept.values()] == [a.tobytes(), b.tobytes()]
    t[0] += 61  # a and b unused for a minute: c takes the oldest one's room
    cache.dumps(c)
    assert [ids for ids, *_ in cache._kept.values()] == [b.tobytes(), c.tobytes()]
