"""Reading an exported ``calls`` table back (a lossless restore, an audit, the tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


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
                lists[name] = [flat[offs[i] : offs[i + 1]] for i in range(n)]
            scalars = rb.drop_columns(list(lists)).to_pylist()
            for i, row in enumerate(scalars):
                row.update({k: v[i] for k, v in lists.items()})
                yield row
