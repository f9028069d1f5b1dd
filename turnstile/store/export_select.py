"""Which sessions an export covers, and where each partition's files go."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from .store import Store


def safe_dir_name(name: str) -> str:
    """A partition value as a directory name: readable, no separators, reversible enough;
    a long one is cut and ends in a hash of the whole (file names hold 255 bytes)."""
    out = re.sub(r"[^A-Za-z0-9._-]", lambda m: f"%{ord(m.group()):02X}", name) or "_"
    if len(out) > 120:
        out = out[:96] + "~" + hashlib.sha256(name.encode()).hexdigest()[:20]
    return out


def default_batch_name() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def select_sessions(
    store: Store,
    session_ids: Iterable[str] | None = None,
    group_ids: Iterable[str] | None = None,
    status: str | None = None,
    unexported_only: bool = False,
) -> list[dict]:
    """The sessions an export covers, in creation order."""
    if session_ids is not None:
        out = []
        for sid in session_ids:
            s = store.get_session(sid)
            if s is None:
                raise KeyError(f"no session {sid!r} in {store.location}")
            out.append(s)
        return out
    groups = list(group_ids) if group_ids is not None else [None]
    out = []
    for g in groups:
        after = None
        while True:
            page, more = store.list_sessions(
                g, status, limit=1000, after=after, exported=False if unexported_only else None
            )
            out += page
            if not more:
                break
            after = page[-1]["id"]
    return out


def partition_dir(
    out: Path, table: str, partition: str, batch: str, group: str | None
) -> tuple[Path, str]:
    """``(directory, file name prefix)`` of one table's files for a batch (and group)."""
    if partition == "batch":
        return out / table / f"batch-{batch}", "part-"
    if partition == "group":
        name = "_none" if group is None else safe_dir_name(str(group))
        return out / table / f"group-{name}", f"part-{batch}-"
    return out / table, f"part-{batch}-"
