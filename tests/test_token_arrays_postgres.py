"""Per-token arrays on PostgreSQL (the suite's real server): the ``arrays`` column holds the same
bytes as on SQLite, read back by an independent client (psycopg), the stitched routing equals
SQLite's, and a v2 table (no ``arrays`` column) gains it on open with its rows still read."""

from __future__ import annotations

import tempfile

import numpy as np
import psycopg
import pytest
from test_token_arrays import LAYERS, K, _session

from turnstile.store.schema import SCHEMA_VERSION
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch

pytestmark = pytest.mark.heavy


def test_arrays_come_back_as_on_sqlite(postgres) -> None:
    url = postgres.database()
    table = np.random.default_rng(6).integers(0, 300, (15, LAYERS, K)).astype(np.uint16)
    calls = _session(table, (True, False, True))
    pg = Store(url)
    pg.create_session({}, "s")
    for c in calls:
        pg.add_call(c)
    with tempfile.TemporaryDirectory() as tmp:
        lite = Store(tmp)
        lite.create_session({}, "s")
        for c in calls:
            lite.add_call(c)
        (a,), (b,) = stitch(pg.calls("s")), stitch(lite.calls("s"))
        lite.close()
    pg.close()
    assert (a.arrays["routed_experts"] == b.arrays["routed_experts"]).all()
    assert (a.present["routed_experts"] == b.present["routed_experts"]).all()
    assert a.arrays["routed_experts"].dtype == np.uint16
    with psycopg.connect(url) as conn:
        blobs = [r[0] for r in conn.execute("SELECT arrays FROM calls ORDER BY seq")]
    assert blobs[1] is None  # the call with routing off stored none
    for blob, c in zip(blobs, calls, strict=True):
        if blob is not None:
            assert c.arrays["routed_experts"].values.tobytes() in bytes(blob)


def test_a_table_without_the_column_gains_it(postgres) -> None:
    url = postgres.database()
    Store(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE calls DROP COLUMN arrays")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    store = Store(url)
    store.create_session({}, "s")
    calls = _session(np.zeros((15, LAYERS, K), np.uint8), (True, True, True))
    store.add_call(calls[0])
    (back,) = store.calls("s")
    assert (back.arrays["routed_experts"].values == 0).all()
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
