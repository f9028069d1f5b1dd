"""SkyRL: a ``GeneratorOutput`` (TypedDict of parallel lists).

Merged (default): one row per trajectory: ``prompt_token_ids`` (the first prompt),
``response_ids`` (sampled turns + observations), ``loss_masks`` (observations 0),
``rollout_logprobs`` (response aligned, 0.0 on observations), ``rewards`` (a float per row, or
per-token lists with the reward on the last token), ``stop_reasons``, ``trajectory_ids``
(``TrajectoryID(instance_id, repetition_id)``), ``rollout_metrics``.

Step-wise (``step_wise=True``, from ``per_call`` samples): one row per call, a trajectory's
steps contiguous, ``is_last_step`` True at each trajectory's last step, and only that step's
last token carries the reward: the invariants SkyRL's ``_validate_step_wise_fields`` checks
(:func:`check_step_wise` checks them here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..store.trajectories import Trajectory
from ._common import reward_of, split


@dataclass(frozen=True)
class TrajectoryID:
    """Same fields as SkyRL's: the task instance and which repetition of it."""

    instance_id: str
    repetition_id: int

    def to_string(self) -> str:
        return f"{self.instance_id}_{self.repetition_id}"


def trajectory_id(t: Trajectory) -> TrajectoryID:
    instance = t.task_id or t.group_id or t.session_id
    return TrajectoryID(str(instance), int(t.sample_index or 0))


def to_skyrl_generator_output(trajs: Sequence[Trajectory], step_wise: bool = False,
                              per_token_rewards: bool = False,
                              fill_logprob: float | None = None) -> dict:
    rows = list(trajs)
    last = [True] * len(rows)
    if step_wise:
        if any(t.mode != "per_call" for t in rows):
            raise ValueError("step_wise needs per_call samples (trajectories(mode='per_call'))")
        # Contiguous per session, calls in recorded order.
        first_seen: dict[str, int] = {}
        for i, t in enumerate(rows):
            first_seen.setdefault(t.session_id, i)
        rows = sorted(rows, key=lambda t: first_seen[t.session_id])
        last = [i + 1 == len(rows) or rows[i + 1].session_id != t.session_id
                for i, t in enumerate(rows)]
    out: dict[str, list | None] = {k: [] for k in (
        "prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons",
        "rollout_logprobs", "trajectory_ids")}
    for t, is_last in zip(rows, last, strict=True):
        p, r, m, lp, _ = split(t, fill_logprob)
        reward = reward_of(t) if is_last else 0.0
        out["prompt_token_ids"].append(p.tolist())
        out["response_ids"].append(r.tolist())
        out["loss_masks"].append(m.astype(np.int64).tolist())
        out["rollout_logprobs"].append(lp.astype(np.float64).tolist())
        if per_token_rewards:
            per_tok = [0.0] * len(r)
            if per_tok:
                per_tok[-1] = reward
            out["rewards"].append(per_tok)
        else:
            out["rewards"].append(reward)
        out["stop_reasons"].append(t.turns[-1]["finish_reason"] if t.turns else None)
        out["trajectory_ids"].append(trajectory_id(t))
    out["is_last_step"] = last if step_wise else None
    out["rollout_metrics"] = {}
    out["rollout_expert_indices"] = None
    return out


def check_step_wise(out: dict) -> None:
    """SkyRL's step-wise invariants; raises ValueError naming the first one broken."""
    last, ids = out["is_last_step"], out["trajectory_ids"]
    if not last or not last[-1]:
        raise ValueError("is_last_step[-1] must be True")
    seen = set()
    for i in range(len(ids)):
        if i and ids[i] != ids[i - 1]:
            if not last[i - 1]:
                raise ValueError(f"trajectory id changes at row {i} but is_last_step[{i - 1}]"
                                 " is False")
            if ids[i] in seen:
                raise ValueError(f"trajectory {ids[i]} is not contiguous")
        seen.add(ids[i])
    for i, rw in enumerate(out["rewards"]):
        if isinstance(rw, list):
            if any(rw[:-1]) or (not last[i] and rw and rw[-1]):
                raise ValueError(f"row {i}: only the last step's last token carries reward")
        elif not last[i] and rw:
            raise ValueError(f"row {i}: only the last step carries reward")
