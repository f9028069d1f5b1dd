"""Durable records: sessions, their calls, rewards and (optionally) raw request/response bodies,
in an SQLite file (WAL mode; the default) or a PostgreSQL database (a fleet of gateways).

A call stores its prompt as a *delta* against its parent (the parent's prompt + completion is
the reused prefix), so a long session costs storage for its new tokens only. Token IDs are
packed int32 and logprobs float32 blobs: 4 bytes each, no JSON parsing to read them back.

The server commits a call before its response reaches the harness, and only then lets later
calls extend it. Durability (``synchronous``): ``full`` (the default) syncs the WAL on every
commit, so an acknowledged call survives a killed process *and* an OS crash or power loss;
``normal`` syncs at checkpoints only (PostgreSQL: ``synchronous_commit = off``): it survives a
killed gateway, but the last commits can be lost if the database's machine itself goes down.

The databases are behind ``database.Database`` (``sqlite``, ``postgres``); the call record and
its blob packing are in ``records``, session dicts and rewards in ``session_rows``; this module
is the ``Store``, written once for both.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import orjson

from ..media import Image
from ..random_ids import new_capability
from .backends import connect
from .blobs import drop_refs, read_image
from .database import SQLITE_FILENAME, Database, is_postgres
from .export_side import ExportSide
from .records import (
    CallRecord,
    call_from_row,
    new_id,
    unpack_body,
)
from .schema import CALL_COLUMNS, SESSION_COLUMNS
from .session_rows import session_fields, session_from_row
from .writer import Writer
from .writes import CallWrite, SessionWrite, call_rows, write_batch


class UnstorableText(ValueError):
    """Text that not every database can keep: PostgreSQL's ``text`` holds no NUL character,
    so neither store takes one in an id, name or reason (the API answers 400)."""

    def __init__(self, field: str):
        self.field = field
        super().__init__(f"Invalid {field!r}: text must not contain NUL characters (\\u0000).")


def _text(field: str, value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise UnstorableText(field)
    return value


def _absent(*keys: str | None) -> bool:
    """A key no store can hold (so a lookup by it finds nothing, on either database)."""
    return any(k is not None and "\x00" in k for k in keys)


SYNCHRONOUS = ("full", "normal")


class Store(ExportSide):
    """The records, on an SQLite file or a PostgreSQL database (``location``: a directory, a
    ``.sqlite3`` file or a ``postgresql://`` URL). Thread-safe: one connection for reads and
    one for call writes, each guarded by a lock (writes are short).

    ``keep_bodies`` decides whether raw request/response bodies handed to :meth:`add_call` are
    kept (zlib-compressed JSON, one row per call) or dropped; token records are always kept.
    """

    FILENAME = SQLITE_FILENAME

    def __init__(
        self,
        location: str | Path,
        keep_bodies: bool = False,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
        record_fields: dict | None = None,
    ):
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self.keep_bodies = keep_bodies
        self.synchronous = synchronous
        self._db: Database = connect(location, synchronous, busy_timeout)
        self.location = self._db.location  # for messages (a URL without its password)
        # the SQLite file (the viewer and the token file sit beside it); None on PostgreSQL
        self.path: Path | None = None if is_postgres(location) else Path(self._db.location)
        self._lock = threading.Lock()
        self._db.open_schema()
        # Calls are written on their own connection (from worker threads): a writer waiting
        # out a lock held by another process never holds up the reads.
        self._wdb: Database = connect(location, synchronous, busy_timeout)
        self._wlock = threading.Lock()
        # told of every committed call with the seconds its write took (server.metrics)
        self.observers: list[Callable[[CallRecord, float], None]] = []
        # told of every committed call with the request body it came from, kept or not
        # (server.canary re-renders the harness's messages)
        self.request_observers: list[Callable[[CallRecord, object], None]] = []
        # added to every call's info (turnstile.app.ray: the gateway replica that recorded it)
        self.record_fields: dict = dict(record_fields or {})
        self._writer = Writer(self)  # its thread starts with the first queued write

    def reader(self) -> Database:
        """A read-only connection of its own (close it after use): the viewer's listing."""
        return self._db.reader()

    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock, self._wlock:
            self._db.close()
            self._wdb.close()

    # sessions

    def create_session(
        self,
        metadata: dict | None = None,
        session_id: str | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
    ) -> str:
        """Create a session (idempotent on ``session_id``); its id. Group/sample/task not
        given here are taken from metadata keys (``group_id``/``group``, ``sample_index``,
        ``task_id``/``task``) so that older clients' sessions are grouped too."""
        w = self.session_write(
            metadata, session_id, group_id=group_id, sample_index=sample_index, task_id=task_id
        )
        (error,) = self.write([w])
        if error is not None:
            raise error
        return w.session_id

    def session_write(
        self,
        metadata: dict | None = None,
        session_id: str | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
    ) -> SessionWrite:
        """What :meth:`create_session` writes (checked here: :class:`UnstorableText`), for a
        writer that groups it with other writes (``gateway.record``)."""
        sid = _text("id", session_id) or new_id("sess_")
        _text("group_id", group_id)
        _text("task_id", task_id)
        meta = metadata or {}
        f = session_fields(
            meta, {"group_id": group_id, "sample_index": sample_index, "task_id": task_id}
        )
        _text("metadata.group_id", f["group_id"])
        _text("metadata.task_id", f["task_id"])
        row = (
            sid,
            time.time(),
            orjson.dumps(meta),
            f["group_id"],
            f["sample_index"],
            f["task_id"],
            new_capability(),
        )
        return SessionWrite(sid, row)

    def capabilities(self, session_ids: Iterable[str]) -> dict[str, str]:
        """Session id → its harness capability (one is minted for a row that has none)."""
        ids = [sid for sid in session_ids if not _absent(sid)]
        out: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                out.update(
                    self._db.execute(
                        "SELECT id, capability FROM sessions WHERE capability IS NOT NULL "
                        f"AND id IN ({','.join('?' * len(chunk))})",
                        chunk,
                    ).fetchall()
                )
            for sid in ids:
                if sid not in out:
                    cap = new_capability()
                    cur = self._db.execute(
                        "UPDATE sessions SET capability = ? WHERE id = ? AND capability IS NULL",
                        (cap, sid),
                    )
                    if cur.rowcount:
                        out[sid] = cap
        return out

    def session_for_capability(self, capability: str) -> str | None:
        """The id of the session a capability belongs to, or None."""
        if _absent(capability):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM sessions WHERE capability = ?", (capability,)
            ).fetchone()
        return row[0] if row else None

    def get_session(self, session_id: str) -> dict | None:
        """The session with its rewards (scalar + named, per session and per call)."""
        if _absent(session_id):
            return None
        with self._lock:
            found = self._db.named(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            )
            if not found:
                return None
            row = found[0]
            n_calls = self._db.execute(
                "SELECT count(*) FROM calls WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
            rewards = self._db.execute(
                "SELECT session_id, call_id, name, value FROM rewards WHERE session_id = ?",
                (session_id,),
            ).fetchall()
        out = session_from_row(row, rewards)
        out["n_calls"] = n_calls
        return out

    def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        after: str | None = None,
        exported: bool | None = None,
    ) -> tuple[list[dict], bool]:
        """Sessions in creation order, filtered; ``after`` is the last id of the previous
        page. Returns ``(sessions, has_more)``."""
        if _absent(group_id, after):
            return [], False
        where, args = [], []
        if group_id is not None:
            where.append("group_id = ?")
            args.append(group_id)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if exported is not None:
            where.append("exported IS NOT NULL" if exported else "exported IS NULL")
        if after is not None:
            where.append("rowid > coalesce((SELECT rowid FROM sessions WHERE id = ?), -1)")
            args.append(after)
        sql = f"SELECT {SESSION_COLUMNS} FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY rowid LIMIT ?"
        with self._lock:
            rows = self._db.named(sql, (*args, limit + 1))
            ids = [r["id"] for r in rows[:limit]]
            rewards = self._rewards_for(ids)
        sessions = [session_from_row(r, rewards.get(r["id"], [])) for r in rows[:limit]]
        return sessions, len(rows) > limit

    def _rewards_for(self, ids: list[str]) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            for r in self._db.execute(
                "SELECT session_id, call_id, name, value FROM rewards WHERE session_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            ):
                out.setdefault(r[0], []).append(r)
        return out

    def close_session(self, session_id: str, termination_reason: str | None = None) -> bool:
        """Mark a rollout finished. Closing again keeps the first close time; a reason given
        later replaces an earlier one. False if there is no such session."""
        if _absent(session_id):
            return False
        _text("termination_reason", termination_reason)
        with self._lock:
            cur = self._db.execute(
                "UPDATE sessions SET status = 'closed', closed = coalesce(closed, ?), "
                "termination_reason = coalesce(?, termination_reason) WHERE id = ?",
                (time.time(), termination_reason, session_id),
            )
        return cur.rowcount > 0

    def set_rewards(
        self, session_id: str, rewards: dict[str, float], call_id: str | None = None
    ) -> None:
        """Upsert named rewards on a session (or on one of its calls)."""
        _text("call_id", call_id)
        for name in rewards:
            _text("rewards", name)
        now = time.time()
        rows = [(session_id, call_id or "", name, float(v), now) for name, v in rewards.items()]
        with self._lock:
            self._db.executemany(
                "INSERT INTO rewards VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, call_id, "
                "name) DO UPDATE SET value = excluded.value, created = excluded.created",
                rows,
            )

    def has_call(self, session_id: str, call_id: str) -> bool:
        if _absent(session_id, call_id):
            return False
        with self._lock:
            return (
                self._db.execute(
                    "SELECT 1 FROM calls WHERE id = ? AND session_id = ?", (call_id, session_id)
                ).fetchone()
                is not None
            )

    def delete_session(self, session_id: str) -> bool:
        """Delete a session with its calls, rewards and bodies, in one transaction."""
        if _absent(session_id):
            return False
        with self._lock, self._db.transaction():
            for table, col in (
                ("calls", "session_id"),
                ("rewards", "session_id"),
                ("bodies", "session_id"),
                ("sessions", "id"),
            ):
                cur = self._db.execute(f"DELETE FROM {table} WHERE {col} = ?", (session_id,))
            gone = cur.rowcount > 0
            drop_refs(self._db, [session_id])  # its images, unless another session has them
        return gone

    # calls

    def session_created(self, session_id: str) -> float | None:
        """The session's creation time: it tells a re-created id from the one a call began in."""
        if _absent(session_id):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT created FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return None if row is None else row[0]

    def session_status(self, session_id: str) -> str | None:
        """``open`` or ``closed`` (None: no such session), as any process left it."""
        if _absent(session_id):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT status FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return None if row is None else row[0]

    def call_count(self, session_id: str) -> int:
        """How many calls the session has recorded (by any process writing this file)."""
        if _absent(session_id):
            return 0
        with self._lock:
            return self._db.execute(
                "SELECT count(*) FROM calls WHERE session_id = ?", (session_id,)
            ).fetchone()[0]

    def add_call(
        self,
        c: CallRecord,
        request_body: object = None,
        response_body: object = None,
        session_created: float | None = None,
    ) -> None:
        """Record a call; with ``keep_bodies`` also its raw request/response bodies, in the
        same transaction (without it the bodies are dropped here).

        With ``session_created`` (the session's creation time when the call began), the
        session must still be that incarnation: a call that outlived a delete of its session
        (by this server or by ``export --delete`` in another process) raises
        :class:`SessionGone` and writes nothing, so a re-created id starts empty."""
        (error,) = self.write([CallWrite(c, request_body, response_body, session_created)])
        if error is not None:
            raise error

    def queue(self, write: CallWrite | SessionWrite) -> asyncio.Future:
        """Hand ``write`` to the store's writer thread (a locked store or a slow sync waits
        there, not on the event loop); the future resolves on the running loop once it is
        committed, grouped with the writes queued beside it (group commit)."""
        return self._writer.submit(write)

    def open_session(
        self,
        metadata: dict,
        session_id: str | None = None,
        *,
        group_id: str | None = None,
        sample_index: int | None = None,
        task_id: str | None = None,
    ) -> tuple[asyncio.Future, str]:
        """A session created (idempotent on its id) through the writer: its future and id."""
        w = self.session_write(
            metadata, session_id, group_id=group_id, sample_index=sample_index, task_id=task_id
        )
        return self.queue(w), w.session_id

    def observe(self, observer: Callable[[CallRecord, float], None]) -> None:
        """``observer`` is told of every committed call with the seconds its write took."""
        self.observers.append(observer)

    def observe_requests(self, observer: Callable[[CallRecord, object], None]) -> None:
        """``observer`` is told of every committed call with its request body (the parsed JSON
        the harness sent), whether or not ``keep_bodies`` stores it."""
        self.request_observers.append(observer)

    def write(self, writes: Sequence[CallWrite | SessionWrite]) -> list[BaseException | None]:
        """Write sessions and calls in one transaction: one commit and one sync for all (a
        group commit; each as :meth:`create_session` / :meth:`add_call`, in order). One's own
        failure (a call's session gone) is its entry in the answer, rolled back to its
        savepoint, and the others are written; a failure of the transaction itself (the lock,
        the disk, the connection) is raised: nothing was written."""
        keep, fields = self.keep_bodies, self.record_fields
        items = [w if isinstance(w, SessionWrite) else call_rows(w, keep, fields) for w in writes]
        began = time.perf_counter()
        with self._wlock:
            errors = write_batch(self._wdb, items)
        took = time.perf_counter() - began
        for w, error in zip(writes, errors, strict=True):
            if error is None and isinstance(w, CallWrite):
                for observe in self.observers:
                    observe(w.record, took)
                for seen in self.request_observers:
                    seen(w.record, w.request_body)
        return errors

    def body(self, call_id: str) -> dict | None:
        """``{"request": ..., "response": ...}`` as kept for a call, or None."""
        if _absent(call_id):
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT request, response FROM bodies WHERE call_id = ?", (call_id,)
            ).fetchone()
        if row is None:
            return None
        return {"request": unpack_body(row[0]), "response": unpack_body(row[1])}

    def drop_bodies(self, session_id: str | None = None) -> int:
        """Delete kept bodies (of one session, or all): they are the bulky part."""
        with self._lock:
            if session_id is None:
                cur = self._db.execute("DELETE FROM bodies")
            else:
                cur = self._db.execute("DELETE FROM bodies WHERE session_id = ?", (session_id,))
        return cur.rowcount

    def image(self, session_id: str, sha256: str) -> Image | None:
        """An image's bytes, only if this session's calls hold it (store/blobs.py)."""
        if _absent(session_id):
            return None
        with self._lock:
            return read_image(self._db, sha256, session_id)

    def calls(self, session_id: str) -> list[CallRecord]:
        if _absent(session_id):
            return []
        with self._lock:
            rows = self._db.named(
                f"SELECT {CALL_COLUMNS} FROM calls WHERE session_id = ? ORDER BY seq",
                (session_id,),
            )
        return [call_from_row(r) for r in rows]
