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

Schema versions: 1 = sessions + calls; 2 adds session status/group/sample/task columns, rewards
and bodies tables (migrated in place, existing columns untouched). docs/schema.md is the
reference.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..auth import new_capability

SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    metadata BLOB NOT NULL,
    status TEXT NOT NULL DEFAULT 'open',
    closed REAL,
    termination_reason TEXT,
    group_id TEXT,
    sample_index INTEGER,
    task_id TEXT,
    exported REAL
);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL,
    parent_id TEXT,
    segment_reason TEXT,
    reused_prefix_len INTEGER NOT NULL,
    prompt_delta BLOB NOT NULL,
    completion_ids BLOB NOT NULL,
    completion_logprobs BLOB NOT NULL,
    finish_reason TEXT,
    stop_token_id INTEGER,
    seam TEXT,
    status TEXT NOT NULL,
    error TEXT,
    message BLOB,
    history_hash BLOB,
    prefix_hashes BLOB,
    info BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls(session_id, seq);
""" + """
CREATE INDEX IF NOT EXISTS sessions_by_group ON sessions(group_id, sample_index);
CREATE TABLE IF NOT EXISTS rewards (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL DEFAULT '',
    name TEXT NOT NULL,
    value REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session_id, call_id, name)
);
CREATE TABLE IF NOT EXISTS bodies (
    call_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    request BLOB,
    response BLOB
);
CREATE INDEX IF NOT EXISTS bodies_by_session ON bodies(session_id);
"""

# v1 -> v2: new session columns (the v1 columns stay as they are) and the new tables.
MIGRATE_1_TO_2 = [
    "ALTER TABLE sessions ADD COLUMN status TEXT NOT NULL DEFAULT 'open'",
    "ALTER TABLE sessions ADD COLUMN closed REAL",
    "ALTER TABLE sessions ADD COLUMN termination_reason TEXT",
    "ALTER TABLE sessions ADD COLUMN group_id TEXT",
    "ALTER TABLE sessions ADD COLUMN sample_index INTEGER",
    "ALTER TABLE sessions ADD COLUMN task_id TEXT",
    "ALTER TABLE sessions ADD COLUMN exported REAL",
]

# The calls table's columns in table order (rows read with them are read by name).
CALL_COLUMNS = ("id, session_id, seq, parent_id, segment_reason, reused_prefix_len, "
                "prompt_delta, completion_ids, completion_logprobs, finish_reason, "
                "stop_token_id, seam, status, error, message, history_hash, prefix_hashes, "
                "info, created")

SESSION_COLUMNS = ("id, created, metadata, status, closed, termination_reason, group_id, "
                   "sample_index, task_id, exported")

# Metadata keys that name the first-class session fields when they are not given directly
# (v1 clients put them in metadata).
FIELD_ALIASES = {"group_id": ("group_id", "group"), "sample_index": ("sample_index",),
                 "task_id": ("task_id", "task")}


class SchemaError(RuntimeError):
    """The store file was written by a newer Turnstile (or is not a Turnstile store)."""


class SessionGone(LookupError):
    """The session a call belongs to was deleted (or deleted and re-created) while it ran."""


SYNCHRONOUS = ("full", "normal")
INT32_MAX = 2**31 - 1  # sample_index is an int32 column in exports


def pack_ids(ids: Any) -> bytes:
    return ids.tobytes() if isinstance(ids, array) else array("i", ids).tobytes()


def unpack_ids(blob: bytes) -> array:
    out = array("i")
    out.frombytes(blob)
    return out


def pack_floats(values: Any) -> bytes:
    return array("f", values).tobytes()


def unpack_floats(blob: bytes) -> array:
    out = array("f")
    out.frombytes(blob)
    return out


@dataclass
class CallRecord:
    """One engine call, as recorded. ``info`` holds the rest: sampling params as sent,
    timings, engine request id, usage, template/tokenizer fingerprint, segment detail."""

    id: str
    session_id: str
    seq: int
    parent_id: str | None
    segment_reason: str | None
    reused_prefix_len: int
    prompt_delta: array
    completion_ids: array
    completion_logprobs: array
    finish_reason: str | None
    stop_token_id: int | None
    seam: str | None
    status: str
    error: str | None = None
    message: dict | None = None
    history_hash: bytes | None = None
    prefix_hashes: list[bytes] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "seq": self.seq,
            "parent_id": self.parent_id,
            "segment_reason": self.segment_reason,
            "reused_prefix_len": self.reused_prefix_len,
            "prompt_delta_ids": self.prompt_delta.tolist(),
            "completion_ids": self.completion_ids.tolist(),
            "completion_logprobs": self.completion_logprobs.tolist(),
            "finish_reason": self.finish_reason,
            "stop_token_id": self.stop_token_id,
            "seam": self.seam,
            "status": self.status,
            "error": self.error,
            "message": self.message,
            "created": self.created,
            **self.info,
        }


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class Store:
    """SQLite-backed records. Thread-safe; one connection guarded by a lock (writes are short).

    ``keep_bodies`` decides whether raw request/response bodies handed to :meth:`add_call` are
    kept (zlib-compressed JSON, one row per call) or dropped; token records are always kept.
    """

    FILENAME = "turnstile.sqlite3"

    def __init__(self, data_dir: str | Path, keep_bodies: bool = False,
                 synchronous: str = "full", busy_timeout: float = 5.0):
        path = Path(data_dir)
        self.path = path if path.suffix in (".sqlite3", ".sqlite", ".db") else path / self.FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keep_bodies = keep_bodies
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self.synchronous = synchronous
        self._db = self._connect(busy_timeout)
        self._lock = threading.Lock()
        self._open_schema()
        # Calls are written on their own connection (from worker threads): a writer waiting
        # out a lock held by another process never holds up the reads.
        self._wdb = self._connect(busy_timeout)
        self._wlock = threading.Lock()

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                             timeout=busy_timeout)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        return db

    def _open_schema(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see v2
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else None
            if version is not None and version > SCHEMA_VERSION:
                raise SchemaError(f"{self.path} has schema version {version}; this Turnstile "
                                  f"reads up to {SCHEMA_VERSION}. Upgrade Turnstile.")
            if version == 1:
                self._migrate_1_to_2()
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                       (str(SCHEMA_VERSION),))
            self._ensure_capability_column()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _migrate_1_to_2(self) -> None:
        db = self._db
        for stmt in MIGRATE_1_TO_2:
            db.execute(stmt)
        # Lift group/sample/task out of v1 metadata, where clients used to put them.
        for sid, meta in db.execute("SELECT id, metadata FROM sessions").fetchall():
            fields = session_fields(orjson.loads(meta), {})
            if any(v is not None for v in fields.values()):
                db.execute("UPDATE sessions SET group_id = ?, sample_index = ?, task_id = ? "
                           "WHERE id = ?", (fields["group_id"], fields["sample_index"],
                                            fields["task_id"], sid))

    def _ensure_capability_column(self) -> None:
        # Additive (no version bump): each session's harness capability (the key in its base
        # URL, turnstile/auth.py). Rows without one (older stores) get one on first use.
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(sessions)")}
        if "capability" not in cols:
            self._db.execute("ALTER TABLE sessions ADD COLUMN capability TEXT")
        self._db.execute("CREATE UNIQUE INDEX IF NOT EXISTS sessions_by_capability "
                         "ON sessions(capability)")

    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock, self._wlock:
            self._db.close()
            self._wdb.close()

    # sessions

    def create_session(self, metadata: dict | None = None, session_id: str | None = None, *,
                       group_id: str | None = None, sample_index: int | None = None,
                       task_id: str | None = None) -> str:
        """Create a session (idempotent on ``session_id``). Group/sample/task not given here
        are taken from metadata keys (``group_id``/``group``, ``sample_index``,
        ``task_id``/``task``) so that older clients' sessions are grouped too."""
        sid = session_id or new_id("sess_")
        meta = metadata or {}
        f = session_fields(meta, {"group_id": group_id, "sample_index": sample_index,
                                  "task_id": task_id})
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO sessions (id, created, metadata, group_id, sample_index, "
                "task_id, capability) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, time.time(), orjson.dumps(meta), f["group_id"], f["sample_index"],
                 f["task_id"], new_capability()))
        return sid

    def capabilities(self, session_ids: Iterable[str]) -> dict[str, str]:
        """Session id → its harness capability (one is minted for a row that has none)."""
        ids = list(session_ids)
        out: dict[str, str] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                out.update(self._db.execute(
                    "SELECT id, capability FROM sessions WHERE capability IS NOT NULL AND id IN "
                    f"({','.join('?' * len(chunk))})", chunk).fetchall())
            for sid in ids:
                if sid not in out:
                    cap = new_capability()
                    cur = self._db.execute("UPDATE sessions SET capability = ? WHERE id = ? "
                                           "AND capability IS NULL", (cap, sid))
                    if cur.rowcount:
                        out[sid] = cap
        return out

    def session_for_capability(self, capability: str) -> str | None:
        """The id of the session a capability belongs to, or None."""
        with self._lock:
            row = self._db.execute("SELECT id FROM sessions WHERE capability = ?",
                                   (capability,)).fetchone()
        return row[0] if row else None

    def get_session(self, session_id: str) -> dict | None:
        """The session with its rewards (scalar + named, per session and per call)."""
        with self._lock:
            row = self._db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?",
                                   (session_id,)).fetchone()
            if row is None:
                return None
            n_calls = self._db.execute("SELECT count(*) FROM calls WHERE session_id = ?",
                                       (session_id,)).fetchone()[0]
            rewards = self._db.execute(
                "SELECT session_id, call_id, name, value FROM rewards WHERE session_id = ?",
                (session_id,)).fetchall()
        out = _session_from_row(row, rewards)
        out["n_calls"] = n_calls
        return out

    def list_sessions(self, group_id: str | None = None, status: str | None = None,
                      limit: int = 100, after: str | None = None,
                      exported: bool | None = None) -> tuple[list[dict], bool]:
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
            rows = self._db.execute(sql, (*args, limit + 1)).fetchall()
            ids = [r[0] for r in rows[:limit]]
            rewards = self._rewards_for(ids)
        sessions = [_session_from_row(r, rewards.get(r[0], [])) for r in rows[:limit]]
        return sessions, len(rows) > limit

    def _rewards_for(self, ids: list[str]) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            for r in self._db.execute(
                    "SELECT session_id, call_id, name, value FROM rewards WHERE session_id IN "
                    f"({','.join('?' * len(chunk))})", chunk):
                out.setdefault(r[0], []).append(r)
        return out

    def close_session(self, session_id: str, termination_reason: str | None = None) -> bool:
        """Mark a rollout finished. Closing again keeps the first close time; a reason given
        later replaces an earlier one. False if there is no such session."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE sessions SET status = 'closed', closed = coalesce(closed, ?), "
                "termination_reason = coalesce(?, termination_reason) WHERE id = ?",
                (time.time(), termination_reason, session_id))
        return cur.rowcount > 0

    def set_rewards(self, session_id: str, rewards: dict[str, float],
                    call_id: str | None = None) -> None:
        """Upsert named rewards on a session (or on one of its calls)."""
        now = time.time()
        rows = [(session_id, call_id or "", name, float(v), now) for name, v in rewards.items()]
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO rewards VALUES (?, ?, ?, ?, ?)", rows)

    def has_call(self, session_id: str, call_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM calls WHERE id = ? AND session_id = ?",
                                    (call_id, session_id)).fetchone() is not None

    def delete_session(self, session_id: str) -> bool:
        """Delete a session with its calls, rewards and bodies, in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for table, col in (("calls", "session_id"), ("rewards", "session_id"),
                                   ("bodies", "session_id"), ("sessions", "id")):
                    cur = self._db.execute(f"DELETE FROM {table} WHERE {col} = ?",
                                           (session_id,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cur.rowcount > 0

    def delete_sessions(self, session_ids: Iterable[str]) -> int:
        """Delete many sessions (e.g. after export) in one transaction; returns how many."""
        ids = list(session_ids)
        n = 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for i in range(0, len(ids), 500):
                    chunk = ids[i:i + 500]
                    marks = ",".join("?" * len(chunk))
                    for table in ("calls", "rewards", "bodies"):
                        self._db.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})",
                                         chunk)
                    n += self._db.execute(f"DELETE FROM sessions WHERE id IN ({marks})",
                                          chunk).rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return n

    _SIGNATURE = ("SELECT (SELECT count(*) FROM calls WHERE session_id = :s), "
                  "(SELECT max(created) FROM calls WHERE session_id = :s), "
                  "(SELECT count(*) FROM rewards WHERE session_id = :s), "
                  "(SELECT max(created) FROM rewards WHERE session_id = :s), "
                  "(SELECT status || ':' || coalesce(termination_reason, '') FROM sessions "
                  "WHERE id = :s)")

    def signature(self, session_id: str) -> tuple:
        """What changes when anything is recorded on a session (calls, rewards, close): an
        export reads it before the rows, and deletes only sessions that still have it."""
        with self._lock:
            return tuple(self._db.execute(self._SIGNATURE, {"s": session_id}).fetchone())

    def delete_unchanged(self, signatures: dict[str, tuple]) -> tuple[int, list[str]]:
        """Delete the sessions whose :meth:`signature` is still the one given, in one
        transaction; the others (a call, reward or close landed since) are kept. Returns
        ``(deleted, kept ids)``."""
        kept: list[str] = []
        gone: list[str] = []
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for sid, sig in signatures.items():
                    now = tuple(db.execute(self._SIGNATURE, {"s": sid}).fetchone())
                    (gone if now == tuple(sig) else kept).append(sid)
                n = 0
                for i in range(0, len(gone), 500):
                    chunk = gone[i:i + 500]
                    marks = ",".join("?" * len(chunk))
                    for table in ("calls", "rewards", "bodies"):
                        db.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})", chunk)
                    n += db.execute(f"DELETE FROM sessions WHERE id IN ({marks})",
                                    chunk).rowcount
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return n, kept

    def raw_calls(self, session_id: str) -> list[sqlite3.Row]:
        """The session's call rows as stored (blobs and JSON bytes untouched), for export;
        columns by name (``row["info"]``) or in table order."""
        with self._lock:
            cur = self._db.cursor()
            cur.row_factory = sqlite3.Row
            return cur.execute(f"SELECT {CALL_COLUMNS} FROM calls WHERE session_id = ? "
                               "ORDER BY seq", (session_id,)).fetchall()

    def bodies_of(self, session_id: str) -> dict[str, tuple[bytes | None, bytes | None]]:
        """Kept bodies of a session's calls, still compressed: call id → (request, response)."""
        with self._lock:
            rows = self._db.execute("SELECT call_id, request, response FROM bodies "
                                    "WHERE session_id = ?", (session_id,)).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def mark_exported(self, session_ids: Iterable[str], when: float | None = None) -> None:
        when = when or time.time()
        with self._lock:
            self._db.executemany("UPDATE sessions SET exported = ? WHERE id = ?",
                                 [(when, sid) for sid in session_ids])

    def vacuum(self) -> None:
        """Give the space of deleted sessions back to the file system (rewrites the file)."""
        with self._lock:
            self._db.execute("VACUUM")

    # calls

    def session_created(self, session_id: str) -> float | None:
        """The session's creation time: it tells a re-created id from the one a call began in."""
        with self._lock:
            row = self._db.execute("SELECT created FROM sessions WHERE id = ?",
                                   (session_id,)).fetchone()
        return None if row is None else row[0]

    def add_call(self, c: CallRecord, request_body: object = None,
                 response_body: object = None, session_created: float | None = None) -> None:
        """Record a call; with ``keep_bodies`` also its raw request/response bodies, in the
        same transaction (without it the bodies are dropped here).

        With ``session_created`` (the session's creation time when the call began), the
        session must still be that incarnation: a call that outlived a delete of its session
        (by this server or by ``export --delete`` in another process) raises
        :class:`SessionGone` and writes nothing, so a re-created id starts empty."""
        row = (
            c.id, c.session_id, c.seq, c.parent_id, c.segment_reason, c.reused_prefix_len,
            pack_ids(c.prompt_delta), pack_ids(c.completion_ids),
            pack_floats(c.completion_logprobs), c.finish_reason, c.stop_token_id, c.seam,
            c.status, c.error, orjson.dumps(c.message) if c.message is not None else None,
            c.history_hash, b"".join(c.prefix_hashes), orjson.dumps(c.info), c.created,
        )
        keep = self.keep_bodies and (request_body is not None or response_body is not None)
        bodies = (c.id, c.session_id, _pack_body(request_body),
                  _pack_body(response_body)) if keep else None
        with self._wlock:
            db = self._wdb
            db.execute("BEGIN IMMEDIATE")
            try:
                if session_created is not None:
                    row_s = db.execute("SELECT created FROM sessions WHERE id = ?",
                                       (c.session_id,)).fetchone()
                    if row_s is None or row_s[0] != session_created:
                        raise SessionGone(c.session_id)
                db.execute(f"INSERT INTO calls VALUES ({','.join('?' * len(row))})", row)
                if bodies is not None:
                    db.execute("INSERT OR REPLACE INTO bodies VALUES (?, ?, ?, ?)", bodies)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def body(self, call_id: str) -> dict | None:
        """``{"request": ..., "response": ...}`` as kept for a call, or None."""
        with self._lock:
            row = self._db.execute("SELECT request, response FROM bodies WHERE call_id = ?",
                                   (call_id,)).fetchone()
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
            rows = self._db.execute(
                "SELECT * FROM calls WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        return [call_from_row(r) for r in rows]


def session_fields(metadata: dict, given: dict) -> dict:
    """group_id / sample_index / task_id: the explicit value, else the metadata alias."""
    out = {}
    for name, aliases in FIELD_ALIASES.items():
        v = given.get(name)
        if v is None:
            v = next((metadata[a] for a in aliases if metadata.get(a) is not None), None)
            if name == "sample_index":
                v = v if isinstance(v, int) and not isinstance(v, bool) and \
                    0 <= v <= INT32_MAX else None
            elif v is not None and not isinstance(v, str):
                v = str(v)
        out[name] = v
    return out


def scalar_reward(named: dict[str, float]) -> float | None:
    """The one number a trainer uses: the component named ``reward`` if posted, else the sum
    of the named components, else None (no reward yet)."""
    if not named:
        return None
    if "reward" in named:
        return named["reward"]
    return float(sum(named.values()))


def _session_from_row(r: tuple, rewards: list[tuple]) -> dict:
    named: dict[str, float] = {}
    per_call: dict[str, dict[str, float]] = {}
    for _sid, call_id, name, value in rewards:
        if call_id:
            per_call.setdefault(call_id, {})[name] = value
        else:
            named[name] = value
    return {
        "id": r[0], "created": r[1], "metadata": orjson.loads(r[2]), "status": r[3],
        "closed": r[4], "termination_reason": r[5], "group_id": r[6], "sample_index": r[7],
        "task_id": r[8], "exported": r[9], "reward": scalar_reward(named), "rewards": named,
        "call_rewards": {cid: {"reward": scalar_reward(v), "rewards": v}
                         for cid, v in per_call.items()},
    }


def _pack_body(body: object) -> bytes | None:
    if body is None:
        return None
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return zlib.compress(raw, 1)


def unpack_body(blob: bytes | None) -> object:
    return None if blob is None else orjson.loads(zlib.decompress(blob))


def call_from_row(r: tuple) -> CallRecord:
    hashes = r[16] or b""
    return CallRecord(
        id=r[0], session_id=r[1], seq=r[2], parent_id=r[3], segment_reason=r[4],
        reused_prefix_len=r[5], prompt_delta=unpack_ids(r[6]), completion_ids=unpack_ids(r[7]),
        completion_logprobs=unpack_floats(r[8]), finish_reason=r[9], stop_token_id=r[10],
        seam=r[11], status=r[12], error=r[13],
        message=orjson.loads(r[14]) if r[14] is not None else None,
        history_hash=r[15], prefix_hashes=[hashes[i:i + 8] for i in range(0, len(hashes), 8)],
        info=orjson.loads(r[17]), created=r[18],
    )
