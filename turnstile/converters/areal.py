"""AReaL: per-interaction tensor dicts and their padded concatenation.

Each sample becomes ``{input_ids [1, T], loss_mask [1, T], logprobs [1, T], versions [1, T],
attention_mask [1, T], rewards [1]}`` over the *full* sequence (no prompt/response split, no
shift): ``loss_mask`` 1 on sampled tokens, ``logprobs`` 0 elsewhere, ``versions`` the policy
version per sampled token and -1 elsewhere (AReaL's convention). ``per_call`` samples give
AReaL's ``individual`` export style; ``merged`` samples its ``concat`` style (tree leaves).
:func:`concat_padded` right-pads a list of them into ``[B, T_max]`` (pad 0, versions -1,
attention 0), like AReaL's ``concat_padded_tensors``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import logprobs, reward_of


def to_areal_tensor_dicts(trajs: Sequence[Trajectory], fill_logprob: float | None = None
                          ) -> list[dict[str, np.ndarray]]:
    out = []
    for t in trajs:
        n = len(t.token_ids)
        out.append({
            "input_ids": t.token_ids.astype(np.int64)[None, :],
            "loss_mask": t.loss_mask.astype(np.int32)[None, :],
            "logprobs": logprobs(t, fill_logprob).astype(np.float32)[None, :],
            "versions": t.versions.astype(np.int32)[None, :],
            "attention_mask": np.ones((1, n), dtype=bool),
            "rewards": np.array([reward_of(t)], dtype=np.float32),
        })
    return out


PAD = {"versions": -1}


def concat_padded(dicts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Right-pad ``[1, T_i]`` entries to ``[B, max T]``; 1-D entries are concatenated."""
    if not dicts:
        return {}
    T = max(d["input_ids"].shape[1] for d in dicts)
    out = {}
    for k, first in dicts[0].items():
        if first.ndim == 1:
            out[k] = np.concatenate([d[k] for d in dicts])
            continue
        arr = np.full((len(dicts), T), PAD.get(k, 0), dtype=first.dtype)
        for i, d in enumerate(dicts):
            arr[i, :d[k].shape[1]] = d[k][0]
        out[k] = arr
    return out


def to_areal_batch(trajs: Sequence[Trajectory], fill_logprob: float | None = None
                   ) -> dict[str, np.ndarray]:
    return concat_padded(to_areal_tensor_dicts(trajs, fill_logprob))
