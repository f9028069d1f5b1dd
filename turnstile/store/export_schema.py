"""What an export writes and reports: table names, formats, partitionings, Arrow schemas.

The schemas are built lazily: importing this module does not import pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..token_arrays import DECLARED

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


def array_fields() -> list[tuple[str, Any]]:
    """The trajectories table's per-token array columns, one pair per declared array with a key
    of its own (``token_arrays``): ``<name>`` nested one list per dimension in its widest
    dtype, ``<name>_present`` (int8 per token); null in rows whose calls recorded none."""
    import numpy as np
    import pyarrow as pa

    out = []
    for a in DECLARED.values():
        if not a.own_key:
            continue
        t = pa.from_numpy_dtype(np.dtype(a.dtypes[-1]))
        for _ in a.trailing:
            t = pa.list_(t)
        out += [(a.name, pa.list_(t)), (f"{a.name}_present", pa.list_(pa.int8()))]
    return out


def arrow_schemas() -> dict[str, Any]:
    """The Arrow schema of each table (docs/schema.md)."""
    import pyarrow as pa

    named = pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))
    turn = pa.struct(
        [
            ("call_id", pa.string()),
            ("prompt_start", pa.int32()),
            ("completion_start", pa.int32()),
            ("completion_end", pa.int32()),
            ("finish_reason", pa.string()),
            ("seam", pa.string()),
            ("weight_version", pa.string()),
            ("temperature", pa.float64()),
            ("logprob_kind", pa.string()),
            ("behaviour_exact", pa.bool_()),
            ("reward", pa.float64()),
        ]
    )
    image = pa.struct(
        [
            ("sha256", pa.string()),
            ("mime", pa.string()),
            ("offset", pa.int32()),
            ("length", pa.int32()),
        ]
    )
    common = [("schema_version", pa.int16()), ("export_batch", pa.string())]
    trajectories = pa.schema(
        common
        + [
            ("id", pa.string()),
            ("session_id", pa.string()),
            ("mode", pa.string()),
            ("group_id", pa.string()),
            ("sample_index", pa.int32()),
            ("task_id", pa.string()),
            ("call_ids", pa.list_(pa.string())),
            ("token_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float32())),
            ("versions", pa.list_(pa.int64())),
            ("prompt_len", pa.int32()),
            ("num_tokens", pa.int32()),
            ("num_turns", pa.int32()),
            ("turns", pa.list_(turn)),
            ("segment_reason", pa.string()),
            ("segment_detail", pa.string()),
            ("lineage", pa.string()),
            ("lineage_role", pa.string()),
            ("fingerprint", pa.string()),
            ("reward", pa.float64()),
            ("rewards", named),
            ("status", pa.string()),
            ("metadata", pa.string()),
            # the images the tokens hold: their sha256 (the bytes: GET
            # /v1/sessions/{sid}/images/{sha256}), type and block span in token_ids
            ("images", pa.list_(image)),
        ]
        + array_fields()
    )
    sessions = pa.schema(
        common
        + [
            ("id", pa.string()),
            ("created", pa.float64()),
            ("status", pa.string()),
            ("closed", pa.float64()),
            ("termination_reason", pa.string()),
            ("group_id", pa.string()),
            ("sample_index", pa.int32()),
            ("task_id", pa.string()),
            ("metadata", pa.string()),
            ("reward", pa.float64()),
            ("rewards", named),
            (
                "call_rewards",
                pa.list_(
                    pa.struct(
                        [("call_id", pa.string()), ("name", pa.string()), ("value", pa.float64())]
                    )
                ),
            ),
            ("n_calls", pa.int32()),
            ("weight_version_min", pa.int64()),
            ("weight_version_max", pa.int64()),
        ]
    )
    calls = pa.schema(
        common
        + [
            ("id", pa.string()),
            ("session_id", pa.string()),
            ("group_id", pa.string()),
            ("sample_index", pa.int32()),
            ("seq", pa.int32()),
            ("parent_id", pa.string()),
            ("segment_reason", pa.string()),
            ("reused_prefix_len", pa.int32()),
            ("prompt_delta_ids", pa.list_(pa.int32())),
            ("completion_ids", pa.list_(pa.int32())),
            ("completion_logprobs", pa.list_(pa.float32())),
            ("finish_reason", pa.string()),
            ("stop_token_id", pa.int32()),
            ("seam", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("message", pa.string()),
            ("history_hash", pa.binary()),
            ("prefix_hashes", pa.binary()),
            ("info", pa.string()),
            ("created", pa.float64()),
            ("weight_version", pa.string()),
            ("arrays", pa.binary()),  # the per-token arrays' blob as stored (token_arrays.pack)
            ("request_body", pa.string()),
            ("response_body", pa.string()),
        ]
    )
    return {"trajectories": trajectories, "sessions": sessions, "calls": calls}
