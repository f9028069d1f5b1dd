"""The one contract the :class:`~.store.Store` asks of a database, and opening one by location.

Two databases keep Turnstile's records: an SQLite file on the gateway's disk (the default: one
machine, nothing to run) and PostgreSQL (a fleet: every gateway replica writes one database
that outlives any node, and a trainer reads a batch whoever recorded it). The store writes its
SQL once, in the dialect both share (``?`` placeholders, ``INSERT ... ON CONFLICT``, a
``rowid`` column on sessions); what differs is declared here as :class:`SqlFacts`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def _errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed: SQLite only
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


# What a failing database raises, whichever it is (the server answers them as 503 store errors).
ERRORS: tuple[type[Exception], ...] = _errors()


@dataclass(frozen=True)
class SqlFacts:
    """What the two databases spell differently, as data."""

    name: str
    # appended to the read of a session row inside a call's write transaction, so that a
    # concurrent delete of the session waits for the call (SQLite's write lock already does)
    share_lock: str
    # an expression for ``info``'s top-level text field ``{key}`` (info is JSON bytes)
    info_field: str
    # an expression for a blob column's length in bytes
    blob_length: str


class Row(Protocol):
    """A row read by column name (``row["info"]``) or by position."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Database(Protocol):
    """One connection, in autocommit mode unless inside :meth:`transaction`. Not thread-safe:
    the store guards each connection with a lock."""

    facts: SqlFacts
    location: str

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def named(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Every row of a query, each readable by column name."""
        ...

    def transaction(self) -> AbstractContextManager[None]:
        """A write transaction (committed on exit, rolled back on an exception)."""
        ...

    def open_schema(self) -> None:
        """Create or migrate the tables (one process at a time; the others wait)."""
        ...

    def reader(self) -> Database:
        """A new read-only connection to the same database (for long reads off the lock)."""
        ...

    def vacuum(self) -> None: ...

    def close(self) -> None: ...


SQLITE_FILENAME = "turnstile.sqlite3"
_SQLITE_SUFFIXES = (".sqlite3", ".sqlite", ".db")


def sqlite_path(location: str | Path) -> Path:
    path = Path(location)
    return path if path.suffix in _SQLITE_SUFFIXES else path / SQLITE_FILENAME
