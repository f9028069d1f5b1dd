"""Images in the PostgreSQL store (a real server): the same blob tables as SQLite, bytes once
per sha256 (read back with psycopg, not the Store), gone with the last session that refers
to them; a v3 database migrated in place."""

from __future__ import annotations

import hashlib

import psycopg
import pytest
from test_media_store import png, record

from turnstile.store.store import Store

pytestmark = pytest.mark.heavy


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def test_images_once_and_gone_with_the_last_session_on_postgres(postgres):
    url = postgres.database()
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    store = Store(url)
    for sid in ("a", "b"):
        store.create_session(session_id=sid)
    store.add_call(record("a", "c1", 0, [red]))
    store.add_call(record("a", "c2", 1, [red, blue]))
    store.add_call(record("b", "c3", 0, [red]))
    assert [m.sha256 for m in store.calls("a")[1].media] == [red.sha256, blue.sha256]
    got = rows(url, "SELECT sha256, mime, data FROM media_blobs ORDER BY sha256")
    assert sorted(got) == sorted((i.sha256, "image/png", i.data) for i in (red, blue))
    assert all(hashlib.sha256(d).hexdigest() == h for h, _, d in got)
    assert store.image("a", blue.sha256).data == blue.data
    assert store.image("b", blue.sha256) is None
    assert store.delete_session("a")
    assert rows(url, "SELECT sha256 FROM media_blobs") == [(red.sha256,)]
    assert store.delete_sessions(["b"]) == 1
    assert rows(url, "SELECT count(*) FROM media_blobs") == [(0,)]
    store.close()


def test_a_v3_postgres_store_is_migrated(postgres):
    url = postgres.database()
    store = Store(url)
    store.create_session(session_id="a")
    store.add_call(record("a", "c1", 0, []))
    store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE calls DROP COLUMN media")
        conn.execute("DROP TABLE media_blobs")
        conn.execute("DROP TABLE media_refs")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    store = Store(url)
    assert store.calls("a")[0].media == ()
    store.add_call(record("a", "c2", 1, [png((3, 3, 3))]))
    assert len(store.calls("a")[1].media) == 1
    assert rows(url, "SELECT value FROM meta WHERE key = 'schema_version'") == [("4",)]
    store.close()
