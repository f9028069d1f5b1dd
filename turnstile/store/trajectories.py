"""Stitch recorded calls into trajectories: one per root-to-leaf path of a session's call tree.

Each call contributes its prompt delta (mask 0, logprob 0) then its completion (mask 1, the
engine's logprobs). Because a child's prompt *is* its parent's prompt + completion + delta,
the concatenation along a path equals exactly the last call's prompt + completion: the
sequence the engine saw and sampled. A call that started a new segment (history rewritten,
template not prefix-preserving) has no parent, so it roots a trajectory of its own.
"""

from __future__ import annotations

from .sqlite import CallRecord


def trajectories(calls: list[CallRecord]) -> list[dict]:
    ok = [c for c in calls if c.status == "ok"]
    by_id = {c.id: c for c in ok}
    has_child = {c.parent_id for c in ok if c.parent_id}
    out = []
    for leaf in ok:
        if leaf.id in has_child:
            continue
        path = [leaf]
        while path[-1].parent_id is not None and path[-1].parent_id in by_id:
            path.append(by_id[path[-1].parent_id])
        path.reverse()
        out.append(_flatten(path))
    return out


def _flatten(path: list[CallRecord]) -> dict:
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    turns = []
    for c in path:
        prompt_start = len(ids)
        ids.extend(c.prompt_delta)
        completion_start = len(ids)
        ids.extend(c.completion_ids)
        mask.extend([0] * len(c.prompt_delta))
        mask.extend([1] * len(c.completion_ids))
        logprobs.extend([0.0] * len(c.prompt_delta))
        logprobs.extend(c.completion_logprobs)
        turns.append({"call_id": c.id, "prompt_start": prompt_start,
                      "completion_start": completion_start, "completion_end": len(ids),
                      "finish_reason": c.finish_reason, "seam": c.seam})
    root = path[0]
    return {
        "id": path[-1].id,
        "session_id": root.session_id,
        "call_ids": [c.id for c in path],
        "token_ids": ids,
        "loss_mask": mask,
        "logprobs": logprobs,
        "turns": turns,
        "segment_reason": root.segment_reason,
        "segment_detail": root.info.get("segment_detail"),
        "fingerprint": root.info.get("fingerprint"),
    }
