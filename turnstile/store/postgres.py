"""The store on PostgreSQL: every gateway replica of a fleet writes one database that outlives
any of them, and a trainer reads a batch whichever replica recorded it.

Same tables as SQLite (docs/schema.md) in PostgreSQL's types: blobs are ``bytea``, times
``double precision``, and sessions carry a ``rowid`` serial for creation order. A call's row
references its session (``ON DELETE CASCADE``) and its write reads the session ``FOR SHARE``,
so a delete and a call racing across replicas end in one order, never in an orphan call.

``synchronous``: ``full`` is PostgreSQL's default (``synchronous_commit = on``: a commit is
acknowledged once its WAL is flushed on the database's disk); ``normal`` turns that off for
this connection (a database crash can lose the last commits; a dead gateway loses nothing).
A broken connection (database restarted) is replaced on the next use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from .blobs import tables as media_tables
from .database import Row, SqlFacts
from .schema import SCHEMA_VERSION, SchemaError

FACTS = SqlFacts(
    name="postgresql",
    share_lock=" FOR SHARE",
    # json cannot turn an escaped NUL into text: a call whose info holds one (in any key)
    # would fail the whole listing, so it is read as U+FFFD
    info_field="(replace(convert_from(info, 'UTF8'), '\\u0000', '\\ufffd')::json ->> '{key}')",
    blob_length="length({col})",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    rowid BIGSERIAL UNIQUE,
    id TEXT PRIMARY KEY,
    created DOUBLE PRECISION NOT NULL,
    metadata BYTEA NOT NULL,
    status TEXT NOT NULL DEFAULT 'open',
    closed DOUBLE PRECISION,
    termination_reason TEXT,
    group_id TEXT,
    sample_index INTEGER,
    task_id TEXT,
    exported DOUBLE PRECISION,
    capability TEXT UNIQUE
);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    parent_id TEXT,
    segment_reason TEXT,
    reused_prefix_len INTEGER NOT NULL,
    prompt_delta BYTEA NOT NULL,
    completion_ids BYTEA NOT NULL,
    completion_logprobs BYTEA NOT NULL,
    finish_reason TEXT,
    stop_token_id INTEGER,
    seam TEXT,
    status TEXT NOT NULL,
    error TEXT,
    message BYTEA,
    history_hash BYTEA,
    prefix_hashes BYTEA,
    info BYTEA NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    arrays BYTEA,
    media BYTEA
);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls(session_id, seq);
CREATE INDEX IF NOT EXISTS sessions_by_group ON sessions(group_id, sample_index);
CREATE TABLE IF NOT EXISTS rewards (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL DEFAULT '',
    name TEXT NOT NULL,
    value DOUBLE PRECISION NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, call_id, name)
);
CREATE TABLE IF NOT EXISTS bodies (
    call_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    request BYTEA,
    response BYTEA
);
CREATE INDEX IF NOT EXISTS bodies_by_session ON bodies(session_id);
""" + media_tables("BYTEA", "DOUBLE PRECISION")

_SCHEMA_LOCK = 0x7475726E  # pg_advisory_xact_lock key: one replica creates the tables


T = TypeVar("T")
_IN_TRANSACTION = (TransactionStatus.INTRANS, TransactionStatus.INERROR, TransactionStatus.ACTIVE)


def _begin(conn: psycopg.Connection) -> AbstractContextManager[Any]:
    """A transaction with its BEGIN sent, so that a broken connection shows here."""
    tx = conn.transaction()
    tx.__enter__()
    return tx


@lru_cache(maxsize=256)
def _pg(sql: str) -> str:
    """The store's ``?`` placeholders as psycopg's ``%s`` (its SQL has no other ``%``/``?``)."""
    return sql.replace("?", "%s")


def redacted(url: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


class _Named:
    """A row readable by column name or position (as ``sqlite3.Row`` is)."""

    __slots__ = ("values", "index")

    def __init__(self, values: Sequence[Any], index: dict[str, int]):
        self.values = values
        self.index = index

    def __getitem__(self, key: int | str) -> Any:
        return self.values[self.index[key] if isinstance(key, str) else key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def keys(self) -> list[str]:
        return list(self.index)


def _named_rows(cursor: Any) -> Any:
    index = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: _Named(values, index)


class PostgresDatabase:
    facts = FACTS

    def __init__(self, url: str, synchronous: str, read_only: bool = False):
        self.url = url
        self.location = redacted(url)
        self.synchronous = synchronous
        self.read_only = read_only
        self.conn = self._connect()

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.url, autocommit=True)
        if self.synchronous == "normal":
            conn.execute("SET synchronous_commit TO off")
        if self.read_only:
            conn.execute("SET default_transaction_read_only TO on")
        return conn

    def _live(self) -> psycopg.Connection:
        if self.conn.closed or self.conn.broken:
            self.conn = self._connect()
        return self.conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor:
        return self._retried(lambda conn: conn.execute(_pg(sql), params))

    def _retried(self, run: Callable[[psycopg.Connection], T]) -> T:
        """``run`` on the connection, once more on a new one if the old one turns out broken
        (the database restarted since it was last used). Outside a transaction the store's
        statements are idempotent (upserts, coalescing updates, deletes, reads), and a
        transaction is only retried when its BEGIN failed, i.e. before it did anything."""
        if self.conn.info.transaction_status in _IN_TRANSACTION:
            return run(self.conn)  # a statement inside transaction(): never retried alone
        try:
            return run(self._live())
        except psycopg.OperationalError:
            if not self.conn.broken:
                raise
            return run(self._live())

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = list(rows)

        def run(conn: psycopg.Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(_pg(sql), batch)

        self._retried(run)

    def named(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        def run(conn: psycopg.Connection) -> list[Row]:
            with conn.cursor(row_factory=_named_rows) as cur:
                return cur.execute(_pg(sql), params).fetchall()

        return self._retried(run)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        tx = self._retried(_begin)
        try:
            yield
        except BaseException as exc:
            tx.__exit__(type(exc), exc, exc.__traceback__)  # rolls back
            raise
        tx.__exit__(None, None, None)  # commits

    def open_schema(self) -> None:
        with self.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            self.conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = self.conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise SchemaError(
                    f"{self.location} has schema version {row[0]}; this Turnstile "
                    f"reads up to {SCHEMA_VERSION}. Upgrade Turnstile."
                )
            self.conn.execute(SCHEMA)
            # v3: the per-token arrays' blob (older rows keep NULL)
            self.conn.execute("ALTER TABLE calls ADD COLUMN IF NOT EXISTS arrays BYTEA")
            # v4: a call's images (older rows keep NULL); the blob tables are in SCHEMA
            self.conn.execute("ALTER TABLE calls ADD COLUMN IF NOT EXISTS media BYTEA")
            self.conn.execute(
                "INSERT INTO meta VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def reader(self) -> PostgresDatabase:
        return PostgresDatabase(self.url, self.synchronous, read_only=True)

    def vacuum(self) -> None:
        self._live().execute("VACUUM")

    def close(self) -> None:
        self.conn.close()
