"""A group's trajectories for a trainer on Ray, through the object store (no JSON round trip).

:func:`trajectories` runs one Ray task on the node that holds the record store; it stitches
the group's sessions (``store.trajectories``) and yields each sample, a
:class:`~turnstile.store.trajectories.Trajectory` with numpy arrays, as its own object: the
caller (a trainer actor, anywhere in the cluster) gets object refs, and ``ray.get`` maps the
arrays out of shared memory without copying them through JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ...store.store import Store
from ...store.trajectories import Trajectory, stitch


def _samples(data: str, group_id: str, mode: str) -> Iterator[Trajectory]:
    store = Store(data)
    try:
        sessions: list[dict] = []
        after = None
        while True:
            page, more = store.list_sessions(group_id=group_id, limit=1000, after=after)
            sessions += page
            if not more or not page:
                break
            after = page[-1]["id"]
        sessions.sort(
            key=lambda s: (s.get("sample_index") is None, s.get("sample_index") or 0, s["id"])
        )
        for s in sessions:
            for t in stitch(store.calls(s["id"]), mode):
                yield t.with_session(s)
    finally:
        store.close()


_read = ray.remote(num_cpus=0, num_returns="streaming")(_samples)


def trajectories(
    group_id: str, data: str, mode: str = "merged", node_id: str | None = None
) -> list[ray.ObjectRef]:
    """Object refs of the group's samples, in sample-index order. ``data`` is the gateways'
    store: their ``--store`` PostgreSQL URL (read from any node: every replica's records are
    there), or their ``--data`` directory on the node ``node_id`` (default: this one)."""
    node = node_id or ray.get_runtime_context().get_node_id()
    gen: Any = _read.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote(data, group_id, mode)
    return list(gen)
