"""TRL: the dict a GRPO ``rollout_func(prompts, trainer)`` returns.

Required keys, one entry per completion, in ``num_generations`` blocks per prompt (TRL's
groups are implicit in the order): ``prompt_ids`` (the first prompt), ``completion_ids``
(everything after it: sampled turns and environment tokens), ``logprobs`` (aligned to
``completion_ids``, 0.0 on environment tokens) and ``env_mask`` (1 = model token, 0 =
environment token). TRL pads prompts left and completions right itself. Every other key is
forwarded to the reward functions: ``reward``, ``rewards`` (named), ``group_id``,
``sample_index``, ``session_id``, ``versions``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import group_indices, split


def order_by_group(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """Groups in order of first appearance, members by sample index: TRL's block order."""
    idx, _ = group_indices(trajs)
    order = sorted(range(len(trajs)), key=lambda i: (
        idx[i], trajs[i].sample_index is None, trajs[i].sample_index or 0, i))
    return [trajs[i] for i in order]


def to_trl_rollout(trajs: Sequence[Trajectory], num_generations: int | None = None,
                   fill_logprob: float | None = None) -> dict:
    """``rollout_func`` output; with ``num_generations`` also checks that every group has
    exactly that many samples (TRL relies on it to form groups)."""
    ordered = order_by_group(trajs)
    if num_generations is not None:
        idx, keys = group_indices(ordered)
        counts = np.bincount(idx, minlength=len(keys)) if idx else np.zeros(0, int)
        bad = [k for k, c in zip(keys, counts, strict=True) if c != num_generations]
        if bad:
            raise ValueError(f"groups {bad[:3]} do not have num_generations="
                             f"{num_generations} samples")
    out: dict[str, list] = {k: [] for k in (
        "prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "rewards",
        "group_id", "sample_index", "session_id", "versions")}
    for t in ordered:
        p, r, m, lp, v = split(t, fill_logprob)
        out["prompt_ids"].append(p.tolist())
        out["completion_ids"].append(r.tolist())
        out["logprobs"].append(lp.astype(np.float64).tolist())
        out["env_mask"].append(m.astype(np.int64).tolist())
        out["reward"].append(t.reward)
        out["rewards"].append(dict(t.rewards))
        out["group_id"].append(t.group_id)
        out["sample_index"].append(t.sample_index)
        out["session_id"].append(t.session_id)
        out["versions"].append(v.tolist())
    return out
