"""Opening one SQLite store from several gateways at once (a fleet starting on a new file):
SQLite refuses the switch to WAL at once, without asking its busy handler, while another
connection holds the file's write lock in rollback mode; the store must wait it out as any
write does (CI saw a benchmark's writer process die on "database is locked" at open)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from turnstile.store.store import Store

pytestmark = pytest.mark.unit


def _held(path: Path, seconds: float) -> sqlite3.Connection:
    """A connection holding the write lock of a new rollback-journal file for ``seconds``."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE other(x)")
    conn.execute("BEGIN IMMEDIATE")
    threading.Timer(seconds, lambda: conn.execute("COMMIT")).start()
    return conn


def test_open_waits_out_a_write_lock_on_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "turnstile.sqlite3"
    held = _held(path, 0.3)
    t0 = time.monotonic()
    store = Store(path)
    waited = time.monotonic() - t0
    assert store.schema_version() >= 1
    assert waited >= 0.25, waited  # it waited for the lock, not around it
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close()
    held.close()


def test_open_gives_up_after_its_busy_timeout(tmp_path: Path) -> None:
    """A lock held past the busy timeout is still an error, named as SQLite names it."""
    path = tmp_path / "turnstile.sqlite3"
    held = _held(path, 1.5)
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        Store(path, busy_timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 1.4
    time.sleep(1.3)
    held.close()


def _open_and_write(path: str, tag: str, out: multiprocessing.Queue) -> None:
    try:
        store = Store(path)
        store.create_session({}, tag)
        store.close()
        out.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test with it
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_fleet_opens_one_new_file_together(tmp_path: Path) -> None:
    """Eight processes open the same new file at once, ten times over: every one opens it."""
    ctx = multiprocessing.get_context("fork")
    for trial in range(10):
        path = str(tmp_path / f"t{trial}.sqlite3")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_open_and_write, args=(path, f"s{trial}-{i}", out)) for i in range(8)
        ]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert got == ["ok"] * len(procs), got
