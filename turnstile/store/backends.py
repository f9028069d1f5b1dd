"""The store's two databases, chosen by where the store is: the one module that imports both
implementations (``database`` holds only the contract they meet)."""

from __future__ import annotations

from pathlib import Path

from .database import Database, is_postgres, sqlite_path


def connect(location: str | Path, synchronous: str = "full", busy_timeout: float = 5.0) -> Database:
    """A connection to the store at ``location``: a ``postgresql://`` URL, or an SQLite file or
    the directory that holds ``turnstile.sqlite3``."""
    if is_postgres(location):
        try:
            from .postgres import PostgresDatabase
        except ImportError as exc:
            raise RuntimeError(
                f"a PostgreSQL store needs psycopg ({exc}): pip install 'turnstile[postgres]'"
            ) from exc

        return PostgresDatabase(str(location), synchronous)
    from .sqlite import SqliteDatabase

    return SqliteDatabase(sqlite_path(location), synchronous, busy_timeout)
