"""A session as the API returns it: first-class fields, metadata and rewards from stored rows."""

from __future__ import annotations

import orjson

from .database import Row
from .records import INT32_MAX

# Metadata keys that name the first-class session fields when they are not given directly
# (v1 clients put them in metadata).
FIELD_ALIASES = {
    "group_id": ("group_id", "group"),
    "sample_index": ("sample_index",),
    "task_id": ("task_id", "task"),
}


def session_fields(metadata: dict, given: dict) -> dict:
    """group_id / sample_index / task_id: the explicit value, else the metadata alias."""
    out = {}
    for name, aliases in FIELD_ALIASES.items():
        v = given.get(name)
        if v is None:
            v = next((metadata[a] for a in aliases if metadata.get(a) is not None), None)
            if name == "sample_index":
                v = (
                    v
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT32_MAX
                    else None
                )
            elif v is not None and not isinstance(v, str):
                v = str(v)
        out[name] = v
    return out


def scalar_reward(named: dict[str, float]) -> float | None:
    """The one number a trainer uses: the component named ``reward`` if posted, else the sum
    of the named components, else None (no reward yet)."""
    if not named:
        return None
    if "reward" in named:
        return named["reward"]
    return float(sum(named.values()))


def session_from_row(r: Row, rewards: list[tuple]) -> dict:
    """A ``sessions`` row (read with the store's ``SESSION_COLUMNS``) with its reward rows."""
    named: dict[str, float] = {}
    per_call: dict[str, dict[str, float]] = {}
    for _sid, call_id, name, value in rewards:
        if call_id:
            per_call.setdefault(call_id, {})[name] = value
        else:
            named[name] = value
    return {
        "id": r["id"],
        "created": r["created"],
        "metadata": orjson.loads(r["metadata"]),
        "status": r["status"],
        "closed": r["closed"],
        "termination_reason": r["termination_reason"],
        "group_id": r["group_id"],
        "sample_index": r["sample_index"],
        "task_id": r["task_id"],
        "exported": r["exported"],
        "reward": scalar_reward(named),
        "rewards": named,
        "call_rewards": {
            cid: {"reward": scalar_reward(v), "rewards": v} for cid, v in per_call.items()
        },
    }
