"""prime-rl and verifiers.

prime-rl ``TrainingSample`` (msgspec, here a dict): ``token_ids`` (full sequence), ``mask``
(bools, True on sampled tokens), ``logprobs`` (full length, 0.0 off-mask; no shift),
``temperatures`` (per token: the sampling temperature of the call whose prompt or completion
holds the token), ``env_name``, ``advantages`` (per token if given), ``ref_logprobs`` None.

verifiers ``TrajectoryStep`` tokens (legacy, one per call; use ``per_call`` samples):
``prompt_ids``/``prompt_mask`` (0), ``completion_ids``/``completion_mask``/
``completion_logprobs``, ``overlong_prompt``, ``is_truncated``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import ids_meta, logprobs, reward_of, split


def temperatures(t: Trajectory, default: float = 1.0) -> np.ndarray:
    """Per-token sampling temperature (float32, ``[T]``)."""
    out = np.full(len(t.token_ids), default, dtype=np.float32)
    start = 0
    for turn in t.turns:
        temp = turn.get("temperature")
        out[start:turn["completion_end"]] = default if temp is None else temp
        start = turn["completion_end"]
    return out


def to_prime_rl_samples(trajs: Sequence[Trajectory], env_name: str | None = None,
                        advantages: Sequence[float] | None = None,
                        fill_logprob: float | None = None) -> list[dict]:
    out = []
    for i, t in enumerate(trajs):
        adv = None
        if advantages is not None:
            adv = (t.loss_mask.astype(np.float32) * np.float32(advantages[i])).tolist()
        out.append({
            "token_ids": t.token_ids.tolist(),
            "mask": t.loss_mask.astype(bool).tolist(),
            "logprobs": logprobs(t, fill_logprob).astype(np.float64).tolist(),
            "temperatures": temperatures(t).astype(np.float64).tolist(),
            "env_name": env_name or t.metadata.get("env_name") or t.task_id or "turnstile",
            "advantages": adv, "ref_logprobs": None,
            "reward": reward_of(t), "extras": ids_meta(t),
        })
    return out


def to_verifiers_steps(trajs: Sequence[Trajectory], fill_logprob: float | None = None
                       ) -> list[dict]:
    """``TrajectoryStep``-shaped dicts (``tokens`` = ``TrajectoryStepTokens``)."""
    out = []
    for t in trajs:
        p, r, m, lp, _ = split(t, fill_logprob)
        finish = t.turns[-1]["finish_reason"] if t.turns else None
        reward = t.turns[-1].get("reward") if t.mode == "per_call" and t.turns else None
        out.append({
            "prompt": None, "completion": None, "response": None,
            "tokens": {"prompt_ids": p.tolist(), "prompt_mask": [0] * len(p),
                       "completion_ids": r.tolist(),
                       "completion_mask": m.astype(np.int64).tolist(),
                       "completion_logprobs": lp.astype(np.float64).tolist(),
                       "overlong_prompt": False, "is_truncated": finish == "length"},
            "reward": reward if reward is not None else t.reward,
            "advantage": None, "is_truncated": finish == "length",
            "trajectory_id": t.session_id, "extras": ids_meta(t),
        })
    return out
