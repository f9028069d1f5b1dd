"""Tinker ``Datum``: next-token inputs and targets, everything of length ``T - 1``.

Targets the Tinker SDK 0.38.0 (PyPI ``tinker``: ``tinker.Datum``, ``ModelInput.from_ints``,
``TensorData.from_numpy``) and the cookbook's ``rl/data_processing.py`` (``9dfcc3a``).

``model_input`` holds ``tokens[:-1]``; ``loss_fn_inputs`` holds ``target_tokens =
tokens[1:]``, ``logprobs[1:]`` (the sampling logprob of each target; ones the engine did not
report hold ``fill_logprob``), ``mask[1:]`` and ``advantages * mask[1:]``: Tinker drops
``mask`` before ``forward_backward``, so positions that were not sampled must already carry
advantage 0. Default advantages are the cookbook's: reward minus the group's mean reward (no
std division); every sample then needs a reward (ValueError otherwise).

With the ``tinker`` package importable the result is real ``tinker.Datum`` objects
(``sdk=None`` or ``True``); otherwise (or ``sdk=False``) plain dicts of the same shape
(``model_input = {"chunks": [{"type": "encoded_text", "tokens": [...]}]}``), which
``tinker.Datum.model_validate`` accepts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..store.trajectories import Trajectory
from ._common import DEFAULT_FILL, check_behaviour, grpo_advantages, logprobs


def to_tinker_datums(
    trajs: Sequence[Trajectory],
    advantages: Sequence[float] | None = None,
    fill_logprob: float | None = DEFAULT_FILL,
    sdk: bool | None = None,
    inexact: str = "warn",
) -> list[Any]:
    """``advantages``: one per sample; default: reward minus the group mean."""
    check_behaviour(trajs, "Tinker", inexact)
    if sdk is None:
        sdk = importlib.util.find_spec("tinker") is not None
    adv = np.asarray(
        advantages if advantages is not None else grpo_advantages(trajs, scale=False),
        dtype=np.float32,
    )
    if len(adv) != len(trajs):
        raise ValueError(f"{len(adv)} advantages for {len(trajs)} samples")
    out = []
    for t, a in zip(trajs, adv, strict=True):
        if len(t.token_ids) < 2:
            raise ValueError(f"Tinker: sample {t.id} has fewer than 2 tokens")
        mask = t.loss_mask[1:].astype(np.float32)
        inputs = t.token_ids[:-1].astype(np.int64)
        fields = {
            "target_tokens": t.token_ids[1:].astype(np.int64),
            "logprobs": logprobs(t, fill_logprob)[1:].astype(np.float32),
            "advantages": (mask * a).astype(np.float32),
            "mask": mask,
        }
        if sdk:
            import tinker

            out.append(
                tinker.Datum(
                    model_input=tinker.ModelInput.from_ints(inputs.tolist()),
                    loss_fn_inputs={k: tinker.TensorData.from_numpy(v) for k, v in fields.items()},
                )
            )
        else:
            out.append(
                {
                    "model_input": {
                        "chunks": [{"type": "encoded_text", "tokens": inputs.tolist()}]
                    },
                    "loss_fn_inputs": {
                        k: {"data": v.tolist(), "dtype": _dtype(v), "shape": list(v.shape)}
                        for k, v in fields.items()
                    },
                }
            )
    return out


def _dtype(v: np.ndarray) -> str:
    return "int64" if v.dtype == np.int64 else "float32"
