"""The cache of session call trees keeps at most ``max_trees``: it drops the least recently used
idle trees first, never a busy one nor the one just fetched. Checked against a plain model of
that rule over generated sequences of calls starting and ending (the cache only walks as far
as it must drop; the model walks everything)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnstile.gateway.token_in.session_trees import SessionTrees
from turnstile.store.store import Store

pytestmark = pytest.mark.unit

ops = st.lists(st.tuples(st.sampled_from(["hold", "release"]), st.integers(0, 11)), max_size=60)


def _trim(order: list[str], busy: dict[str, int], cap: int) -> None:
    """The rule: oldest first, drop idle trees (not the newest) while over the cap."""
    for sid in [s for s in order[:-1] if not busy.get(s)]:
        if len(order) <= cap:
            break
        order.remove(sid)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store(tmp_path_factory.mktemp("trees") / "store.db")


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops, st.integers(1, 5))
def test_the_least_recently_used_idle_trees_are_dropped(store: Store, run: list, cap: int):
    renderer = SimpleNamespace(template=SimpleNamespace(content_format="string"), fingerprint="f")
    trees = SessionTrees(store, renderer, max_trees=cap)  # type: ignore[arg-type]
    order: list[str] = []
    busy: dict[str, int] = {}
    held: dict[str, list] = {}
    for op, k in run:
        sid = f"s{k}"
        if op == "hold":
            held.setdefault(sid, []).append(trees.hold(sid))
            if sid in order:
                order.remove(sid)
                order.append(sid)
            else:
                order.append(sid)
                _trim(order, busy, cap)
            busy[sid] = busy.get(sid, 0) + 1
        elif held.get(sid):
            trees.release(sid, held[sid].pop())
            busy[sid] -= 1
            _trim(order, busy, cap)
        assert list(trees.entries) == order
        assert {s: e.busy for s, e in trees.entries.items()} == {s: busy[s] for s in order}
