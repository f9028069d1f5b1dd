"""Export sessions from the SQLite store to Parquet (or JSONL) for trainers.

Reads the store file directly, so it works while the server is down (and, thanks to WAL,
while it is up). Three tables, each in its own directory, with the columns of docs/schema.md:

- ``trajectories/``: one row per training sample (``merged`` or ``per_call``):
  ``token_ids list<int32>``, ``loss_mask list<int8>``, ``logprobs list<float32>``,
  ``versions list<int64>`` (null where not sampled), turn boundaries, segment reason, group id,
  sample index, rewards;
- ``sessions/``: one row per rollout (status, group/sample/task ids, rewards, metadata);
- ``calls/``: one row per engine call exactly as stored (prompt as a delta against the parent),
  which is the lossless archive: the store can be rebuilt from it.

Files are partitioned so that a trainer can stream one step's data: by export batch
(``<table>/batch-<name>/part-00000.parquet``; name the batch after the step), by group
(``<table>/group-<id>/part-<batch>-00000.parquet``) or not at all. Directory names are not
``key=value``, so every reader sees the same columns: the partition key is a column in the
file. Files appear atomically (written as ``.tmp`` and renamed, so a reader globbing
``*.parquet`` never sees half a file), and all of a batch's files are renamed into place only
once every one of them is complete: a failed export leaves no files behind. A session that
cannot be exported (a record written by an older version with a value the columns cannot
hold) is skipped and reported in ``skipped``, not fatal; it is neither marked exported nor
deleted. With ``delete``, a session is deleted only if nothing was recorded on it (call,
reward, close) since the export read it; the others are kept and reported. Parquet uses zstd;
any of pyarrow, pandas, polars and ``datasets`` reads it without custom code.

This module runs an export; the pieces live beside it: ``export_schema`` (tables, Arrow
schemas), ``export_select`` (which sessions, which directories), ``export_rows`` (rows from
records), ``export_columns`` and ``export_sinks`` (buffers and files), ``export_read`` (reading
back) and ``export_cli`` (``turnstile export``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson

from .export_read import read_calls
from .export_rows import call_columns, call_records, session_row, trajectory_row
from .export_schema import (
    EXPORT_SCHEMA_VERSION,
    FORMATS,
    PARTITIONS,
    TABLES,
    ExportResult,
    arrow_schemas,
)
from .export_select import default_batch_name, partition_dir, select_sessions
from .export_sinks import TableWriter
from .held import HoldOptions
from .records import INT32_MAX
from .store import Store
from .trajectories import MODES, stitch

_TableWriter = TableWriter  # the name tests patch
__all__ = [
    "EXPORT_SCHEMA_VERSION",
    "FORMATS",
    "PARTITIONS",
    "TABLES",
    "ExportResult",
    "arrow_schemas",
    "call_columns",
    "default_batch_name",
    "export",
    "read_calls",
    "select_sessions",
    "session_row",
    "trajectory_row",
]


def export(
    data: str | Path,
    out: str | Path,
    *,
    fmt: str = "parquet",
    tables: Iterable[str] = TABLES,
    mode: str = "merged",
    partition: str = "batch",
    batch: str | None = None,
    session_ids: Iterable[str] | None = None,
    group_ids: Iterable[str] | None = None,
    status: str | None = None,
    unexported_only: bool = False,
    mark_exported: bool = True,
    delete: bool = False,
    include_bodies: bool = False,
    rows_per_group: int = 512,
    rows_per_file: int = 100_000,
    compression_level: int = 3,
    store: Store | None = None,
    hold: HoldOptions | None = None,
) -> ExportResult:
    """Write the selected sessions to ``out``; see the module docstring for the layout.

    ``delete`` removes the exported sessions from the store once every file is complete (the
    ``calls`` table must be among ``tables``: it is the lossless copy). ``hold``: the loss
    masks of calls weight updates reached, as the trajectories route's ``mask_stale_versions``
    and ``max_preemptions`` (``store.held``, docs/weight_sync.md).
    """
    tables = tuple(tables)
    for name, value, allowed in (
        ("fmt", fmt, FORMATS),
        ("mode", mode, MODES),
        ("partition", partition, PARTITIONS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
    if not tables or set(tables) - set(TABLES):
        raise ValueError(f"tables must be a non-empty subset of {TABLES}, not {tables}")
    if delete and "calls" not in tables:
        raise ValueError(
            "delete=True needs the 'calls' table in the export (the lossless "
            "copy); otherwise the deleted records would be gone for good"
        )
    started = time.perf_counter()
    own = store is None
    st = store or Store(data)
    batch = batch or default_batch_name()
    if not re.fullmatch(r"[A-Za-z0-9._-]+", batch):
        raise ValueError(f"batch name {batch!r}: use letters, digits, '.', '_' or '-'")
    result = ExportResult(batch=batch, format=fmt)
    out = Path(out)
    try:
        sessions = select_sessions(st, session_ids, group_ids, status, unexported_only)
        if partition == "group":
            sessions.sort(key=lambda s: (s["group_id"] is None, s["group_id"] or ""))
        schemas = arrow_schemas()
        pending: list[tuple[Path, Path]] = []
        writers = {
            t: TableWriter(
                out,
                t,
                fmt,
                schemas[t],
                batch,
                rows_per_group,
                rows_per_file,
                compression_level,
                result,
                pending,
            )
            for t in tables
        }
        for t in tables:
            result.rows[t] = result.tokens[t] = 0
        current: object = object()
        signatures: dict[str, tuple] = {}
        for s in sessions:
            key = s["group_id"] if partition == "group" else None
            if key != current:
                current = key
                for t, w in writers.items():
                    w.open_partition(*partition_dir(out, t, partition, batch, key))
            signature = st.signature(s["id"])  # before the rows: what --delete checks
            try:
                _export_session(st, s, writers, mode, batch, include_bodies, result, hold)
            except Exception as exc:  # noqa: BLE001 - one bad record must not sink the batch
                result.skipped.append(
                    {"session_id": s["id"], "error": f"{type(exc).__name__}: {exc}"[:500]}
                )
                continue
            signatures[s["id"]] = signature
        try:
            for w in writers.values():
                w.close()
        except BaseException:
            for tmp, _ in pending:
                tmp.unlink(missing_ok=True)
            raise
        for tmp, final in pending:  # only now does any file of the batch appear
            os.replace(tmp, final)
        result.session_ids = list(signatures)
        result.sessions = len(result.session_ids)
        result.seconds = time.perf_counter() - started
        if mark_exported:
            st.mark_exported(result.session_ids)
        if delete:  # only now: every file is complete and renamed into place
            result.deleted, result.kept = st.delete_unchanged(signatures)
        _write_manifest(out, result, mode, partition, tables)
    finally:
        if own:
            st.close()
    return result


def _export_session(
    st: Store,
    s: dict,
    writers: dict[str, TableWriter],
    mode: str,
    batch: str,
    include_bodies: bool,
    result: ExportResult,
    hold: HoldOptions | None = None,
) -> None:
    """All of one session's rows, or (on an exception) none: everything is built and checked
    before the first row is handed to a writer."""
    rows = st.raw_calls(s["id"])
    s["n_calls"] = len(rows)
    si = s.get("sample_index")
    if si is not None and not (isinstance(si, int) and 0 <= si <= INT32_MAX):
        result.warnings.append(
            {
                "session_id": s["id"],
                "field": "sample_index",
                "value": str(si)[:40],
                "written_as": None,
            }
        )
        s["sample_index"] = None
    versions: list[int] = []
    infos = [orjson.loads(r["info"]) for r in rows]
    traj_rows = []
    if "trajectories" in writers or "sessions" in writers:
        for t in stitch(call_records(rows, infos), mode, hold=hold):
            t.with_session(s)
            versions += np.unique(t.versions).tolist()
            traj_rows.append((trajectory_row(t, batch), len(t.token_ids)))
    session = session_row(s, batch, versions) if "sessions" in writers else None
    calls = None
    if "calls" in writers and rows:
        bodies = st.bodies_of(s["id"]) if include_bodies else None
        calls = call_columns(rows, infos, s, batch, bodies)
        for name in ("seq", "reused_prefix_len", "stop_token_id"):
            if any(v is not None and not -(2**31) <= v <= INT32_MAX for v in calls[name]):
                raise ValueError(f"a call's {name} does not fit the int32 column")
    if "trajectories" in writers:
        for row, n in traj_rows:
            writers["trajectories"].add(row)
            result.rows["trajectories"] += 1
            result.tokens["trajectories"] += n
    if session is not None:
        writers["sessions"].add(session)
        result.rows["sessions"] += 1
    if calls is not None:
        writers["calls"].extend(calls, len(rows))
        result.rows["calls"] += len(rows)
        result.tokens["calls"] += (
            sum(len(r["prompt_delta"]) + len(r["completion_ids"]) for r in rows) // 4
        )


def _write_manifest(
    out: Path, result: ExportResult, mode: str, partition: str, tables: tuple[str, ...]
) -> None:
    """``_manifests/<batch>.json``: what a batch holds (readers of the tables ignore it)."""
    d = out / "_manifests"
    d.mkdir(parents=True, exist_ok=True)
    body = {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "mode": mode,
        "partition": partition,
        "tables": list(tables),
        "created": time.time(),
        **result.summary(),
    }
    tmp = d / f"{result.batch}.json.tmp"
    tmp.write_text(json.dumps(body, indent=2))
    os.replace(tmp, d / f"{result.batch}.json")
