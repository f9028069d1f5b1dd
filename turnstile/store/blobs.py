"""Images stored once: a content-addressed blob table and each session's references to it.

A screenshot re-sent on every turn of every session of a group is one row of
``media_blobs`` (keyed by the sha256 of its bytes) and one ``media_refs`` row per session
that holds it; the calls keep only their items (hash, span, processor, grid) in
``calls.media``. A blob goes with the last session that refers to it (:func:`drop_refs`,
called inside the transaction that deletes sessions). The same SQL on both databases; the
column types are the only difference (:func:`tables`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import orjson

from ..media import Image, MediaItem, items_from_json, items_to_json
from .database import Database


def tables(blob: str = "BLOB", real: str = "REAL") -> str:
    """The two tables' DDL (SQLite's types by default; PostgreSQL: BYTEA, DOUBLE PRECISION)."""
    return f"""
CREATE TABLE IF NOT EXISTS media_blobs (
    sha256 TEXT PRIMARY KEY,
    mime TEXT NOT NULL,
    data {blob} NOT NULL,
    created {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS media_refs (
    session_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (session_id, sha256)
);
CREATE INDEX IF NOT EXISTS media_refs_by_hash ON media_refs(sha256)
"""


def pack_media(items: Sequence[MediaItem]) -> bytes | None:
    """A call's media items as its ``calls.media`` value (NULL for a text-only call)."""
    return orjson.dumps(items_to_json(items)) if items else None


def unpack_media(blob: bytes | None) -> tuple[MediaItem, ...]:
    return items_from_json(orjson.loads(blob)) if blob else ()


_BLOB = "INSERT INTO media_blobs VALUES (?, ?, ?, ?) ON CONFLICT (sha256) DO NOTHING"
_REF = "INSERT INTO media_refs VALUES (?, ?) ON CONFLICT (session_id, sha256) DO NOTHING"


def write_images(db: Database, session_id: str, images: Iterable[Image]) -> None:
    """Each image's bytes (once, whoever stored them first) and the session's reference,
    inside the caller's transaction (the call's savepoint: a call and its images land or
    fail together)."""
    now = time.time()
    for image in images:
        db.execute(_BLOB, (image.sha256, image.mime, image.data, now))
        db.execute(_REF, (session_id, image.sha256))


def read_image(db: Database, sha256: str, session_id: str | None = None) -> Image | None:
    """An image's bytes by hash; with ``session_id``, only if that session refers to it (a
    session's capability reads its own images, not every image in the store)."""
    if session_id is None:
        row = db.execute("SELECT mime, data FROM media_blobs WHERE sha256 = ?", (sha256,))
    else:
        row = db.execute(
            "SELECT b.mime, b.data FROM media_blobs b JOIN media_refs r ON r.sha256 = b.sha256 "
            "WHERE b.sha256 = ? AND r.session_id = ?",
            (sha256, session_id),
        )
    got = row.fetchone()
    if got is None:
        return None
    data = bytes(got[1])
    return Image(data, sha256, got[0], 0, 0)


def drop_refs(db: Database, session_ids: Sequence[str]) -> int:
    """Forget these sessions' references and delete the blobs no session refers to any more
    (inside the caller's transaction); how many blobs went."""
    if not session_ids:
        return 0
    for i in range(0, len(session_ids), 500):
        chunk = list(session_ids[i : i + 500])
        marks = ",".join("?" * len(chunk))
        db.execute(f"DELETE FROM media_refs WHERE session_id IN ({marks})", chunk)
    cur = db.execute(
        "DELETE FROM media_blobs WHERE NOT EXISTS "
        "(SELECT 1 FROM media_refs r WHERE r.sha256 = media_blobs.sha256)"
    )
    return max(cur.rowcount, 0)


def count(db: Database) -> tuple[int, int]:
    """(blobs, references): for tests and the viewer's totals."""
    blobs = db.execute("SELECT count(*) FROM media_blobs").fetchone()[0]
    refs = db.execute("SELECT count(*) FROM media_refs").fetchone()[0]
    return int(blobs), int(refs)
