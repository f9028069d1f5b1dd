"""Durable records in one SQLite file (WAL mode): sessions, their calls, rewards and (optionally)
raw request/response bodies.

A call stores its prompt as a *delta* against its parent (the parent's prompt + completion is
the reused prefix), so a long session costs storage for its new tokens only. Token IDs are
packed int32 and logprobs float32 blobs: 4 bytes each, no JSON parsing to read them back.

The server commits a call before its response reaches the harness, and only then lets later
calls extend it. Durability (``synchronous``): ``full`` (the default) syncs the WAL on every
commit, so an acknowledged call survives a killed process *and* an OS crash or power loss;
``normal`` syncs at checkpoints only: it survives a killed process (SIGKILL), but the last
commits can be lost if the machine itself goes down.

The tables and their migrations are in ``schema``, the call record and its blob packing in
``records``, session dicts and rewards in ``session_rows``; this module is the ``Store``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from ..auth import new_capability
from .export_side import ExportSide
from .records import (
    CallRecord,
    call_from_row,
    new_id,
    pack_body,
    pack_floats,
    pack_ids,
    unpack_body,
)
from .schema import (
    CALL_COLUMNS,
    SESSION_COLUMNS,
    open_schema,
)
from .session_rows import session_fields, session_from_row


class SessionGone(LookupError):
    """The session a call belongs to was deleted (or deleted and re-created) while it ran."""


SYNCHRONOUS = ("full", "normal")


class Store(ExportSide):
    """SQLite-backed records. Thread-safe; one connection guarded by a lock (writes are short).

    ``keep_bodies`` decides whether raw request/response bodies handed to :meth:`add_call` are
    kept (zlib-compressed JSON, one row per call) or dropped; token records are always kept.
    """

    FILENAME = "turnstile.sqlite3"

    def __init__(
        self,
        data_dir: str | Path,
        keep_bodies: bool = False,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
    ):
        path = Path(data_dir)
        self.path = path if path.suffix in (".sqlite3", ".sqlite", ".db") else path / self.FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keep_bodies = keep_bodies
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self.synchronous = synchronous
        self._db = self._connect(busy_timeout)
        self._lock = threading.Lock()
        open_schema(self._db, self.path)
        # Calls are written on their own connection (from worker threads): a writer waiting
        # out a lock held by another process never holds up the reads.
        self._wdb = self._connect(busy_timeout)
        self._wlock = threading.Lock()
        # told of every committed call with the seconds its write took (server.metrics)
        self.observers: list[Callable[[CallRecord, float], None]] = []
        # added to every call's info (turnstile.ray: the gateway replica that recorded it)
        self.record_fields: dict = {}

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        return db

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
        """Create a session (idempotent on ``session_id``). Group/sample/task not given here
        are taken from metadata keys (``group_id``/``group``, ``sample_index``,
        ``task_id``/``task``) so that older clients' sessions are grouped too."""
        sid = session_id or new_id("sess_")
        meta = metadata or {}
        f = session_fields(
            meta, {"group_id": group_id, "sample_index": sample_index, "task_id": task_id}
        )
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO sessions (id, created, metadata, group_id, sample_index, "
                "task_id, capability) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    time.time(),
                    orjson.dumps(meta),
                    f["group_id"],
                    f["sample_index"],
                    f["task_id"],
                    new_capability(),
                ),
            )
        return sid

    def capabilities(self, session_ids: Iterable[str]) -> dict[str, str]:
        """Session id → its harness capability (one is minted for a row that has none)."""
        ids = list(session_ids)
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
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM sessions WHERE capability = ?", (capability,)
            ).fetchone()
        return row[0] if row else None

    def get_session(self, session_id: str) -> dict | None:
        """The session with its rewards (scalar + named, per session and per call)."""
        with self._lock:
            row = (
                self._named()
                .execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
                .fetchone()
            )
            if row is None:
                return None
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
            rows = self._named().execute(sql, (*args, limit + 1)).fetchall()
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
        now = time.time()
        rows = [(session_id, call_id or "", name, float(v), now) for name, v in rewards.items()]
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO rewards VALUES (?, ?, ?, ?, ?)", rows)

    def has_call(self, session_id: str, call_id: str) -> bool:
        with self._lock:
            return (
                self._db.execute(
                    "SELECT 1 FROM calls WHERE id = ? AND session_id = ?", (call_id, session_id)
                ).fetchone()
                is not None
            )

    def delete_session(self, session_id: str) -> bool:
        """Delete a session with its calls, rewards and bodies, in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for table, col in (
                    ("calls", "session_id"),
                    ("rewards", "session_id"),
                    ("bodies", "session_id"),
                    ("sessions", "id"),
                ):
                    cur = self._db.execute(f"DELETE FROM {table} WHERE {col} = ?", (session_id,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cur.rowcount > 0

    # calls

    def session_created(self, session_id: str) -> float | None:
        """The session's creation time: it tells a re-created id from the one a call began in."""
        with self._lock:
            row = self._db.execute(
                "SELECT created FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return None if row is None else row[0]

    def session_status(self, session_id: str) -> str | None:
        """``open`` or ``closed`` (None: no such session), as any process left it."""
        with self._lock:
            row = self._db.execute(
                "SELECT status FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return None if row is None else row[0]

    def call_count(self, session_id: str) -> int:
        """How many calls the session has recorded (by any process writing this file)."""
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
        if self.record_fields:
            c.info.update(self.record_fields)
        row = (
            c.id,
            c.session_id,
            c.seq,
            c.parent_id,
            c.segment_reason,
            c.reused_prefix_len,
            pack_ids(c.prompt_delta),
            pack_ids(c.completion_ids),
            pack_floats(c.completion_logprobs),
            c.finish_reason,
            c.stop_token_id,
            c.seam,
            c.status,
            c.error,
            orjson.dumps(c.message) if c.message is not None else None,
            c.history_hash,
            b"".join(c.prefix_hashes),
            orjson.dumps(c.info),
            c.created,
        )
        keep = self.keep_bodies and (request_body is not None or response_body is not None)
        bodies = (
            (c.id, c.session_id, pack_body(request_body), pack_body(response_body))
            if keep
            else None
        )
        began = time.perf_counter()
        with self._wlock:
            db = self._wdb
            db.execute("BEGIN IMMEDIATE")
            try:
                if session_created is not None:
                    row_s = db.execute(
                        "SELECT created FROM sessions WHERE id = ?", (c.session_id,)
                    ).fetchone()
                    if row_s is None or row_s[0] != session_created:
                        raise SessionGone(c.session_id)
                marks = ",".join("?" * len(row))
                db.execute(f"INSERT INTO calls ({CALL_COLUMNS}) VALUES ({marks})", row)
                if bodies is not None:
                    db.execute("INSERT OR REPLACE INTO bodies VALUES (?, ?, ?, ?)", bodies)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        for observe in self.observers:
            observe(c, time.perf_counter() - began)

    def body(self, call_id: str) -> dict | None:
        """``{"request": ..., "response": ...}`` as kept for a call, or None."""
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

    def calls(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            rows = (
                self._named()
                .execute(
                    f"SELECT {CALL_COLUMNS} FROM calls WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                )
                .fetchall()
            )
        return [call_from_row(r) for r in rows]
