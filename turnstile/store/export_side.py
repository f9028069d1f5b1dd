"""The store's side of an export (``store.export``): the rows as stored, a per-session signature
read before them, and deletes that spare any session recorded on since."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from .blobs import drop_refs
from .database import Database, Row
from .schema import CALL_COLUMNS

_TABLES = ("calls", "rewards", "bodies")  # a session's rows beside its own

_SIGNATURE = (
    "SELECT (SELECT count(*) FROM calls WHERE session_id = ?), "
    "(SELECT max(created) FROM calls WHERE session_id = ?), "
    "(SELECT count(*) FROM rewards WHERE session_id = ?), "
    "(SELECT max(created) FROM rewards WHERE session_id = ?), "
    "(SELECT status || ':' || coalesce(termination_reason, '') FROM sessions "
    "WHERE id = ?)"
)


def _signature(db: Database, session_id: str) -> tuple:
    return tuple(db.execute(_SIGNATURE, (session_id,) * 5).fetchone())


def delete_ids(db: Database, ids: list[str]) -> int:
    """Delete sessions with their rows (inside the caller's transaction); how many."""
    n = 0
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for table in _TABLES:
            db.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})", chunk)
        n += db.execute(f"DELETE FROM sessions WHERE id IN ({marks})", chunk).rowcount
    drop_refs(db, ids)  # their images, unless another session has them
    return n


class ExportSide:
    """Mixed into :class:`~.store.Store` (its read connection and lock)."""

    _db: Database
    _lock: threading.Lock

    def delete_sessions(self, session_ids: Iterable[str]) -> int:
        """Delete many sessions (e.g. after export) in one transaction; returns how many."""
        with self._lock, self._db.transaction():
            return delete_ids(self._db, list(session_ids))

    def signature(self, session_id: str) -> tuple:
        """What changes when anything is recorded on a session (calls, rewards, close): an
        export reads it before the rows, and deletes only sessions that still have it."""
        with self._lock:
            return _signature(self._db, session_id)

    def delete_unchanged(self, signatures: dict[str, tuple]) -> tuple[int, list[str]]:
        """Delete the sessions whose :meth:`signature` is still the one given, in one
        transaction; the others (a call, reward or close landed since) are kept. Returns
        ``(deleted, kept ids)``."""
        kept: list[str] = []
        gone: list[str] = []
        with self._lock, self._db.transaction():
            for sid, sig in signatures.items():
                (gone if _signature(self._db, sid) == tuple(sig) else kept).append(sid)
            n = delete_ids(self._db, gone)
        return n, kept

    def raw_calls(self, session_id: str) -> list[Row]:
        """The session's call rows as stored (blobs and JSON bytes untouched), for export;
        columns by name (``row["info"]``) or in table order."""
        with self._lock:
            return self._db.named(
                f"SELECT {CALL_COLUMNS} FROM calls WHERE session_id = ? ORDER BY seq",
                (session_id,),
            )

    def bodies_of(self, session_id: str) -> dict[str, tuple[bytes | None, bytes | None]]:
        """Kept bodies of a session's calls, still compressed: call id → (request, response)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT call_id, request, response FROM bodies WHERE session_id = ?", (session_id,)
            ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def mark_exported(self, session_ids: Iterable[str], when: float | None = None) -> None:
        when = when or time.time()
        with self._lock:
            self._db.executemany(
                "UPDATE sessions SET exported = ? WHERE id = ?",
                [(when, sid) for sid in session_ids],
            )

    def vacuum(self) -> None:
        """Give the space of deleted sessions back to the file system (rewrites the file)."""
        with self._lock:
            self._db.vacuum()
