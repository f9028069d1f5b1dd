"""What the gateway writes, and how it reaches the database: calls (with their rows) and
sessions created on first use, a batch of them in one transaction (a group commit: one
commit, one sync for all), each in a savepoint of its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .blobs import write_images
from .database import Database
from .records import CallRecord, call_row, pack_body
from .schema import CALL_COLUMNS


class SessionGone(LookupError):
    """The session a call belongs to was deleted (or deleted and re-created) while it ran."""


@dataclass(frozen=True, slots=True)
class CallWrite:
    """One call for :meth:`Store.write`, with what :meth:`Store.add_call` takes."""

    record: CallRecord
    request_body: object = None
    response_body: object = None
    session_created: float | None = None


_MARKS = ", ".join("?" for _ in CALL_COLUMNS.split(","))
_INSERT_CALL = f"INSERT INTO calls ({CALL_COLUMNS}) VALUES ({_MARKS})"
_INSERT_BODIES = (
    "INSERT INTO bodies VALUES (?, ?, ?, ?) ON CONFLICT (call_id) DO UPDATE SET "
    "session_id = excluded.session_id, request = excluded.request, response = excluded.response"
)

_INSERT_SESSION = (
    "INSERT INTO sessions (id, created, metadata, group_id, sample_index, task_id, "
    "capability) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)


@dataclass(frozen=True, slots=True)
class SessionWrite:
    """A session's row (``Store.session_write`` builds it): created if its id is new."""

    session_id: str
    row: tuple


CallRows = tuple[str, tuple, tuple | None, float | None, tuple]


def call_rows(w: CallWrite, keep_bodies: bool, record_fields: dict) -> CallRows:
    """A call's session, its ``calls`` row, its ``bodies`` row (kept or not) and the session
    incarnation it must find."""
    c = w.record
    if record_fields:
        c.info.update(record_fields)
    bodies = None
    if keep_bodies and (w.request_body is not None or w.response_body is not None):
        bodies = (c.id, c.session_id, pack_body(w.request_body), pack_body(w.response_body))
    images = tuple(c.images.values())  # () for text: nothing more is written
    return c.session_id, call_row(c), bodies, w.session_created, images


def write_batch(
    db: Database, items: Sequence[CallRows | SessionWrite]
) -> list[BaseException | None]:
    """Write ``items`` (in order) in one transaction, each in a savepoint: one's failure (a
    call's session gone, its id taken) rolls back to it and is its entry in the answer; the
    others are written. A failure of the transaction itself (the lock, the disk, the
    connection) is raised: then nothing was written."""
    errors: list[BaseException | None] = [None] * len(items)
    with db.transaction():
        for i, item in enumerate(items):
            db.execute("SAVEPOINT item")
            try:
                if isinstance(item, SessionWrite):
                    db.execute(_INSERT_SESSION, item.row)
                else:
                    _write_call(db, *item)
            except Exception as exc:  # noqa: BLE001 - this item's answer
                db.execute("ROLLBACK TO SAVEPOINT item")
                errors[i] = exc
            db.execute("RELEASE SAVEPOINT item")
    return errors


def _write_call(
    db: Database,
    session_id: str,
    row: tuple,
    bodies: tuple | None,
    created: float | None,
    images: tuple = (),
) -> None:
    if created is not None:
        got = db.execute(
            "SELECT created FROM sessions WHERE id = ?" + db.facts.share_lock, (session_id,)
        ).fetchone()
        if got is None or got[0] != created:
            raise SessionGone(session_id)
    db.execute(_INSERT_CALL, row)
    if images:
        write_images(db, session_id, images)
    if bodies is not None:
        db.execute(_INSERT_BODIES, bodies)
