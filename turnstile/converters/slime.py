"""slime / Miles: ``Sample`` dicts and the ``train_data`` dict built from them.

``Sample``: ``tokens`` (prompt + response, full), ``response_length``, ``loss_mask`` and
``rollout_log_probs`` (both of length ``response_length``), ``reward`` (float, or the named
dict with ``reward_key``), ``weight_versions`` (one string per engine call that reported
one), ``group_index`` / ``index`` (ints: the group's position in the batch and the sample's),
``rollout_id`` (int; samples of one session share it), ``status`` (``completed`` or
``truncated``), ``prompt``/``response`` text when a tokenizer is given, and ``metadata`` with
Turnstile's string ids (session, group, sample index, task) and per-token versions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import group_indices, ids_meta, reward_of, split


def to_slime_samples(trajs: Sequence[Trajectory],
                     decode: Callable[[list[int]], str] | None = None,
                     reward_key: bool = False, fill_logprob: float | None = None
                     ) -> list[dict]:
    """``decode`` (e.g. ``tokenizer.decode``) fills ``prompt``/``response`` text."""
    gidx, _ = group_indices(trajs)
    sessions: dict[str, int] = {}
    out = []
    for i, t in enumerate(trajs):
        p, r, m, lp, v = split(t, fill_logprob)
        finish = t.turns[-1]["finish_reason"] if t.turns else None
        out.append({
            "group_index": gidx[i], "index": i,
            "rollout_id": sessions.setdefault(t.session_id, len(sessions)),
            "session_id": t.session_id,
            "prompt": decode(p.tolist()) if decode else "",
            "tokens": t.token_ids.tolist(),
            "response": decode(r.tolist()) if decode else "",
            "response_length": len(r),
            "label": None,
            "reward": dict(t.rewards) if reward_key else reward_of(t),
            "loss_mask": m.astype(np.int64).tolist(),
            "weight_versions": [w for w in t.weight_versions if w is not None],
            "rollout_log_probs": lp.astype(np.float64).tolist(),
            "status": "truncated" if finish == "length" else "completed",
            "metadata": {**ids_meta(t), "versions": v.tolist()},
        })
    return out


def to_slime_train_data(samples: Sequence[dict]) -> dict:
    """The dict slime's rollout manager hands the trainer (lists, one entry per sample)."""
    rewards = [s["reward"] if not isinstance(s["reward"], dict) else
               s["reward"].get("reward", sum(s["reward"].values())) for s in samples]
    return {
        "tokens": [s["tokens"] for s in samples],
        "response_lengths": [s["response_length"] for s in samples],
        "rewards": rewards,
        "raw_reward": list(rewards),
        "truncated": [int(s["status"] == "truncated") for s in samples],
        "sample_indices": [s["index"] for s in samples],
        "rollout_ids": [s["rollout_id"] for s in samples],
        "loss_masks": [s["loss_mask"] for s in samples],
        "rollout_log_probs": [s["rollout_log_probs"] for s in samples],
    }
