"""Tinker-style ``Datum``: next-token inputs and targets, everything of length ``T - 1``.

``model_input`` holds ``tokens[:-1]`` (one encoded-text chunk); ``loss_fn_inputs`` holds
``target_tokens = tokens[1:]``, ``logprobs[1:]`` (the sampling logprob of each target),
``mask[1:]`` and ``advantages * mask[1:]``: Tinker drops ``mask`` before ``forward_backward``,
so positions that were not sampled must already carry advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import grpo_advantages, logprobs


def to_tinker_datums(trajs: Sequence[Trajectory], advantages: Sequence[float] | None = None,
                     fill_logprob: float | None = None) -> list[dict]:
    """``advantages``: one per sample; default: GRPO advantages within each group."""
    adv = np.asarray(advantages if advantages is not None else grpo_advantages(trajs),
                     dtype=np.float32)
    out = []
    for t, a in zip(trajs, adv, strict=True):
        mask = t.loss_mask[1:].astype(np.float32)
        out.append({
            "model_input": {"chunks": [{"type": "encoded_text",
                                        "tokens": t.token_ids[:-1].astype(np.int64)}]},
            "loss_fn_inputs": {
                "target_tokens": t.token_ids[1:].astype(np.int64),
                "logprobs": logprobs(t, fill_logprob)[1:].astype(np.float32),
                "advantages": (mask * a).astype(np.float32),
                "mask": mask,
            },
        })
    return out
