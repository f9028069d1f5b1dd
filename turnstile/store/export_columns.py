"""Column buffers for one table: scalars as Python lists, token arrays as numpy pieces.

The token arrays are concatenated once per written row group, so no per-token Python objects
are made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..token_arrays import DECLARED
from .trajectories import NO_VERSION

# per-token array columns (token_arrays), nested one list per dimension: null where absent
_NESTED = {key for a in DECLARED.values() if a.own_key for key in (a.name, f"{a.name}_present")}

_LIST_NUMPY = {
    "token_ids": np.int32,
    "loss_mask": np.int8,
    "logprobs": np.float32,
    "versions": np.int64,
    "prompt_delta_ids": np.int32,
    "completion_ids": np.int32,
    "completion_logprobs": np.float32,
}


class Columns:
    """The rows of one table not yet written, held column by column."""

    def __init__(self, schema: Any):
        self.schema = schema
        self.cols: dict[str, list] = {f.name: [] for f in schema}
        self.rows = 0

    def add(self, row: dict) -> None:
        for k, v in self.cols.items():
            v.append(row.get(k))
        self.rows += 1

    def extend(self, columns: Mapping[str, Sequence], n: int) -> None:
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
            if f.name in _NESTED:
                arrays.append(_nested_array(vals, f.type))
            elif f.name in _LIST_NUMPY:
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
    return pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(values.type))


def _nested_array(pieces: list[np.ndarray | None], typ: Any) -> Any:
    """A column of nested lists (one level per dimension) from numpy arrays, one per row (None:
    a null row), built from offsets: no per-element Python objects."""
    import pyarrow as pa

    leaf = typ
    while pa.types.is_list(leaf):
        leaf = leaf.value_type
    chunks = []
    for p in pieces:
        if p is None:
            chunks.append(pa.nulls(1, typ))
            continue
        arr = pa.array(np.ascontiguousarray(p).reshape(-1).astype(leaf.to_pandas_dtype()))
        count = p.size
        for dim in reversed(p.shape[1:]):
            count //= max(dim, 1)
            offs = np.arange(0, count * dim + 1, max(dim, 1), dtype=np.int32)[: count + 1]
            arr = pa.ListArray.from_arrays(pa.array(offs), arr)
        arr = pa.ListArray.from_arrays(pa.array(np.array([0, len(p)], dtype=np.int32)), arr)
        chunks.append(arr.cast(typ))
    if not chunks:
        return pa.array([], type=typ)
    return pa.concat_arrays(chunks)
