"""Images in the store (store/blobs.py, schema v4): a call's media items in ``calls.media``,
each image's bytes once in ``media_blobs`` whoever sent it, read back scoped to a session,
gone with the last session that refers to it; a v3 store migrated in place. Checked with
an independent reader (sqlite3 on the file), not only the Store's own account."""

from __future__ import annotations

import hashlib
import io
import sqlite3
from array import array

import pytest
from PIL import Image as PILImage

from turnstile import media
from turnstile.store import blobs
from turnstile.store.records import CallRecord
from turnstile.store.schema import SCHEMA_VERSION
from turnstile.store.store import Store

pytestmark = pytest.mark.unit


def png(color: tuple[int, int, int]) -> media.Image:
    out = io.BytesIO()
    PILImage.new("RGB", (6, 4), color).save(out, "PNG")
    return media.decode(out.getvalue())


def record(sid: str, cid: str, seq: int, images: list[media.Image]) -> CallRecord:
    items = tuple(
        media.MediaItem(i.sha256, i.mime, 2 + 7 * k, 7, {"name": "P"}, (1, 3, 32, 32))
        for k, i in enumerate(images)
    )
    return CallRecord(
        id=cid,
        session_id=sid,
        seq=seq,
        parent_id=None,
        segment_reason="first_call",
        reused_prefix_len=0,
        prompt_delta=array("i", range(2 + 7 * len(images) + 3)),
        completion_ids=array("i", [5, 6]),
        completion_logprobs=array("f", [-0.5, -0.25]),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        media=items,
        images={i.sha256: i for i in images},
    )


def file_rows(tmp_path, sql: str) -> list[tuple]:
    db = sqlite3.connect(tmp_path / "turnstile.sqlite3")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def test_images_are_stored_once_and_go_with_the_last_session(tmp_path):
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    store = Store(tmp_path)
    for sid in ("a", "b"):
        store.create_session(session_id=sid)
    store.add_call(record("a", "c1", 0, [red]))
    store.add_call(record("a", "c2", 1, [red, blue]))  # the same screenshot again
    store.add_call(record("b", "c3", 0, [red]))  # and in another session
    store.add_call(record("b", "c4", 1, []))  # text only
    c1, c2 = store.calls("a")
    assert [m.sha256 for m in c2.media] == [red.sha256, blue.sha256]
    assert c2.media[1].offset == 9 and c2.media[1].grid == (1, 3, 32, 32)
    assert store.calls("b")[1].media == ()
    # the file: each image's bytes once, keyed by their sha256; a text call's column NULL
    rows = file_rows(tmp_path, "SELECT sha256, mime, data FROM media_blobs ORDER BY sha256")
    assert sorted(rows) == sorted((i.sha256, "image/png", i.data) for i in (red, blue))
    assert all(hashlib.sha256(d).hexdigest() == h for h, _, d in rows)
    assert file_rows(tmp_path, "SELECT media FROM calls WHERE id = 'c4'") == [(None,)]
    # scoped: a session reads only images it refers to
    with store._lock:
        assert blobs.read_image(store._db, blue.sha256, "a").data == blue.data
        assert blobs.read_image(store._db, blue.sha256, "b") is None
    assert store.delete_session("a")
    got = file_rows(tmp_path, "SELECT sha256 FROM media_blobs")
    assert got == [(red.sha256,)]  # blue went with a; red is still b's
    assert store.delete_sessions(["b"]) == 1
    assert file_rows(tmp_path, "SELECT count(*) FROM media_blobs") == [(0,)]
    assert file_rows(tmp_path, "SELECT count(*) FROM media_refs") == [(0,)]
    store.close()


def test_a_failed_call_writes_no_images(tmp_path):
    store = Store(tmp_path)
    store.create_session(session_id="a")
    store.add_call(record("a", "c1", 0, []))
    with pytest.raises(Exception):  # noqa: B017 - the id is taken: the call's savepoint rolls back
        store.add_call(record("a", "c1", 1, [png((1, 2, 3))]))
    assert file_rows(tmp_path, "SELECT count(*) FROM media_blobs") == [(0,)]
    store.close()


def test_a_v3_store_is_migrated_and_its_calls_read_without_images(tmp_path):
    store = Store(tmp_path)
    store.create_session(session_id="a")
    store.add_call(record("a", "c1", 0, []))
    store.close()
    db = sqlite3.connect(tmp_path / "turnstile.sqlite3")
    db.execute("ALTER TABLE calls DROP COLUMN media")
    db.execute("DROP TABLE media_blobs")
    db.execute("DROP TABLE media_refs")
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    store = Store(tmp_path)
    assert store.schema_version() == SCHEMA_VERSION == 4
    (c,) = store.calls("a")
    assert c.media == () and c.completion_ids.tolist() == [5, 6]
    store.add_call(record("a", "c2", 1, [png((9, 9, 9))]))
    assert len(store.calls("a")[1].media) == 1
    store.close()


def test_trajectories_carry_the_images_at_their_spans_into_json_and_parquet(tmp_path):
    import pyarrow as pa

    from turnstile.store.export_rows import trajectory_row
    from turnstile.store.export_schema import arrow_schemas
    from turnstile.store.trajectories import Trajectory, stitch

    red, blue = png((255, 0, 0)), png((0, 0, 255))
    store = Store(tmp_path)
    store.create_session(session_id="a")
    store.add_call(record("a", "c1", 0, [red, blue]))
    (t,) = stitch(store.calls("a"))
    want = [
        {"sha256": red.sha256, "mime": "image/png", "offset": 2, "length": 7},
        {"sha256": blue.sha256, "mime": "image/png", "offset": 9, "length": 7},
    ]
    assert t.images == want
    assert Trajectory.from_json(t.to_json()).images == want
    schema = arrow_schemas()["trajectories"]
    table = pa.Table.from_pylist([trajectory_row(t, "b1")], schema=schema)
    assert table.column("images").to_pylist() == [want]
    # a text sample: no images key in its JSON (text stays as it was), an empty column
    store.add_call(record("a", "c2", 1, []))
    text = [s for s in stitch(store.calls("a")) if not s.images]
    assert text and "images" not in text[0].to_json()
    store.close()


def test_verl_agent_loop_outputs_carry_the_pixels(tmp_path):
    from turnstile.converters.verl import to_verl_agent_loop_outputs
    from turnstile.store.trajectories import stitch

    red, blue = png((255, 0, 0)), png((0, 0, 255))
    store = Store(tmp_path)
    store.create_session(session_id="a")
    store.add_call(record("a", "c1", 0, [red, blue]))
    trajs = stitch(store.calls("a"))
    with pytest.raises(ValueError, match="image_bytes"):
        to_verl_agent_loop_outputs(trajs)
    (d,) = to_verl_agent_loop_outputs(trajs, image_bytes=lambda s, h: store.image(s, h).data)
    got = d["multi_modal_data"]["images"]
    for im, want in zip(got, (red, blue), strict=True):
        src = PILImage.open(io.BytesIO(want.data)).convert("RGB")
        assert im.size == src.size and im.tobytes() == src.tobytes()
    store.close()
