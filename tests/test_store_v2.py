"""Store schema v2: migration from v1 files, rewards, status, deletion, kept bodies, and the
per-token versions / per-call stitching built on the records."""

from __future__ import annotations

import sqlite3
from array import array

import numpy as np
import orjson
import pytest

from turnstile.store.records import CallRecord
from turnstile.store.schema import SchemaError
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch

pytestmark = pytest.mark.unit

# The v1 schema exactly as Turnstile 0.1.0 wrote it (commit 8b9cf0b).
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    metadata BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    parent_id TEXT,
    segment_reason TEXT,
    reused_prefix_len INTEGER NOT NULL,
    prompt_delta BLOB NOT NULL,
    completion_ids BLOB NOT NULL,
    completion_logprobs BLOB NOT NULL,
    finish_reason TEXT,
    stop_token_id INTEGER,
    seam TEXT,
    status TEXT NOT NULL,
    error TEXT,
    message BLOB,
    history_hash BLOB,
    prefix_hashes BLOB,
    info BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls(session_id, seq);
"""


def _call(
    cid: str,
    sid: str,
    seq: int,
    parent: str | None,
    delta: list[int],
    completion: list[int],
    logprobs: list[float],
    status: str = "ok",
    **info: object,
) -> CallRecord:
    prefix = 0
    return CallRecord(
        id=cid,
        session_id=sid,
        seq=seq,
        parent_id=parent,
        segment_reason=None if parent else "first_call",
        reused_prefix_len=prefix,
        prompt_delta=array("i", delta),
        completion_ids=array("i", completion),
        completion_logprobs=array("f", logprobs),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status=status,
        message={"role": "assistant", "content": "x"},
        info={"sampling": {"temperature": 0.7}, **info},
    )


def test_v1_file_is_migrated_in_place(tmp_path):
    path = tmp_path / "turnstile.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute(
        "INSERT INTO sessions VALUES (?, ?, ?)",
        ("s1", 1.5, orjson.dumps({"group": "g7", "sample_index": 3, "k": "v"})),
    )
    db.execute("INSERT INTO sessions VALUES (?, ?, ?)", ("s2", 2.5, orjson.dumps({})))
    row = (
        "c1",
        "s1",
        0,
        None,
        "first_call",
        0,
        array("i", [1, 2, 3]).tobytes(),
        array("i", [4, 5]).tobytes(),
        array("f", [-0.5, -1.5]).tobytes(),
        "stop",
        None,
        None,
        "ok",
        None,
        b'{"role":"assistant"}',
        None,
        b"",
        b'{"model":"m"}',
        3.0,
    )
    db.execute(f"INSERT INTO calls VALUES ({','.join('?' * 19)})", row)
    db.commit()
    db.close()

    store = Store(tmp_path)
    assert store.schema_version() == 4  # v1 → v2 → v3 (per-token arrays) → v4 (media)
    s1 = store.get_session("s1")
    assert s1["metadata"] == {"group": "g7", "sample_index": 3, "k": "v"}
    assert (s1["group_id"], s1["sample_index"], s1["status"], s1["created"]) == (
        "g7",
        3,
        "open",
        1.5,
    )
    assert store.get_session("s2")["group_id"] is None
    (c,) = store.calls("s1")
    assert c.prompt_delta.tolist() == [1, 2, 3] and c.completion_ids.tolist() == [4, 5]
    assert c.info == {"model": "m"} and c.arrays == {}  # a v1 row has no arrays' blob
    # v1 columns are kept as they were.
    cols = [r[1] for r in store._db.execute("PRAGMA table_info(sessions)")]
    assert cols[:3] == ["id", "created", "metadata"]
    store.close()
    # Opening again is a no-op.
    assert Store(tmp_path).schema_version() == 4


def test_a_newer_store_is_refused(tmp_path):
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / "turnstile.sqlite3")
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(SchemaError, match="99"):
        Store(tmp_path)


def test_rewards_status_listing_and_delete(tmp_path):
    store = Store(tmp_path)
    ids = [
        store.create_session({"n": i}, group_id="g" if i < 3 else "h", sample_index=i)
        for i in range(5)
    ]
    store.add_call(_call("c0", ids[0], 0, None, [1, 2], [3], [-0.1]))
    store.set_rewards(ids[0], {"correct": 1.0, "format": 0.5})
    assert store.get_session(ids[0])["reward"] == 1.5  # the sum when no scalar was given
    store.set_rewards(ids[0], {"reward": 0.25})
    store.set_rewards(ids[0], {"format": 0.0})  # upsert
    store.set_rewards(ids[0], {"reward": 2.0}, call_id="c0")
    s = store.get_session(ids[0])
    assert s["reward"] == 0.25
    assert s["rewards"] == {"correct": 1.0, "format": 0.0, "reward": 0.25}
    assert s["call_rewards"] == {"c0": {"reward": 2.0, "rewards": {"reward": 2.0}}}

    assert store.close_session(ids[1], "max_turns")
    first = store.get_session(ids[1])["closed"]
    assert store.close_session(ids[1])
    s1 = store.get_session(ids[1])
    assert (s1["status"], s1["closed"], s1["termination_reason"]) == ("closed", first, "max_turns")
    assert not store.close_session("nope")

    group, more = store.list_sessions(group_id="g")
    assert [s["id"] for s in group] == ids[:3] and not more
    page, more = store.list_sessions(limit=2)
    assert [s["id"] for s in page] == ids[:2] and more
    page, more = store.list_sessions(limit=2, after=ids[1])
    assert [s["id"] for s in page] == ids[2:4] and more
    assert [s["id"] for s in store.list_sessions(status="closed")[0]] == [ids[1]]

    assert store.delete_session(ids[0])
    assert store.get_session(ids[0]) is None and store.calls(ids[0]) == []
    assert store._db.execute("SELECT count(*) FROM rewards").fetchone()[0] == 0
    assert not store.delete_session(ids[0])
    assert store.delete_sessions(ids[1:3]) == 2
    assert [s["id"] for s in store.list_sessions()[0]] == ids[3:]


def test_bodies_are_kept_only_when_asked(tmp_path):
    req = {"messages": [{"role": "user", "content": "hi"}], "model": "m"}
    resp = {"choices": [{"message": {"content": "yo"}}]}
    keep = Store(tmp_path / "keep", keep_bodies=True)
    sid = keep.create_session()
    keep.add_call(_call("c1", sid, 0, None, [1], [2], [-1.0]), req, resp)
    assert keep.body("c1") == {"request": req, "response": resp}
    assert keep.drop_bodies(sid) == 1 and keep.body("c1") is None
    assert keep.calls(sid)[0].id == "c1"  # the token record stays

    drop = Store(tmp_path / "drop")
    sid = drop.create_session()
    drop.add_call(_call("c1", sid, 0, None, [1], [2], [-1.0]), req, resp)
    assert drop.body("c1") is None
    assert drop._db.execute("SELECT count(*) FROM bodies").fetchone()[0] == 0


def test_versions_and_per_call_samples(tmp_path):
    nan = float("nan")
    calls = [
        _call("a", "s", 0, None, [10, 11], [12, 13], [-0.1, nan], weight_version=7),
        _call(
            "b", "s", 1, "a", [14], [15, 16, 17], [-0.2, -0.3, -0.4], weight_version=["8", "8", "9"]
        ),
        _call("x", "s", 2, "b", [18], [19], [-0.5], status="aborted"),
        _call("c", "s", 3, "b", [20], [21], [-0.6], weight_version="sha-abc"),
    ]
    (m,) = stitch(calls, "merged")
    assert m.token_ids.tolist() == [10, 11, 12, 13, 14, 15, 16, 17, 20, 21]
    assert m.loss_mask.tolist() == [0, 0, 1, 1, 0, 1, 1, 1, 0, 1]
    assert m.versions.tolist() == [-1, -1, 7, 7, -1, 8, 8, 9, -1, -1]
    assert m.weight_versions == ["7", "9", "sha-abc"]
    assert m.prompt_len == 2 and m.call_ids == ["a", "b", "c"]
    lp = m.logprobs
    assert np.isnan(lp[3]) and lp[2] == np.float32(-0.1) and lp[:2].tolist() == [0, 0]
    j = m.to_json()
    assert j["logprobs"][3] is None and j["versions"][0] is None and j["versions"][2] == 7
    assert j["turns"][1]["temperature"] == 0.7

    per = stitch(calls, "per_call")
    assert [t.id for t in per] == ["a", "b", "c"]  # the aborted call is not a sample
    b = per[1]
    assert b.token_ids.tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert b.loss_mask.tolist() == [0] * 5 + [1] * 3
    assert b.logprobs[:5].tolist() == [0.0] * 5  # the earlier sample is context here
    assert b.versions.tolist() == [-1] * 5 + [8, 8, 9]
    assert b.prompt_len == 5 and b.turns[0]["prompt_start"] == 0
    with pytest.raises(ValueError):
        stitch(calls, "tree")
