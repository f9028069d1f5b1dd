"""The store on an SQLite file in WAL mode: one machine, nothing to run beside the gateway.

``synchronous``: ``full`` syncs the WAL on every commit (an acknowledged call survives an OS
crash); ``normal`` syncs at checkpoints (it survives a killed process only). Several processes
may write one file: each write transaction takes the file's write lock (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .database import Row, SqlFacts
from .schema import open_schema

FACTS = SqlFacts(
    name="sqlite",
    share_lock="",
    # SQLite's json_extract ends a string at an escaped NUL ("m\u0000" reads "m"); read as
    # U+FFFD, as PostgreSQL's spelling does (found by the differential test)
    info_field="json_extract(replace(CAST(info AS TEXT), '\\u0000', '\\ufffd'), '$.{key}')",
    blob_length="length({col})",
)


class SqliteDatabase:
    facts = FACTS

    def __init__(self, path: Path, synchronous: str, busy_timeout: float, read_only: bool = False):
        self.path = path
        self.location = str(path)
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        if read_only:
            self.conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=busy_timeout
            )
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=busy_timeout
        )
        self._wal(busy_timeout)
        self.conn.execute(f"PRAGMA synchronous={synchronous.upper()}")

    def _wal(self, busy_timeout: float) -> None:
        """Put the file in WAL mode, waiting out other processes as a write does: SQLite
        answers "database is locked" at once (its busy handler is not asked) when another
        connection holds the file while the journal mode is read or changed, which happens
        when a fleet's gateways open a new store together."""
        deadline = time.monotonic() + busy_timeout
        pause = 0.001
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def named(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def open_schema(self) -> None:
        open_schema(self.conn, self.path)

    def reader(self) -> SqliteDatabase:
        return SqliteDatabase(self.path, self.synchronous, self.busy_timeout, read_only=True)

    def vacuum(self) -> None:
        self.conn.execute("VACUUM")

    def close(self) -> None:
        self.conn.close()
