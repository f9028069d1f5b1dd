"""Shared pieces: prompt/response split, padding, GRPO advantages, version spans."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import NO_VERSION, Trajectory


def split(t: Trajectory, fill_logprob: float | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(prompt_ids, response_ids, response_mask, response_logprobs, response_versions)``.

    The prompt is everything before the first sampled token (``prompt_len``); the response is
    the rest: sampled turns (mask 1) interleaved with observations (mask 0)."""
    p = t.prompt_len
    return (t.token_ids[:p], t.token_ids[p:], t.loss_mask[p:],
            logprobs(t, fill_logprob)[p:], t.versions[p:])


def logprobs(t: Trajectory, fill: float | None = None) -> np.ndarray:
    """The float32 logprobs, with NaN (unknown) replaced by ``fill`` if given."""
    if fill is None:
        return t.logprobs
    return np.where(np.isnan(t.logprobs), np.float32(fill), t.logprobs).astype(np.float32)


def pad(rows: Sequence[np.ndarray], length: int, value: float, left: bool,
        dtype: type | np.dtype) -> np.ndarray:
    """Stack 1-D arrays into ``[B, length]``, padding on the left or the right."""
    out = np.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r) > length:
            raise ValueError(f"row {i} has {len(r)} tokens, more than the length {length}; "
                             "raise the limit (Turnstile never truncates silently)")
        if len(r):
            if left:
                out[i, length - len(r):] = r
            else:
                out[i, :len(r)] = r
    return out


def version_span(versions: np.ndarray) -> tuple[int | None, int | None]:
    """(min, max) policy version over the sampled tokens, or (None, None) if unknown."""
    known = versions[versions != NO_VERSION]
    if not len(known):
        return None, None
    return int(known.min()), int(known.max())


def reward_of(t: Trajectory, default: float = 0.0) -> float:
    return default if t.reward is None else float(t.reward)


def group_key(t: Trajectory) -> str:
    """The GRPO group: the group id, else the session (a group of one)."""
    return t.group_id if t.group_id is not None else f"session:{t.session_id}"


def group_indices(trajs: Sequence[Trajectory]) -> tuple[list[int], list[str]]:
    """Each sample's group number (in order of first appearance) and the group keys."""
    keys: dict[str, int] = {}
    idx = [keys.setdefault(group_key(t), len(keys)) for t in trajs]
    return idx, list(keys)


def grpo_advantages(trajs: Sequence[Trajectory], eps: float = 1e-6,
                    scale: bool = True) -> np.ndarray:
    """Group-relative advantages, one per sample: ``(r - mean_group) / (std_group + eps)``
    (population std; ``scale=False`` only centres). Missing rewards count as 0."""
    idx, keys = group_indices(trajs)
    r = np.array([reward_of(t) for t in trajs], dtype=np.float64)
    g = np.array(idx, dtype=np.int64)
    adv = np.zeros(len(trajs), dtype=np.float64)
    for k in range(len(keys)):
        sel = g == k
        centred = r[sel] - r[sel].mean()
        adv[sel] = centred / (r[sel].std() + eps) if scale else centred
    return adv.astype(np.float32)


def action_ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` runs where ``mask == 1``."""
    m = np.concatenate([[0], mask.astype(np.int8), [0]])
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(),
                    strict=True))


def ids_meta(t: Trajectory) -> dict:
    """The rollout's identity, for a stack's free-form metadata channel."""
    return {"trajectory_id": t.id, "session_id": t.session_id, "group_id": t.group_id,
            "sample_index": t.sample_index, "task_id": t.task_id, "call_ids": t.call_ids,
            "segment_reason": t.segment_reason}
