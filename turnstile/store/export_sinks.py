"""The files an export writes: Parquet or JSONL sinks, rotated per partition and row count.

Each file is written as ``.tmp``; the caller renames every complete file into place at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .export_columns import Columns
from .export_schema import ExportResult
from .trajectories import NO_VERSION


class _ParquetSink:
    suffix = ".parquet"

    def __init__(self, path: Path, schema: Any, level: int):
        import pyarrow.parquet as pq

        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        scalar = [f.name for f in schema if not str(f.type).startswith("list")]
        self.writer = pq.ParquetWriter(
            self.tmp,
            schema,
            compression="zstd",
            compression_level=level,
            use_dictionary=[n for n in scalar if n not in ("created", "closed", "reward")],
            write_statistics=scalar,
        )

    def write(self, cols: Columns) -> None:
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

    def write(self, cols: Columns) -> None:
        names = list(cols.cols)
        for i in range(cols.rows):
            self.f.write(
                orjson.dumps(
                    {n: _jsonable(n, cols.cols[n][i]) for n in names},
                    option=orjson.OPT_SERIALIZE_NUMPY,
                )
                + b"\n"
            )
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


class TableWriter:
    """One table's files for the current partition, rotated every ``rows_per_file``."""

    def __init__(
        self,
        out: Path,
        table: str,
        fmt: str,
        schema: Any,
        batch: str,
        rows_per_group: int,
        rows_per_file: int,
        level: int,
        result: ExportResult,
        pending: list[tuple[Path, Path]],
    ):
        self.out, self.table, self.schema, self.batch = out, table, schema, batch
        self.sink_cls = _ParquetSink if fmt == "parquet" else _JsonlSink
        self.rows_per_group, self.rows_per_file, self.level = rows_per_group, rows_per_file, level
        self.result = result
        self.pending = pending  # (tmp, final) of every complete file, renamed at the end
        self.cols = Columns(schema)
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

    def extend(self, columns: Mapping[str, Sequence], n: int) -> None:
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
                raise FileExistsError(
                    f"{path} exists: export batch {self.batch!r} was "
                    "written before; pick another --batch name"
                )
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
