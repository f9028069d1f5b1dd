"""OpenRLHF: agent-executor outputs and the shifted experience tensors.

``AgentExecutorBase.execute`` returns, per rollout: ``observation_tokens`` (the full sequence),
``action_ranges`` (half-open ``[start, end)`` runs of sampled tokens), ``rollout_log_probs``
(full length, 0.0 on non-actions), ``reward``, ``scores``, ``extra_logs``. OpenRLHF's
experience then shifts by one: position ``i`` of ``action_mask`` / ``rollout_log_probs`` is
about *predicting* token ``i + 1`` (logits at ``i``), so both are ``[:, 1:]`` of the token-level
arrays and have length ``T - 1``. :func:`to_openrlhf_experience` does that shift.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import action_ranges, ids_meta, logprobs, pad, reward_of


def to_openrlhf_samples(trajs: Sequence[Trajectory], fill_logprob: float | None = None
                        ) -> list[dict]:
    out = []
    for t in trajs:
        reward = reward_of(t)
        out.append({
            "prompt": "", "label": t.task_id,
            "observation_tokens": t.token_ids.tolist(),
            "action_ranges": action_ranges(t.loss_mask),
            "rollout_log_probs": logprobs(t, fill_logprob).astype(np.float64).tolist(),
            "reward": reward, "scores": reward,
            "extra_logs": {**ids_meta(t), "versions": t.versions.tolist()},
        })
    return out


def to_openrlhf_experience(trajs: Sequence[Trajectory], pad_token_id: int,
                           fill_logprob: float | None = None) -> dict[str, np.ndarray]:
    """``sequences [B, T]`` (right-padded), ``attention_mask [B, T]``, ``action_mask [B, T-1]``
    and ``rollout_log_probs [B, T-1]`` (both ``[:, 1:]``: shifted to the predicting position),
    ``rewards [B]``."""
    T = max((len(t.token_ids) for t in trajs), default=1)
    seqs = pad([t.token_ids for t in trajs], T, pad_token_id, False, np.int64)
    attn = pad([np.ones(len(t.token_ids)) for t in trajs], T, 0, False, np.int64)
    mask = pad([t.loss_mask for t in trajs], T, 0, False, np.bool_)
    lps = pad([logprobs(t, fill_logprob) for t in trajs], T, 0.0, False, np.float32)
    return {"sequences": seqs, "attention_mask": attn, "action_mask": mask[:, 1:],
            "rollout_log_probs": lps[:, 1:],
            "rewards": np.array([reward_of(t) for t in trajs], dtype=np.float32)}
