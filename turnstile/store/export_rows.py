"""One session's rows for each exported table, from the stored records."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson

from ..token_arrays import span_versions, unpack
from .database import Row
from .export_schema import EXPORT_SCHEMA_VERSION
from .records import CallRecord, unpack_body
from .trajectories import NO_VERSION, Trajectory


def _named(d: dict[str, float]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in d.items()]


def _text(blob: bytes | None) -> str | None:
    return None if blob is None else bytes(blob).decode()


def trajectory_row(t: Trajectory, batch: str) -> dict:
    return {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "export_batch": batch,
        "id": t.id,
        "session_id": t.session_id,
        "mode": t.mode,
        "group_id": t.group_id,
        "sample_index": t.sample_index,
        "task_id": t.task_id,
        "call_ids": t.call_ids,
        "token_ids": t.token_ids,
        "loss_mask": t.loss_mask,
        "logprobs": t.logprobs,
        "versions": t.versions,
        "prompt_len": t.prompt_len,
        "num_tokens": len(t.token_ids),
        "num_turns": t.num_turns,
        "turns": [
            {
                k: turn.get(k)
                for k in (
                    "call_id",
                    "prompt_start",
                    "completion_start",
                    "completion_end",
                    "finish_reason",
                    "seam",
                    "weight_version",
                    "temperature",
                    "logprob_kind",
                    "behaviour_exact",
                    "reward",
                )
            }
            for turn in t.turns
        ],
        "segment_reason": t.segment_reason,
        "segment_detail": t.segment_detail,
        "lineage": t.lineage,
        "lineage_role": t.lineage_role,
        "fingerprint": t.fingerprint,
        "reward": t.reward,
        "rewards": _named(t.rewards),
        "status": t.status,
        "metadata": orjson.dumps(t.metadata).decode(),
        "images": t.images,
        **t.arrays,  # per-token arrays (routed experts) and their presence masks
        **{f"{name}_present": mask for name, mask in t.present.items()},
    }


def session_row(s: dict, batch: str, versions: list[int]) -> dict:
    known = [v for v in versions if v != NO_VERSION]
    return {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "export_batch": batch,
        "id": s["id"],
        "created": s["created"],
        "status": s["status"],
        "closed": s["closed"],
        "termination_reason": s["termination_reason"],
        "group_id": s["group_id"],
        "sample_index": s["sample_index"],
        "task_id": s["task_id"],
        "metadata": orjson.dumps(s["metadata"]).decode(),
        "reward": s["reward"],
        "rewards": _named(s["rewards"]),
        "call_rewards": [
            {"call_id": cid, "name": k, "value": v}
            for cid, r in s["call_rewards"].items()
            for k, v in r["rewards"].items()
        ],
        "n_calls": s["n_calls"],
        "weight_version_min": min(known) if known else None,
        "weight_version_max": max(known) if known else None,
    }


def call_columns(
    rows: list[Row], infos: list[dict], s: dict, batch: str, bodies: dict[str, tuple] | None
) -> dict[str, Sequence]:
    """The ``calls`` table columns of one session's stored rows (blobs and JSON untouched)."""
    c = dict(zip(rows[0].keys(), zip(*rows, strict=True), strict=True))
    n = len(rows)
    out: dict[str, Sequence] = {
        "schema_version": [EXPORT_SCHEMA_VERSION] * n,
        "export_batch": [batch] * n,
        "id": c["id"],
        "session_id": c["session_id"],
        "group_id": [s["group_id"]] * n,
        "sample_index": [s["sample_index"]] * n,
        "seq": c["seq"],
        "parent_id": c["parent_id"],
        "segment_reason": c["segment_reason"],
        "reused_prefix_len": c["reused_prefix_len"],
        "prompt_delta_ids": [np.frombuffer(b, dtype=np.int32) for b in c["prompt_delta"]],
        "completion_ids": [np.frombuffer(b, dtype=np.int32) for b in c["completion_ids"]],
        "completion_logprobs": [
            np.frombuffer(b, dtype=np.float32) for b in c["completion_logprobs"]
        ],
        "finish_reason": c["finish_reason"],
        "stop_token_id": c["stop_token_id"],
        "seam": c["seam"],
        "status": c["status"],
        "error": c["error"],
        "message": [_text(b) for b in c["message"]],
        "history_hash": c["history_hash"],
        "prefix_hashes": c["prefix_hashes"],
        "info": [_text(b) for b in c["info"]],
        "created": c["created"],
        "arrays": [None if b is None else bytes(b) for b in c["arrays"]],
        "weight_version": [
            _version_text(_per_token(i, len(b) // 4))
            for i, b in zip(infos, c["completion_ids"], strict=True)
        ],
    }
    if bodies:
        got = [bodies.get(cid) for cid in c["id"]]
        out["request_body"] = [_body_text(b[0]) if b else None for b in got]
        out["response_body"] = [_body_text(b[1]) if b else None for b in got]
    return out


def _per_token(info: dict, n: int) -> object:
    """The call's version as the calls table has always given it: per sampled token where
    the engine reported spans (kept in ``info`` beside the last version), else the one."""
    wv = info.get("weight_version")
    if isinstance(wv, list):
        return wv  # a record from before the per-token arrays
    return span_versions(info.get("weight_versions"), n) or wv


def _version_text(wv: object) -> str | None:
    if wv is None:
        return None
    return orjson.dumps(wv).decode() if isinstance(wv, list) else str(wv)


def _body_text(blob: bytes | None) -> str | None:
    return None if blob is None else orjson.dumps(unpack_body(blob)).decode()


def call_records(rows: list[Row], infos: list[dict]) -> list[CallRecord]:
    """What stitching needs of each stored row (the message is not parsed)."""
    return [
        CallRecord(
            id=r["id"],
            session_id=r["session_id"],
            seq=r["seq"],
            parent_id=r["parent_id"],
            segment_reason=r["segment_reason"],
            reused_prefix_len=r["reused_prefix_len"],
            prompt_delta=r["prompt_delta"],
            completion_ids=r["completion_ids"],
            completion_logprobs=r["completion_logprobs"],
            finish_reason=r["finish_reason"],
            stop_token_id=r["stop_token_id"],
            seam=r["seam"],
            status=r["status"],
            info=info,
            arrays=unpack(r["arrays"]),
        )
        for r, info in zip(rows, infos, strict=True)
    ]
