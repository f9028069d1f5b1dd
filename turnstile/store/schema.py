"""The store's tables, and opening a store file: create, migrate, refuse a newer one.

Schema versions: 1 = sessions + calls; 2 adds session status/group/sample/task columns, rewards
and bodies tables (migrated in place, existing columns untouched); 3 adds ``calls.arrays``, the
per-token arrays' blob (``turnstile.token_arrays.pack``; NULL in rows written before); 4 adds
``calls.media`` (a call's images: hash, span, processor, grid) and the content-addressed
``media_blobs``/``media_refs`` tables (``store/blobs.py``).
docs/schema.md is the reference.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from .blobs import tables as media_tables
from .session_rows import session_fields

SCHEMA_VERSION = 4

SCHEMA = (
    """
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
    created REAL NOT NULL,
    arrays BLOB,
    media BLOB
);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls(session_id, seq);
"""
    + """
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
    + media_tables()
)

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

# v2 -> v3: the per-token arrays' blob (older rows keep NULL: their weight versions stay in
# ``info`` and are read from there).
MIGRATE_2_TO_3 = ["ALTER TABLE calls ADD COLUMN arrays BLOB"]
# v3 -> v4: a call's images (older rows keep NULL: no images); the blob tables are created
MIGRATE_3_TO_4 = ["ALTER TABLE calls ADD COLUMN media BLOB"]

# The calls table's columns in table order (rows read with them are read by name).
CALL_COLUMNS = (
    "id, session_id, seq, parent_id, segment_reason, reused_prefix_len, "
    "prompt_delta, completion_ids, completion_logprobs, finish_reason, "
    "stop_token_id, seam, status, error, message, history_hash, prefix_hashes, "
    "info, created, arrays, media"
)

SESSION_COLUMNS = (
    "id, created, metadata, status, closed, termination_reason, group_id, "
    "sample_index, task_id, exported"
)


class SchemaError(RuntimeError):
    """The store file was written by a newer Turnstile (or is not a Turnstile store)."""


def open_schema(db: sqlite3.Connection, path: Path) -> None:
    """Create or migrate the tables of the store at ``path`` (``db`` in autocommit mode)."""
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see v2
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else None
        if version is not None and version > SCHEMA_VERSION:
            raise SchemaError(
                f"{path} has schema version {version}; this Turnstile "
                f"reads up to {SCHEMA_VERSION}. Upgrade Turnstile."
            )
        if version == 1:
            _migrate_1_to_2(db)
        if version in (1, 2):
            for stmt in MIGRATE_2_TO_3:
                db.execute(stmt)
        if version in (1, 2, 3):
            for stmt in MIGRATE_3_TO_4:
                db.execute(stmt)
        for stmt in SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)
        db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        _ensure_capability_column(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """v1 -> v2 in place: the new session columns, filled from v1 metadata."""
    for stmt in MIGRATE_1_TO_2:
        db.execute(stmt)
    # Lift group/sample/task out of v1 metadata, where clients used to put them.
    for sid, meta in db.execute("SELECT id, metadata FROM sessions").fetchall():
        fields = session_fields(orjson.loads(meta), {})
        if any(v is not None for v in fields.values()):
            db.execute(
                "UPDATE sessions SET group_id = ?, sample_index = ?, task_id = ? WHERE id = ?",
                (fields["group_id"], fields["sample_index"], fields["task_id"], sid),
            )


def _ensure_capability_column(db: sqlite3.Connection) -> None:
    # Additive (no version bump): each session's harness capability (the key in its base
    # URL, turnstile/auth.py). Rows without one (older stores) get one on first use.
    cols = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
    if "capability" not in cols:
        db.execute("ALTER TABLE sessions ADD COLUMN capability TEXT")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS sessions_by_capability ON sessions(capability)")
