"""SkyRL: a ``GeneratorOutput`` (TypedDict of parallel lists).

Targets SkyRL 0.4.0 (PyPI ``skyrl``; ``skyrl/train/generators/base.py``,
``validate_generator_output`` / ``_validate_step_wise_fields`` in
``skyrl/train/utils/trainer_utils.py``; same at ``a956457``).

Merged (default): one row per trajectory: ``prompt_token_ids`` (the first prompt),
``response_ids`` (sampled turns + observations), ``loss_masks`` (observations 0),
``rollout_logprobs`` (response aligned, 0.0 on observations), ``rewards`` (the raw reward, a
float per row or per-token lists with it on the last token: SkyRL computes advantages, GRPO
grouped by ``TrajectoryID.instance_id``), ``stop_reasons``, ``trajectory_ids``,
``rollout_metrics``.

``trajectory_ids``: ``TrajectoryID(instance_id, repetition_id)``. ``instance_id`` is the GRPO
group (``group_id``; a session without one is a group of its own); ``repetition_id`` is the
sample index when every session of the group has a distinct one, else the sessions are
numbered 0.. in (sample index, first appearance) order. One session = one id, so two sessions
never share one.

Step-wise (``step_wise=True``, from ``per_call`` samples): one row per call, a session's
calls contiguous and in recorded order (``seq``), ``is_last_step`` True at each session's last
call, and only that step's last token carries the reward: the invariants SkyRL's
``_validate_step_wise_fields`` checks (:func:`check_step_wise` checks them here, and those of
``validate_generator_output``).

Every reward must be posted (ValueError otherwise). ``rollout_metrics`` reports
``logprob_filled_tokens``: how many logprobs the engine did not report and hold
``fill_logprob``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    batch_routing,
    check_behaviour,
    filled_positions,
    finish_reason,
    require_rewards,
    split,
)


@dataclass(frozen=True)
class TrajectoryID:
    """Same fields as SkyRL's: the task instance (GRPO group) and which repetition of it."""

    instance_id: str
    repetition_id: int

    def to_string(self) -> str:
        return f"{self.instance_id}_{self.repetition_id}"


def trajectory_ids(trajs: Sequence[Trajectory]) -> dict[str, TrajectoryID]:
    """One unique ``TrajectoryID`` per session of ``trajs``."""
    groups: dict[str, dict[str, int | None]] = {}
    for t in trajs:
        instance = t.group_id if t.group_id is not None else f"session:{t.session_id}"
        groups.setdefault(instance, {}).setdefault(t.session_id, t.sample_index)
    out = {}
    for instance, sessions in groups.items():
        idx = list(sessions.values())
        if None not in idx and len(set(idx)) == len(idx):
            reps = dict(sessions)
        else:
            order = sorted(range(len(idx)), key=lambda i: (idx[i] is None, idx[i] or 0, i))
            names = list(sessions)
            reps = {names[i]: n for n, i in enumerate(order)}
        for sid, rep in reps.items():
            out[sid] = TrajectoryID(instance, int(rep))  # type: ignore[arg-type]
    seen: dict[str, str] = {}
    for sid, tid in out.items():
        if seen.setdefault(tid.to_string(), sid) != sid:
            raise ValueError(
                f"SkyRL: sessions {seen[tid.to_string()]} and {sid} would share "
                f"trajectory id {tid.to_string()!r}"
            )
    return out


def _seq(t: Trajectory) -> int | None:
    return t.turns[-1].get("seq") if t.turns else None


def to_skyrl_generator_output(
    trajs: Sequence[Trajectory],
    step_wise: bool = False,
    per_token_rewards: bool = False,
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> dict:
    check_behaviour(trajs, "SkyRL", inexact)
    rows = list(trajs)
    last = [True] * len(rows)
    if step_wise:
        if any(t.mode != "per_call" for t in rows):
            raise ValueError("step_wise needs per_call samples (trajectories(mode='per_call'))")
        if any(_seq(t) is None for t in rows):
            raise ValueError(
                "step_wise needs each call's recorded seq (turns[i]['seq']); "
                "these samples predate it"
            )
        # Contiguous per session (sessions in order of first appearance), calls by seq.
        first_seen: dict[str, int] = {}
        for i, t in enumerate(rows):
            first_seen.setdefault(t.session_id, i)
        rows = sorted(rows, key=lambda t: (first_seen[t.session_id], _seq(t)))
        last = [
            i + 1 == len(rows) or rows[i + 1].session_id != t.session_id for i, t in enumerate(rows)
        ]
    rewards = require_rewards(rows, "SkyRL")
    ids = trajectory_ids(rows)
    cols: dict[str, list] = {
        k: []
        for k in (
            "prompt_token_ids",
            "response_ids",
            "rewards",
            "loss_masks",
            "stop_reasons",
            "rollout_logprobs",
            "trajectory_ids",
        )
    }
    filled = 0
    for t, is_last, rw in zip(rows, last, rewards, strict=True):
        p, r, m, lp, _ = split(t, fill_logprob)
        if not len(r):
            raise ValueError(f"SkyRL: sample {t.id} has an empty response")
        if fill_logprob is not None:
            filled += len(filled_positions(t, t.prompt_len))
        reward = rw if is_last else 0.0
        cols["prompt_token_ids"].append(p.tolist())
        cols["response_ids"].append(r.tolist())
        cols["loss_masks"].append(m.astype(np.int64).tolist())
        cols["rollout_logprobs"].append(lp.astype(np.float64).tolist())
        if per_token_rewards:
            per_tok = [0.0] * len(r)
            per_tok[-1] = reward
            cols["rewards"].append(per_tok)
        else:
            cols["rewards"].append(reward)
        cols["stop_reasons"].append(finish_reason(t))
        cols["trajectory_ids"].append(ids[t.session_id])
    out: dict[str, object] = dict(cols)
    out["is_last_step"] = [bool(x) for x in last] if step_wise else None
    out["rollout_metrics"] = {"logprob_filled_tokens": filled}
    routing = batch_routing(rows, "SkyRL")
    # [batch, seq_len (prompt + response), layers, k], as SkyRL's router replay reads it
    out["rollout_expert_indices"] = None if routing is None else [r.tolist() for r in routing]
    return out


def check_step_wise(out: dict) -> None:
    """SkyRL's ``validate_generator_output`` + ``_validate_step_wise_fields`` invariants;
    raises ValueError naming the first one broken."""
    resp = out.get("response_ids") or []
    n = len(resp)
    if not n:
        raise ValueError("no outputs")
    for k in (
        "prompt_token_ids",
        "loss_masks",
        "rewards",
        "rollout_logprobs",
        "stop_reasons",
        "trajectory_ids",
        "is_last_step",
    ):
        v = out.get(k)
        if v is None and k in ("trajectory_ids", "is_last_step"):
            raise ValueError(f"step-wise output needs {k}")
        if isinstance(v, list) and len(v) != n:
            raise ValueError(f"{k} has {len(v)} rows, response_ids {n}")
    rewards = out["rewards"]
    if len({isinstance(rw, list) for rw in rewards}) > 1:
        raise ValueError("rewards must be all floats or all per-token lists")
    for i, r in enumerate(resp):
        if len(out["loss_masks"][i]) != len(r):
            raise ValueError(f"row {i}: loss mask length differs from the response")
        if out.get("rollout_logprobs") and len(out["rollout_logprobs"][i]) != len(r):
            raise ValueError(f"row {i}: logprobs length differs from the response")
        if isinstance(rewards[i], list) and len(rewards[i]) != len(r):
            raise ValueError(f"row {i}: per-token rewards length differs from the response")
    last, ids = out["is_last_step"], out["trajectory_ids"]
    if any(x is not True and x is not False for x in last):
        raise ValueError("is_last_step must hold Python bools")
    if last[-1] is not True:
        raise ValueError("is_last_step[-1] must be True")
    keys = [tid.to_string() if hasattr(tid, "to_string") else str(tid) for tid in ids]
    seen: set[str] = set()
    for i, k in enumerate(keys):
        if i and k != keys[i - 1]:
            if k in seen:
                raise ValueError(f"trajectory {k} is not contiguous (row {i})")
        seen.add(k)
    for i in range(n - 1):
        boundary = keys[i] != keys[i + 1]
        if boundary and last[i] is not True:
            raise ValueError(
                f"trajectory id changes after row {i} but is_last_step[{i}] is not True"
            )
        if not boundary and last[i] is True:
            raise ValueError(f"is_last_step[{i}] is True but trajectory {keys[i]} continues")
    for i, rw in enumerate(rewards):
        if isinstance(rw, list):
            if any(rw[:-1]) or (not last[i] and rw and rw[-1]):
                raise ValueError(f"row {i}: only the last step's last token carries reward")
        elif not last[i] and rw:
            raise ValueError(f"row {i}: only the last step carries reward")
