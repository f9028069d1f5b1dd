"""AReaL: per-interaction tensor dicts and their padded concatenation.

Targets AReaL 1.0.4 (PyPI ``areal``; ``areal/utils/data.py::concat_padded_tensors``, the
``areal/workflow`` tensor dicts, ``InteractionWithTokenLogpReward.to_tensor_dict``).

Each sample becomes ``{input_ids [1, T] int32, loss_mask [1, T] int32, logprobs [1, T]
float32, versions [1, T] int32, attention_mask [1, T] bool, rewards [1] float32}`` over the
*full* sequence (no prompt/response split, no shift): ``loss_mask`` 1 on sampled tokens,
``logprobs`` 0 elsewhere, ``versions`` the policy version per sampled token and -1 on the
sequence's other tokens (AReaL's convention). ``rewards`` is the raw reward (AReaL's actor
normalises and computes advantages); every sample needs one (ValueError otherwise).
``per_call`` samples give AReaL's ``individual`` export style, ``merged`` its ``concat``
style (tree leaves). :func:`concat_padded` right-pads them into ``[B, T_max]`` as
``concat_padded_tensors`` does: every key with 0 (so padded ``versions`` are 0, not -1),
``attention_mask`` with 0/False. Logprobs the engine did not report hold ``fill_logprob``
(:func:`~turnstile.converters._common.filled_positions` lists them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import DEFAULT_FILL, check_behaviour, logprobs, require_rewards


def to_areal_tensor_dicts(
    trajs: Sequence[Trajectory],
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> list[dict[str, np.ndarray]]:
    check_behaviour(trajs, "AReaL", inexact)
    rewards = require_rewards(trajs, "AReaL")
    out = []
    for t, r in zip(trajs, rewards, strict=True):
        n = len(t.token_ids)
        out.append(
            {
                "input_ids": t.token_ids.astype(np.int32)[None, :],
                "loss_mask": t.loss_mask.astype(np.int32)[None, :],
                "logprobs": logprobs(t, fill_logprob).astype(np.float32)[None, :],
                "versions": t.versions.astype(np.int32)[None, :],
                "attention_mask": np.ones((1, n), dtype=bool),
                "rewards": np.array([r], dtype=np.float32),
            }
        )
    return out


def concat_padded(
    dicts: Sequence[dict[str, np.ndarray]], pad_value: float = 0.0
) -> dict[str, np.ndarray]:
    """Right-pad ``[1, T_i]`` entries to ``[B, max T]`` with ``pad_value`` (attention with 0);
    1-D entries are concatenated."""
    if not dicts:
        return {}
    T = max(d["input_ids"].shape[1] for d in dicts)
    out = {}
    for k, first in dicts[0].items():
        if first.ndim == 1:
            out[k] = np.concatenate([d[k] for d in dicts])
            continue
        fill = 0 if k == "attention_mask" else pad_value
        arr = np.full((len(dicts), T), fill, dtype=first.dtype)
        for i, d in enumerate(dicts):
            arr[i, : d[k].shape[1]] = d[k][0]
        out[k] = arr
    return out


def to_areal_batch(
    trajs: Sequence[Trajectory],
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> dict[str, np.ndarray]:
    return concat_padded(to_areal_tensor_dicts(trajs, fill_logprob, inexact))
