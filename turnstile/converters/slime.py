"""slime / Miles: ``Sample`` dicts and the ``train_data`` dict built from them.

Targets slime at ``624b824`` (THUDM/slime; not on PyPI: ``Sample`` in
``slime/utils/types.py``, ``RolloutManager._post_process_rewards`` and
``_convert_samples_to_train_data`` in ``slime/ray/rollout.py``).

``Sample`` (``Sample(**d)`` takes these keys once ``status`` is made a ``Sample.Status``):
``tokens`` (prompt + response, full), ``response_length``, ``loss_mask`` and
``rollout_log_probs`` (both of length ``response_length``), ``reward`` (the raw float, or the
named dict with ``reward_key``), ``weight_versions`` (one string per engine call that reported
one), ``group_index`` / ``index`` (ints: the group's position in the batch and the sample's),
``rollout_id`` (int; samples of one session share it), ``session_id``, ``status``
(``completed`` or ``truncated``), ``prompt``/``response`` text when a tokenizer is given, and
``metadata`` with Turnstile's string ids, per-token versions and ``logprob_filled`` (response
positions whose logprob the engine did not report and that hold ``fill_logprob``). Samples
come group-contiguous (slime reshapes rewards by ``n_samples_per_prompt``); every sample needs
a reward (ValueError otherwise).

``train_data``: slime normalises rewards per group for ``grpo``/``gspo``/``cispo`` (subtract
the group mean, divide by the *sample* std + 1e-6 when ``grpo_std_normalization``) and
``reinforce_plus_plus_baseline`` (mean only); ``rewards`` holds that, ``raw_reward`` the raw
ones. ``rollout_mask_sums`` is, per sample, the sum of the loss mask over every sample of its
rollout (slime's per-rollout loss denominator).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    ImageBytes,
    batch_routing,
    check_behaviour,
    filled_positions,
    finish_reason,
    group_indices,
    ids_meta,
    order_by_group,
    pil_images,
    require_rewards,
    split,
)

GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALISED = ("grpo", "gspo", "cispo")


def to_slime_samples(
    trajs: Sequence[Trajectory],
    decode: Callable[[list[int]], str] | None = None,
    reward_key: bool = False,
    fill_logprob: float | None = DEFAULT_FILL,
    image_bytes: ImageBytes | None = None,
    inexact: str = "warn",
) -> list[dict]:
    """``decode`` (e.g. ``tokenizer.decode``) fills ``prompt``/``response`` text. A sample
    with images gets ``multimodal_inputs`` ``{"images": [PIL images]}`` in the order of
    their blocks in ``tokens`` (what slime's rollout keeps and hands its processor), read by
    ``image_bytes(session_id, sha256)`` (``Client.image``), and their spans in
    ``metadata["images"]``."""
    check_behaviour(trajs, "slime", inexact)
    ordered = order_by_group(trajs)
    require_rewards(ordered, "slime")
    gidx, _ = group_indices(ordered)
    routing = batch_routing(ordered, "slime")
    sessions: dict[str, int] = {}
    out = []
    for i, t in enumerate(ordered):
        p, r, m, lp, v = split(t, fill_logprob)
        images = pil_images(t, image_bytes, "slime")
        out.append(
            {
                "group_index": gidx[i],
                "index": i,
                "rollout_id": sessions.setdefault(t.session_id, len(sessions)),
                "session_id": t.session_id,
                "prompt": decode(p.tolist()) if decode else "",
                "tokens": t.token_ids.tolist(),
                "response": decode(r.tolist()) if decode else "",
                "response_length": len(r),
                "label": None,
                "reward": dict(t.rewards) if reward_key else float(t.reward),  # type: ignore
                "loss_mask": m.astype(np.int64).tolist(),
                "weight_versions": [w for w in t.weight_versions if w is not None],
                "rollout_log_probs": lp.astype(np.float64).tolist(),
                "status": "truncated" if finish_reason(t) == "length" else "completed",
                # [len(tokens) - 1, layers, k] int32, as slime decodes SGLang's rows
                **(
                    {"rollout_routed_experts": routing[i][:-1].astype(np.int32)}
                    if routing is not None
                    else {}
                ),
                **({"multimodal_inputs": {"images": images}} if images else {}),
                "metadata": {
                    **ids_meta(t),
                    "versions": v.tolist(),
                    "logprob_filled": filled_positions(t, t.prompt_len)
                    if fill_logprob is not None
                    else [],
                    **({"images": list(t.images)} if t.images else {}),
                },
            }
        )
    return out


def _reward(s: dict, reward_key: str | None) -> float:
    r = s["reward"]
    if isinstance(r, dict):
        if reward_key is None:
            raise ValueError("samples carry named rewards; pass reward_key=")
        if reward_key not in r:
            raise ValueError(f"sample {s['index']} has no reward named {reward_key!r}")
        return float(r[reward_key])
    if r is None:
        raise ValueError(f"sample {s['index']} has no reward")
    return float(r)


def normalised_rewards(
    samples: Sequence[dict],
    advantage_estimator: str = "grpo",
    rewards_normalization: bool = True,
    grpo_std_normalization: bool = True,
    reward_key: str | None = None,
) -> tuple[list[float], list[float]]:
    """``(raw, rewards)`` as slime's ``_post_process_rewards`` gives them, per group."""
    raw = [_reward(s, reward_key) for s in samples]
    if advantage_estimator not in GROUP_NORMALISED or not rewards_normalization:
        return raw, list(raw)
    r = np.array(raw, dtype=np.float64)
    g = np.array([s["group_index"] for s in samples])
    out = np.zeros_like(r)
    for k in dict.fromkeys(g.tolist()):
        sel = g == k
        centred = r[sel] - r[sel].mean()
        if advantage_estimator in STD_NORMALISED and grpo_std_normalization:
            # torch.std: the sample (unbiased) std; one sample gives NaN there, 0 here.
            std = r[sel].std(ddof=1) if sel.sum() > 1 else 0.0
            centred = centred / (std + 1e-6)
        out[sel] = centred
    return raw, out.astype(np.float32).astype(np.float64).tolist()


def to_slime_train_data(
    samples: Sequence[dict],
    advantage_estimator: str = "grpo",
    rewards_normalization: bool = True,
    grpo_std_normalization: bool = True,
    reward_key: str | None = None,
) -> dict:
    """The dict slime's rollout manager hands the trainer (lists, one entry per sample)."""
    raw, rewards = normalised_rewards(
        samples, advantage_estimator, rewards_normalization, grpo_std_normalization, reward_key
    )
    for s in samples:
        if len(s["loss_mask"]) != s["response_length"]:
            raise ValueError(f"sample {s['index']}: loss mask length != response_length")
    rollout_ids = [s["rollout_id"] for s in samples]
    totals: dict[int, int] = {}
    for rid, s in zip(rollout_ids, samples, strict=True):
        totals[rid] = totals.get(rid, 0) + int(sum(s["loss_mask"]))
    return {
        "tokens": [s["tokens"] for s in samples],
        "response_lengths": [s["response_length"] for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [int(s["status"] == "truncated") for s in samples],
        "sample_indices": [s["index"] for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": [s["loss_mask"] for s in samples],
        "rollout_mask_sums": [totals[rid] for rid in rollout_ids],
        "rollout_log_probs": [s["rollout_log_probs"] for s in samples],
    }
