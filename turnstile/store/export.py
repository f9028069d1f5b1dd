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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .sqlite import INT32_MAX, CallRecord, Store, unpack_body
from .trajectories import MODES, NO_VERSION, Trajectory, stitch

EXPORT_SCHEMA_VERSION = 1
TABLES = ("trajectories", "sessions", "calls")
FORMATS = ("parquet", "jsonl")
PARTITIONS = ("batch", "group", "none")


@dataclass
class ExportResult:
    batch: str
    format: str
    sessions: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    deleted: int = 0
    # sessions left out (id, why), values written as null (id, what), sessions --delete kept
    skipped: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "session_ids"}
        return out


# ---------------------------------------------------------------------------------------------
# Arrow schemas (built lazily: importing this module does not import pyarrow)


def arrow_schemas() -> dict[str, Any]:
    """The Arrow schema of each table (docs/schema.md)."""
    import pyarrow as pa

    named = pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))
    turn = pa.struct([
        ("call_id", pa.string()), ("prompt_start", pa.int32()),
        ("completion_start", pa.int32()), ("completion_end", pa.int32()),
        ("finish_reason", pa.string()), ("seam", pa.string()),
        ("weight_version", pa.string()), ("temperature", pa.float64()),
        ("reward", pa.float64()),
    ])
    common = [("schema_version", pa.int16()), ("export_batch", pa.string())]
    trajectories = pa.schema(common + [
        ("id", pa.string()), ("session_id", pa.string()), ("mode", pa.string()),
        ("group_id", pa.string()), ("sample_index", pa.int32()), ("task_id", pa.string()),
        ("call_ids", pa.list_(pa.string())),
        ("token_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())), ("versions", pa.list_(pa.int64())),
        ("prompt_len", pa.int32()), ("num_tokens", pa.int32()), ("num_turns", pa.int32()),
        ("turns", pa.list_(turn)),
        ("segment_reason", pa.string()), ("segment_detail", pa.string()),
        ("fingerprint", pa.string()),
        ("reward", pa.float64()), ("rewards", named), ("status", pa.string()),
        ("metadata", pa.string()),
    ])
    sessions = pa.schema(common + [
        ("id", pa.string()), ("created", pa.float64()), ("status", pa.string()),
        ("closed", pa.float64()), ("termination_reason", pa.string()),
        ("group_id", pa.string()), ("sample_index", pa.int32()), ("task_id", pa.string()),
        ("metadata", pa.string()), ("reward", pa.float64()), ("rewards", named),
        ("call_rewards", pa.list_(pa.struct([("call_id", pa.string()), ("name", pa.string()),
                                             ("value", pa.float64())]))),
        ("n_calls", pa.int32()), ("weight_version_min", pa.int64()),
        ("weight_version_max", pa.int64()),
    ])
    calls = pa.schema(common + [
        ("id", pa.string()), ("session_id", pa.string()), ("group_id", pa.string()),
        ("sample_index", pa.int32()), ("seq", pa.int32()), ("parent_id", pa.string()),
        ("segment_reason", pa.string()), ("reused_prefix_len", pa.int32()),
        ("prompt_delta_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()), ("stop_token_id", pa.int32()), ("seam", pa.string()),
        ("status", pa.string()), ("error", pa.string()), ("message", pa.string()),
        ("history_hash", pa.binary()), ("prefix_hashes", pa.binary()),
        ("info", pa.string()), ("created", pa.float64()), ("weight_version", pa.string()),
        ("request_body", pa.string()), ("response_body", pa.string()),
    ])
    return {"trajectories": trajectories, "sessions": sessions, "calls": calls}


# ---------------------------------------------------------------------------------------------
# Column buffers: scalars as Python lists, token arrays as numpy pieces (concatenated once)

_LIST_NUMPY = {"token_ids": np.int32, "loss_mask": np.int8, "logprobs": np.float32,
               "versions": np.int64, "prompt_delta_ids": np.int32, "completion_ids": np.int32,
               "completion_logprobs": np.float32}


class _Columns:
    def __init__(self, schema: Any):
        self.schema = schema
        self.cols: dict[str, list] = {f.name: [] for f in schema}
        self.rows = 0

    def add(self, row: dict) -> None:
        for k, v in self.cols.items():
            v.append(row.get(k))
        self.rows += 1

    def extend(self, columns: dict[str, list], n: int) -> None:
        """Append ``n`` rows given column-wise (missing columns are null)."""
        for k, v in self.cols.items():
            c = columns.get(k)
            v.extend(c if c is not None else [None] * n)
        self.rows += n

    def table(self) -> Any:
        import pyarrow as pa

        arrays = []
        for f in self.schema:
            vals = self.cols[f.name]
            if f.name in _LIST_NUMPY:
                arrays.append(_list_array(vals, _LIST_NUMPY[f.name], f.name == "versions"))
            else:
                arrays.append(pa.array(vals, type=f.type))
        self.cols = {f.name: [] for f in self.schema}
        self.rows = 0
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _list_array(pieces: list[np.ndarray], dtype: Any, null_negative: bool) -> Any:
    """A list column from numpy arrays in one copy (no per-element Python objects)."""
    import pyarrow as pa

    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.zeros(0, dtype)
    mask = flat == NO_VERSION if null_negative else None
    values = pa.array(flat, mask=mask if mask is not None and mask.any() else None)
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(
        pa.list_(values.type))


# ---------------------------------------------------------------------------------------------
# Writers


class _ParquetSink:
    suffix = ".parquet"

    def __init__(self, path: Path, schema: Any, level: int):
        import pyarrow.parquet as pq

        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        scalar = [f.name for f in schema if not str(f.type).startswith("list")]
        self.writer = pq.ParquetWriter(
            self.tmp, schema, compression="zstd", compression_level=level,
            use_dictionary=[n for n in scalar if n not in ("created", "closed", "reward")],
            write_statistics=scalar)

    def write(self, cols: _Columns) -> None:
        self.writer.write_table(cols.table())

    def close(self) -> int:
        self.writer.close()
        return self.tmp.stat().st_size


class _JsonlSink:
    suffix = ".jsonl"

    def __init__(self, path: Path, schema: Any, level: int):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.f = self.tmp.open("wb")

    def write(self, cols: _Columns) -> None:
        names = list(cols.cols)
        for i in range(cols.rows):
            self.f.write(orjson.dumps({n: _jsonable(n, cols.cols[n][i]) for n in names},
                                      option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        cols.cols = {n: [] for n in names}
        cols.rows = 0

    def close(self) -> int:
        self.f.close()
        return self.tmp.stat().st_size


_JSON_TEXT = {"metadata", "message", "info", "request_body", "response_body"}


def _jsonable(name: str, v: Any) -> Any:
    """JSONL spellings: JSON text columns inline as objects, NaN/-1 as null, bytes as hex."""
    if v is None:
        return None
    if name in _JSON_TEXT:
        return orjson.loads(v)
    if isinstance(v, bytes):
        return v.hex()
    if name == "versions":
        return [None if x == NO_VERSION else x for x in v.tolist()]
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return [None if x != x else x for x in v.astype(np.float64).tolist()]
    return v


class _TableWriter:
    """One table's files for the current partition, rotated every ``rows_per_file``."""

    def __init__(self, out: Path, table: str, fmt: str, schema: Any, batch: str,
                 rows_per_group: int, rows_per_file: int, level: int, result: ExportResult,
                 pending: list[tuple[Path, Path]]):
        self.out, self.table, self.schema, self.batch = out, table, schema, batch
        self.sink_cls = _ParquetSink if fmt == "parquet" else _JsonlSink
        self.rows_per_group, self.rows_per_file, self.level = rows_per_group, rows_per_file, level
        self.result = result
        self.pending = pending  # (tmp, final) of every complete file, renamed at the end
        self.cols = _Columns(schema)
        self.sink: _ParquetSink | _JsonlSink | None = None
        self.dir: Path | None = None
        self.prefix = ""
        self.part = 0
        self.in_file = 0

    def open_partition(self, directory: Path, prefix: str) -> None:
        self.close()
        self.dir, self.prefix, self.part = directory, prefix, 0

    def add(self, row: dict) -> None:
        self.cols.add(row)
        self.in_file += 1
        if self.cols.rows >= self.rows_per_group:
            self._flush()
        if self.in_file >= self.rows_per_file:
            self.close()

    def extend(self, columns: dict[str, list], n: int) -> None:
        self.cols.extend(columns, n)
        self.in_file += n
        if self.cols.rows >= self.rows_per_group:
            self._flush()
        if self.in_file >= self.rows_per_file:
            self.close()

    def _flush(self) -> None:
        if not self.cols.rows:
            return
        if self.sink is None:
            assert self.dir is not None
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / f"{self.prefix}{self.part:05d}{self.sink_cls.suffix}"
            if path.exists() or any(path == final for _, final in self.pending):
                raise FileExistsError(f"{path} exists: export batch {self.batch!r} was "
                                      "written before; pick another --batch name")
            self.sink = self.sink_cls(path, self.schema, self.level)
            self.part += 1
        self.sink.write(self.cols)

    def close(self) -> None:
        self._flush()
        if self.sink is not None:
            size = self.sink.close()
            self.pending.append((self.sink.tmp, self.sink.path))
            self.result.bytes[self.table] = self.result.bytes.get(self.table, 0) + size
            self.result.files.setdefault(self.table, []).append(str(self.sink.path))
            self.sink = None
        self.in_file = 0


# ---------------------------------------------------------------------------------------------
# Rows


def _named(d: dict[str, float]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in d.items()]


def _text(blob: bytes | None) -> str | None:
    return None if blob is None else bytes(blob).decode()


def trajectory_row(t: Trajectory, batch: str) -> dict:
    return {
        "schema_version": EXPORT_SCHEMA_VERSION, "export_batch": batch, "id": t.id,
        "session_id": t.session_id, "mode": t.mode, "group_id": t.group_id,
        "sample_index": t.sample_index, "task_id": t.task_id, "call_ids": t.call_ids,
        "token_ids": t.token_ids, "loss_mask": t.loss_mask, "logprobs": t.logprobs,
        "versions": t.versions, "prompt_len": t.prompt_len, "num_tokens": len(t.token_ids),
        "num_turns": t.num_turns,
        "turns": [{k: turn.get(k) for k in ("call_id", "prompt_start", "completion_start",
                                            "completion_end", "finish_reason", "seam",
                                            "weight_version", "temperature", "reward")}
                  for turn in t.turns],
        "segment_reason": t.segment_reason, "segment_detail": t.segment_detail,
        "fingerprint": t.fingerprint, "reward": t.reward, "rewards": _named(t.rewards),
        "status": t.status, "metadata": orjson.dumps(t.metadata).decode(),
    }


def session_row(s: dict, batch: str, versions: list[int]) -> dict:
    known = [v for v in versions if v != NO_VERSION]
    return {
        "schema_version": EXPORT_SCHEMA_VERSION, "export_batch": batch, "id": s["id"],
        "created": s["created"], "status": s["status"], "closed": s["closed"],
        "termination_reason": s["termination_reason"], "group_id": s["group_id"],
        "sample_index": s["sample_index"], "task_id": s["task_id"],
        "metadata": orjson.dumps(s["metadata"]).decode(), "reward": s["reward"],
        "rewards": _named(s["rewards"]),
        "call_rewards": [{"call_id": cid, "name": k, "value": v}
                         for cid, r in s["call_rewards"].items() for k, v in r["rewards"].items()],
        "n_calls": s["n_calls"], "weight_version_min": min(known) if known else None,
        "weight_version_max": max(known) if known else None,
    }


def call_columns(rows: list[tuple], infos: list[dict], s: dict, batch: str,
                 bodies: dict[str, tuple] | None) -> dict[str, list]:
    """The ``calls`` table columns of one session's stored rows (blobs and JSON untouched)."""
    c = list(zip(*rows, strict=True))
    n = len(rows)
    out = {
        "schema_version": [EXPORT_SCHEMA_VERSION] * n, "export_batch": [batch] * n,
        "id": c[0], "session_id": c[1], "group_id": [s["group_id"]] * n,
        "sample_index": [s["sample_index"]] * n, "seq": c[2], "parent_id": c[3],
        "segment_reason": c[4], "reused_prefix_len": c[5],
        "prompt_delta_ids": [np.frombuffer(b, dtype=np.int32) for b in c[6]],
        "completion_ids": [np.frombuffer(b, dtype=np.int32) for b in c[7]],
        "completion_logprobs": [np.frombuffer(b, dtype=np.float32) for b in c[8]],
        "finish_reason": c[9], "stop_token_id": c[10], "seam": c[11], "status": c[12],
        "error": c[13], "message": [_text(b) for b in c[14]], "history_hash": c[15],
        "prefix_hashes": c[16], "info": [_text(b) for b in c[17]], "created": c[18],
        "weight_version": [_version_text(i.get("weight_version")) for i in infos],
    }
    if bodies:
        got = [bodies.get(cid) for cid in c[0]]
        out["request_body"] = [_body_text(b[0]) if b else None for b in got]
        out["response_body"] = [_body_text(b[1]) if b else None for b in got]
    return out


def _version_text(wv: object) -> str | None:
    if wv is None:
        return None
    return orjson.dumps(wv).decode() if isinstance(wv, list) else str(wv)


def _body_text(blob: bytes | None) -> str | None:
    return None if blob is None else orjson.dumps(unpack_body(blob)).decode()


# ---------------------------------------------------------------------------------------------
# Export


def _safe(name: str) -> str:
    """A partition value as a directory name: readable, no separators, reversible enough;
    a long one is cut and ends in a hash of the whole (file names hold 255 bytes)."""
    out = re.sub(r"[^A-Za-z0-9._-]", lambda m: f"%{ord(m.group()):02X}", name) or "_"
    if len(out) > 120:
        out = out[:96] + "~" + hashlib.sha256(name.encode()).hexdigest()[:20]
    return out


def default_batch_name() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def select_sessions(store: Store, session_ids: Iterable[str] | None = None,
                    group_ids: Iterable[str] | None = None, status: str | None = None,
                    unexported_only: bool = False) -> list[dict]:
    """The sessions an export covers, in creation order."""
    if session_ids is not None:
        out = []
        for sid in session_ids:
            s = store.get_session(sid)
            if s is None:
                raise KeyError(f"no session {sid!r} in {store.path}")
            out.append(s)
        return out
    groups = list(group_ids) if group_ids is not None else [None]
    out = []
    for g in groups:
        after = None
        while True:
            page, more = store.list_sessions(g, status, limit=1000, after=after,
                                             exported=False if unexported_only else None)
            out += page
            if not more:
                break
            after = page[-1]["id"]
    return out


def export(data: str | Path, out: str | Path, *, fmt: str = "parquet",
           tables: Iterable[str] = TABLES, mode: str = "merged", partition: str = "batch",
           batch: str | None = None, session_ids: Iterable[str] | None = None,
           group_ids: Iterable[str] | None = None, status: str | None = None,
           unexported_only: bool = False, mark_exported: bool = True, delete: bool = False,
           include_bodies: bool = False, rows_per_group: int = 512,
           rows_per_file: int = 100_000, compression_level: int = 3,
           store: Store | None = None) -> ExportResult:
    """Write the selected sessions to ``out``; see the module docstring for the layout.

    ``delete`` removes the exported sessions from the store once every file is complete (the
    ``calls`` table must be among ``tables``: it is the lossless copy).
    """
    tables = tuple(tables)
    for name, value, allowed in (("fmt", fmt, FORMATS), ("mode", mode, MODES),
                                 ("partition", partition, PARTITIONS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
    if not tables or set(tables) - set(TABLES):
        raise ValueError(f"tables must be a non-empty subset of {TABLES}, not {tables}")
    if delete and "calls" not in tables:
        raise ValueError("delete=True needs the 'calls' table in the export (the lossless "
                         "copy); otherwise the deleted records would be gone for good")
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
        writers = {t: _TableWriter(out, t, fmt, schemas[t], batch, rows_per_group,
                                   rows_per_file, compression_level, result, pending)
                   for t in tables}
        for t in tables:
            result.rows[t] = result.tokens[t] = 0
        current: object = object()
        signatures: dict[str, tuple] = {}
        for s in sessions:
            key = s["group_id"] if partition == "group" else None
            if key != current:
                current = key
                for t, w in writers.items():
                    if partition == "batch":
                        w.open_partition(out / t / f"batch-{batch}", "part-")
                    elif partition == "group":
                        name = "_none" if key is None else _safe(str(key))
                        w.open_partition(out / t / f"group-{name}", f"part-{batch}-")
                    else:
                        w.open_partition(out / t, f"part-{batch}-")
            signature = st.signature(s["id"])  # before the rows: what --delete checks
            try:
                _export_session(st, s, writers, mode, batch, include_bodies, result)
            except Exception as exc:  # noqa: BLE001 - one bad record must not sink the batch
                result.skipped.append({"session_id": s["id"],
                                       "error": f"{type(exc).__name__}: {exc}"[:500]})
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


def _export_session(st: Store, s: dict, writers: dict[str, _TableWriter], mode: str,
                    batch: str, include_bodies: bool, result: ExportResult) -> None:
    """All of one session's rows, or (on an exception) none: everything is built and checked
    before the first row is handed to a writer."""
    rows = st.raw_calls(s["id"])
    s["n_calls"] = len(rows)
    si = s.get("sample_index")
    if si is not None and not (isinstance(si, int) and 0 <= si <= INT32_MAX):
        result.warnings.append({"session_id": s["id"], "field": "sample_index",
                                "value": str(si)[:40], "written_as": None})
        s["sample_index"] = None
    versions: list[int] = []
    infos = [orjson.loads(r[17]) for r in rows]
    traj_rows = []
    if "trajectories" in writers or "sessions" in writers:
        for t in stitch(_records(rows, infos), mode):
            t.with_session(s)
            versions += np.unique(t.versions).tolist()
            traj_rows.append((trajectory_row(t, batch), len(t.token_ids)))
    session = session_row(s, batch, versions) if "sessions" in writers else None
    calls = None
    if "calls" in writers and rows:
        bodies = st.bodies_of(s["id"]) if include_bodies else None
        calls = call_columns(rows, infos, s, batch, bodies)
        for name in ("seq", "reused_prefix_len", "stop_token_id"):
            if any(v is not None and not -2**31 <= v <= INT32_MAX for v in calls[name]):
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
        result.tokens["calls"] += sum(len(r[6]) + len(r[7]) for r in rows) // 4


def _records(rows: list[tuple], infos: list[dict]) -> list[CallRecord]:
    """What stitching needs of each stored row (the message is not parsed)."""
    return [CallRecord(
        id=r[0], session_id=r[1], seq=r[2], parent_id=r[3], segment_reason=r[4],
        reused_prefix_len=r[5], prompt_delta=r[6], completion_ids=r[7],
        completion_logprobs=r[8], finish_reason=r[9], stop_token_id=r[10], seam=r[11],
        status=r[12], info=info) for r, info in zip(rows, infos, strict=True)]


def _write_manifest(out: Path, result: ExportResult, mode: str, partition: str,
                    tables: tuple[str, ...]) -> None:
    """``_manifests/<batch>.json``: what a batch holds (readers of the tables ignore it)."""
    d = out / "_manifests"
    d.mkdir(parents=True, exist_ok=True)
    body = {"schema_version": EXPORT_SCHEMA_VERSION, "mode": mode, "partition": partition,
            "tables": list(tables), "created": time.time(), **result.summary()}
    tmp = d / f"{result.batch}.json.tmp"
    tmp.write_text(json.dumps(body, indent=2))
    os.replace(tmp, d / f"{result.batch}.json")


# ---------------------------------------------------------------------------------------------
# Reading back


def read_calls(path: str | Path) -> Iterator[dict]:
    """Call rows of an exported ``calls`` table (Parquet), as dicts with numpy token arrays:
    what a lossless restore or an audit needs."""
    import pyarrow.parquet as pq

    files = sorted(Path(path).rglob("*.parquet")) if Path(path).is_dir() else [Path(path)]
    for f in files:
        pf = pq.ParquetFile(f)
        for rb in pf.iter_batches():
            n = rb.num_rows
            lists = {}
            for name in ("prompt_delta_ids", "completion_ids", "completion_logprobs"):
                arr = rb.column(name)
                flat = arr.values.to_numpy(zero_copy_only=False)
                offs = arr.offsets.to_numpy()
                lists[name] = [flat[offs[i]:offs[i + 1]] for i in range(n)]
            scalars = rb.drop_columns(list(lists)).to_pylist()
            for i, row in enumerate(scalars):
                row.update({k: v[i] for k, v in lists.items()})
                yield row


# ---------------------------------------------------------------------------------------------
# CLI: turnstile export


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="turnstile-data",
                   help="store directory (or .sqlite3 file) to read")
    p.add_argument("--out", required=True, help="directory to write the tables under")
    p.add_argument("--format", choices=FORMATS, default="parquet",
                   help="file format (default: parquet)")
    p.add_argument("--tables", default=",".join(TABLES),
                   help="comma-separated subset of " + ",".join(TABLES))
    p.add_argument("--mode", choices=MODES, default="merged",
                   help="trajectories: one sample per root-to-leaf path, or per call")
    p.add_argument("--partition", choices=PARTITIONS, default="batch",
                   help="file layout: one folder per batch, per group, or flat (default: "
                        "batch)")
    p.add_argument("--batch", help="name of this export batch (e.g. step-000012); "
                                   "default: a UTC timestamp")
    p.add_argument("--group", action="append", help="only this group (repeatable)")
    p.add_argument("--session", action="append", help="only this session (repeatable)")
    p.add_argument("--status", choices=["open", "closed"], help="only sessions with it")
    p.add_argument("--unexported", action="store_true",
                   help="only sessions no earlier export wrote")
    p.add_argument("--delete", action="store_true",
                   help="delete the exported sessions from the store afterwards")
    p.add_argument("--vacuum", action="store_true",
                   help="after --delete, shrink the store file (rewrites it)")
    p.add_argument("--with-bodies", action="store_true",
                   help="add kept raw request/response bodies to the calls table")
    p.add_argument("--rows-per-file", type=int, default=100_000,
                   help="rows per written file before starting the next (default: 100000)")


def cli(args: argparse.Namespace) -> None:
    """``turnstile export``: prints a JSON summary of what was written."""
    try:
        result = export(
            args.data, args.out, fmt=args.format,
            tables=[t for t in args.tables.split(",") if t], mode=args.mode,
            partition=args.partition, batch=args.batch, session_ids=args.session,
            group_ids=args.group, status=args.status, unexported_only=args.unexported,
            delete=args.delete, include_bodies=args.with_bodies,
            rows_per_file=args.rows_per_file)
    except (ValueError, KeyError, FileExistsError) as exc:
        print(f"turnstile export: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    if args.delete and args.vacuum:
        st = Store(args.data)
        st.vacuum()
        st.close()
    print(json.dumps(result.summary(), indent=2))
