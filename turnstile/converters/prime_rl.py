"""prime-rl and (legacy) verifiers.

prime-rl ``TrainingSample``: targets prime-rl at ``559b447`` (not on PyPI; msgspec struct in
``src/prime_rl/transports/rollouts/types.py``). Each dict has exactly its fields, so
``TrainingSample(**d)`` takes it: ``token_ids`` (full sequence), ``mask`` (bools, True on
sampled tokens), ``logprobs`` (full length, 0.0 off-mask; no shift), ``temperatures`` (per
token: the sampling temperature of the call whose prompt or completion holds the token),
``env_name``, ``advantages`` (per token, full length: the sample's advantage on sampled
tokens, 0 elsewhere; prime-rl's trainer rejects ``None`` on trainable tokens). Default
advantages are prime-rl's GRPO credit: reward minus the group's mean reward (no std
division); every sample then needs a reward (ValueError otherwise). Turnstile's ids, rewards
and the logprobs the engine did not report (filled with ``fill_logprob``) have no slot there:
:func:`~turnstile.converters._common.filled_positions` lists the latter.

verifiers ``TrajectoryStep`` tokens: the legacy verifiers types (before 0.4, which replaced
them with the v1 ``Trace`` graph), one per call (use ``per_call`` samples): ``prompt_ids``/
``prompt_mask`` (0), ``completion_ids``/``completion_mask``/``completion_logprobs``,
``overlong_prompt``, ``is_truncated``, ``routed_experts`` (None: not recorded).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    check_behaviour,
    finish_reason,
    grpo_advantages,
    ids_meta,
    logprobs,
    split,
)


def temperatures(t: Trajectory, default: float = 1.0) -> np.ndarray:
    """Per-token sampling temperature (float32, ``[T]``)."""
    out = np.full(len(t.token_ids), default, dtype=np.float32)
    start = 0
    for turn in t.turns:
        temp = turn.get("temperature")
        out[start : turn["completion_end"]] = default if temp is None else temp
        start = turn["completion_end"]
    return out


def to_prime_rl_samples(
    trajs: Sequence[Trajectory],
    env_name: str | None = None,
    advantages: Sequence[float] | None = None,
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> list[dict]:
    """``advantages``: one per sample; default: reward minus the group mean."""
    check_behaviour(trajs, "prime-rl", inexact)
    adv = np.asarray(
        advantages if advantages is not None else grpo_advantages(trajs, scale=False),
        dtype=np.float32,
    )
    if len(adv) != len(trajs):
        raise ValueError(f"{len(adv)} advantages for {len(trajs)} samples")
    out = []
    for t, a in zip(trajs, adv, strict=True):
        out.append(
            {
                "token_ids": t.token_ids.tolist(),
                "mask": t.loss_mask.astype(bool).tolist(),
                "logprobs": logprobs(t, fill_logprob).astype(np.float64).tolist(),
                "temperatures": temperatures(t).astype(np.float64).tolist(),
                "env_name": env_name or t.metadata.get("env_name") or t.task_id or "turnstile",
                "advantages": (t.loss_mask.astype(np.float32) * a).astype(np.float64).tolist(),
            }
        )
    return out


def to_verifiers_steps(
    trajs: Sequence[Trajectory],
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> list[dict]:
    """``TrajectoryStep``-shaped dicts (``tokens`` = ``TrajectoryStepTokens``)."""
    check_behaviour(trajs, "prime-rl", inexact)
    out = []
    for t in trajs:
        p, r, m, lp, _ = split(t, fill_logprob)
        truncated = finish_reason(t) == "length"
        reward = t.turns[-1].get("reward") if t.mode == "per_call" and t.turns else None
        out.append(
            {
                "prompt": None,
                "completion": None,
                "response": None,
                "tokens": {
                    "prompt_ids": p.tolist(),
                    "prompt_mask": [0] * len(p),
                    "completion_ids": r.tolist(),
                    "completion_mask": m.astype(np.int64).tolist(),
                    "completion_logprobs": lp.astype(np.float64).tolist(),
                    "overlong_prompt": False,
                    "is_truncated": truncated,
                    "routed_experts": None,
                },
                "reward": reward if reward is not None else t.reward,
                "advantage": None,
                "is_truncated": truncated,
                "trajectory_id": t.session_id,
                "extras": ids_meta(t),
            }
        )
    return out
