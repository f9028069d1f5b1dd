"""Durable records in one SQLite file (WAL mode): sessions and their calls.

A call stores its prompt as a *delta* against its parent (the parent's prompt + completion is
the reused prefix), so a long session costs storage for its new tokens only. Token IDs are
packed int32 and logprobs float32 blobs: 4 bytes each, no JSON parsing to read them back.

WAL with ``synchronous=NORMAL`` survives a killed process (SIGKILL) after each commit; the
server commits a call before its response reaches the harness.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    metadata BLOB NOT NULL
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
"""


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
    """SQLite-backed records. Thread-safe; one connection guarded by a lock (writes are short)."""

    def __init__(self, data_dir: str | Path):
        self.path = Path(data_dir) / "turnstile.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # sessions

    def create_session(self, metadata: dict | None = None, session_id: str | None = None) -> str:
        sid = session_id or new_id("sess_")
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO sessions VALUES (?, ?, ?)",
                             (sid, time.time(), orjson.dumps(metadata or {})))
        return sid

    def get_session(self, session_id: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT id, created, metadata FROM sessions WHERE id = ?",
                                   (session_id,)).fetchone()
        if row is None:
            return None
        return {"id": row[0], "created": row[1], "metadata": orjson.loads(row[2])}

    # calls

    def add_call(self, c: CallRecord) -> None:
        row = (
            c.id, c.session_id, c.seq, c.parent_id, c.segment_reason, c.reused_prefix_len,
            pack_ids(c.prompt_delta), pack_ids(c.completion_ids),
            pack_floats(c.completion_logprobs), c.finish_reason, c.stop_token_id, c.seam,
            c.status, c.error, orjson.dumps(c.message) if c.message is not None else None,
            c.history_hash, b"".join(c.prefix_hashes), orjson.dumps(c.info), c.created,
        )
        with self._lock:
            self._db.execute(f"INSERT INTO calls VALUES ({','.join('?' * len(row))})", row)

    def calls(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM calls WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        return [_call_from_row(r) for r in rows]


def _call_from_row(r: tuple) -> CallRecord:
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
