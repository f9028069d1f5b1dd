"""Sessions as the viewer lists them: each session's row with what its calls add up to (calls,
errors, new segments, tokens, model), filtered, counted and sorted.

Read on a read-only connection of its own (SQLite ``mode=ro``, a PostgreSQL read-only session):
a listing over many sessions never holds the store's lock, and the viewer cannot write through
it."""

from __future__ import annotations

from dataclasses import dataclass

from ..store.contracts import SessionStore
from ..store.database import Database
from ..store.schema import SESSION_COLUMNS
from ..store.session_rows import session_from_row

SORTS = ("created", "reward", "calls", "errors", "segments", "sampled", "length")

# One row per session that has calls. ``length``: the longest context a call ran with (its
# reused prefix + prompt delta + completion), which is the longest merged sample's length.
_CALLS = """
SELECT session_id, count(*), sum(CASE WHEN status = 'ok' THEN 1 ELSE 0 END),
       sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END),
       sum(CASE WHEN status = 'aborted' THEN 1 ELSE 0 END),
       sum(CASE WHEN segment_reason IS NOT NULL AND segment_reason != 'first_call'
           THEN 1 ELSE 0 END),
       sum(CASE WHEN status = 'ok' THEN length(completion_ids) ELSE 0 END) / 4,
       max(CASE WHEN status = 'ok' THEN reused_prefix_len + (length(prompt_delta)
           + length(completion_ids)) / 4 ELSE 0 END),
       max(created)
FROM calls GROUP BY session_id
"""
# length() is bytes for both databases' blobs (4 per token ID); the model names are read
# from each call's info JSON, whose spelling differs (``SqlFacts.info_field``).
_MODELS = "SELECT DISTINCT session_id, {model} FROM calls"
_FIELDS = ("calls", "ok", "errors", "aborted", "segments", "sampled", "length", "last_call")


@dataclass(frozen=True)
class Query:
    """What the list shows: filters (None: any), the sort key and a page."""

    group: str | None = None
    status: str | None = None
    model: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    new_segments: bool | None = None
    since: float | None = None
    until: float | None = None
    sort: str = "created"
    descending: bool = True
    limit: int = 200
    offset: int = 0


def summaries(store: SessionStore) -> list[dict]:
    """Every session as a dict: the API's session fields plus ``calls``, ``ok``, ``errors``,
    ``aborted``, ``segments`` (new segments after the first call), ``sampled`` (tokens sampled
    by ok calls), ``length``, ``last_call`` and ``models``."""
    db: Database = store.reader()
    try:
        rows = db.named(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY rowid")
        rewards: dict[str, list[tuple]] = {}
        for r in db.execute("SELECT session_id, call_id, name, value FROM rewards"):
            rewards.setdefault(r[0], []).append(tuple(r))
        agg = {r[0]: r for r in db.execute(_CALLS)}
        models: dict[str, list[str]] = {}
        for sid, model in db.execute(_MODELS.format(model=db.facts.info_field.format(key="model"))):
            if model:  # (PostgreSQL's reads NUL as U+FFFD: the listing shows it so on both)
                models.setdefault(sid, []).append(model.replace("\x00", "\ufffd"))
    finally:
        db.close()
    out = []
    for row in rows:
        s = session_from_row(row, rewards.get(row["id"], []))
        a = agg.get(s["id"])
        s.update(
            dict(zip(_FIELDS[:7], map(int, a[1:8]), strict=True)) | {"last_call": a[8]}
            if a
            else dict.fromkeys(_FIELDS, 0) | {"last_call": None}
        )
        s["models"] = sorted(models.get(s["id"], []))
        s["n_calls"] = s["calls"]
        out.append(s)
    return out


def select(sessions: list[dict], q: Query) -> dict:
    """The page of ``sessions`` that ``q`` asks for, with counts of what matched and the
    values the filters can take (groups, models)."""

    def keep(s: dict) -> bool:
        r = s["reward"]
        return (
            (q.group is None or s["group_id"] == q.group)
            and (q.status is None or s["status"] == q.status)
            and (q.model is None or q.model in s["models"])
            and (q.min_reward is None or (r is not None and r >= q.min_reward))
            and (q.max_reward is None or (r is not None and r <= q.max_reward))
            and (q.new_segments is None or (s["segments"] > 0) == q.new_segments)
            and (q.since is None or s["created"] >= q.since)
            and (q.until is None or s["created"] <= q.until)
        )

    matched = [s for s in sessions if keep(s)]
    key = "n_calls" if q.sort == "calls" else q.sort
    known = [s for s in matched if s[key] is not None]
    known.sort(key=lambda s: s[key], reverse=q.descending)
    ordered = known + [s for s in matched if s[key] is None]  # no reward yet: last
    rewards = [s["reward"] for s in matched if s["reward"] is not None]
    return {
        "object": "list",
        "data": ordered[q.offset : q.offset + q.limit],
        "total": len(sessions),
        "matched": len(matched),
        "counts": {
            "open": sum(s["status"] == "open" for s in matched),
            "closed": sum(s["status"] == "closed" for s in matched),
            "with_new_segments": sum(s["segments"] > 0 for s in matched),
            "with_errors": sum(s["errors"] + s["aborted"] > 0 for s in matched),
            "rewarded": len(rewards),
        },
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "groups": sorted({s["group_id"] for s in sessions if s["group_id"] is not None}),
        "models": sorted({m for s in sessions for m in s["models"]}),
    }
