"""TRL: the dict a GRPO ``rollout_func(prompts, trainer)`` returns.

Targets TRL 1.16.0 (``GRPOTrainer._generate``: ``rollout_func`` output needs ``prompt_ids``,
``completion_ids``, ``logprobs``; ``env_mask`` is taken as the tool mask; every other key is
merged into the *i*-th input row handed to the reward functions).

One entry per completion, **in the order of the ``prompts`` TRL passed to ``rollout_func``**:
TRL pairs output *i* with its *i*-th input row (and so with that row's dataset columns and
its group of ``num_generations``) by position alone. Give ``prompt_keys`` (one per entry of
``prompts``, e.g. each row's task id) and the samples are put in that order and checked: each
key must have exactly as many samples as it appears, matched on ``key`` (``"task_id"`` or
``"group_id"``), members by sample index. Without ``prompt_keys`` samples are put in group
blocks (groups in order of first appearance) and, with ``num_generations``, each group must
have exactly that many; the caller then vouches that this is the order of ``prompts``.

Keys: ``prompt_ids`` (the first prompt), ``completion_ids`` (everything after it: sampled
turns and environment tokens), ``logprobs`` (aligned to ``completion_ids``, 0.0 on
environment tokens), ``env_mask`` (1 = model token, 0 = environment token); forwarded to the
reward functions: ``reward`` (raw, or None when not posted: TRL's reward functions compute
rewards, then TRL normalises per group), ``rewards`` (named), ``group_id``, ``sample_index``,
``session_id``, ``task_id``, ``versions``, ``logprob_filled`` (completion positions whose
logprob the engine did not report and that hold ``fill_logprob``).

Images: on the ``rollout_func`` path TRL 1.16 takes the pixels for its forward pass from the
dataset rows' ``images`` (or ``image``) column, re-processed with the prompt
(``GRPOTrainer._generate_and_score_completions``: ``processing_class(images=..., text=...)``);
nothing ``rollout_func`` returns reaches the model as pixels. So a sample's images must all
sit in its prompt and be its dataset row's images, in order: ``image_sha256`` (per sample,
the hashes in block order) lets the caller check that, and a sample with an image after its
prompt (a tool result's screenshot) raises ValueError (TRL's own tool loop is the only path
that feeds such images; verl's and slime's converters carry them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    check_behaviour,
    filled_positions,
    group_indices,
    order_by_group,
    split,
)

KEYS = ("task_id", "group_id")


def order_for_prompts(
    trajs: Sequence[Trajectory], prompt_keys: Sequence[str], key: str = "task_id"
) -> list[Trajectory]:
    """The samples in the order of ``prompt_keys`` (TRL's ``prompts``, one key per entry);
    raises ValueError unless every key has exactly as many samples as entries."""
    if key not in KEYS:
        raise ValueError(f"key must be one of {KEYS}, not {key!r}")
    pools: dict[str, list[Trajectory]] = {}
    for t in order_by_group(trajs):
        k = getattr(t, key)
        if k is None:
            raise ValueError(
                f"TRL: sample {t.id} (session {t.session_id}) has no {key}; "
                "it cannot be matched to a prompt"
            )
        pools.setdefault(str(k), []).append(t)
    need: dict[str, int] = {}
    for k in prompt_keys:
        need[str(k)] = need.get(str(k), 0) + 1
    bad = {
        k: (need.get(k, 0), len(pools.get(k, [])))
        for k in set(need) | set(pools)
        if need.get(k, 0) != len(pools.get(k, []))
    }
    if bad:
        shown = ", ".join(
            f"{k!r}: {n} prompt(s) vs {m} sample(s)" for k, (n, m) in sorted(bad.items())[:3]
        )
        raise ValueError(
            f"TRL pairs outputs with prompts by position; the samples do not "
            f"match prompt_keys ({shown})"
        )
    taken = {k: 0 for k in pools}
    out = []
    for k in map(str, prompt_keys):
        out.append(pools[k][taken[k]])
        taken[k] += 1
    return out


def to_trl_rollout(
    trajs: Sequence[Trajectory],
    num_generations: int | None = None,
    fill_logprob: float | None = DEFAULT_FILL,
    prompt_keys: Sequence[str] | None = None,
    key: str = "task_id",
    inexact: str = "warn",
) -> dict:
    """``rollout_func`` output (see the module docstring for the order)."""
    check_behaviour(trajs, "TRL", inexact)
    if prompt_keys is not None:
        ordered = order_for_prompts(trajs, prompt_keys, key)
    else:
        ordered = order_by_group(trajs)
    if num_generations is not None:
        idx, keys = group_indices(ordered)
        counts = np.bincount(idx, minlength=len(keys)) if idx else np.zeros(0, int)
        bad = [k for k, c in zip(keys, counts, strict=True) if c != num_generations]
        if bad:
            raise ValueError(
                f"groups {bad[:3]} do not have num_generations={num_generations} samples"
            )
    out: dict[str, list] = {
        k: []
        for k in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "reward",
            "rewards",
            "group_id",
            "sample_index",
            "session_id",
            "task_id",
            "versions",
            "logprob_filled",
            "image_sha256",
        )
    }
    for t in ordered:
        p, r, m, lp, v = split(t, fill_logprob)
        late = [im for im in t.images if im["offset"] + im["length"] > t.prompt_len]
        if late:
            raise ValueError(
                f"TRL: sample {t.id} has an image at token {late[0]['offset']}, after its "
                f"prompt ({t.prompt_len} tokens): TRL 1.16's rollout_func path feeds its "
                "model only the dataset row's images with the prompt; train it with the "
                "verl or slime converter"
            )
        out["image_sha256"].append(
            [im["sha256"] for im in sorted(t.images, key=lambda i: i["offset"])]
        )
        out["prompt_ids"].append(p.tolist())
        out["completion_ids"].append(r.tolist())
        out["logprobs"].append(lp.astype(np.float64).tolist())
        out["env_mask"].append(m.astype(np.int64).tolist())
        out["reward"].append(None if t.reward is None else float(t.reward))
        out["rewards"].append(dict(t.rewards))
        out["group_id"].append(t.group_id)
        out["sample_index"].append(t.sample_index)
        out["session_id"].append(t.session_id)
        out["task_id"].append(t.task_id)
        out["versions"].append(v.tolist())
        out["logprob_filled"].append(
            filled_positions(t, t.prompt_len) if fill_logprob is not None else []
        )
    return out
