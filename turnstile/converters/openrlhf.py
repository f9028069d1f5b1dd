"""OpenRLHF: agent-executor outputs and the shifted experience tensors.

Targets OpenRLHF 0.11.2 (PyPI; ``AgentExecutorBase.execute`` in ``openrlhf/utils/agent.py``,
consumed by ``SamplesGenerator._process_response_into_experience`` in
``openrlhf/trainer/ppo_utils/samples_generator.py``; same at ``3c3be62``).

Per rollout: ``prompt`` (the prompt text: ``decode`` of the first prompt's tokens, or
``metadata["prompt"]``), ``label`` (the dataset label: ``metadata["label"]``, else None),
``observation_tokens`` (the full sequence), ``action_ranges`` (half-open ``[start, end)``
runs of sampled tokens), ``rollout_log_probs`` (full length, 0.0 on non-actions),
``reward`` and ``scores`` (the raw reward: OpenRLHF's advantage estimator normalises it;
every sample needs one, ValueError otherwise), ``truncated`` (the last call stopped on
length), ``extra_logs``: numbers only, because OpenRLHF makes ``torch.tensor([value])`` of
each: ``num_turns``, ``sample_index`` (-1 if none), ``min_version``/``max_version`` (-1 if
unknown), ``logprob_filled`` (how many logprobs the engine did not report and hold
``fill_logprob``). OpenRLHF's experience shifts by one: position ``i`` of ``action_mask`` /
``rollout_log_probs`` is about *predicting* token ``i + 1``, so both are ``[:, 1:]`` of the
token-level arrays (length ``T - 1``); :func:`to_openrlhf_experience` does that shift.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    action_ranges,
    check_behaviour,
    filled_positions,
    finish_reason,
    logprobs,
    pad,
    require_rewards,
    version_span,
)


def _prompt(t: Trajectory, decode: Callable[[list[int]], str] | None) -> str:
    if decode is not None:
        return decode(t.token_ids[: t.prompt_len].tolist())
    prompt = t.metadata.get("prompt")
    if isinstance(prompt, str):
        return prompt
    raise ValueError(
        "OpenRLHF carries the prompt text: pass decode= (e.g. tokenizer.decode) "
        f"or set metadata['prompt'] on session {t.session_id}"
    )


def to_openrlhf_samples(
    trajs: Sequence[Trajectory],
    decode: Callable[[list[int]], str] | None = None,
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> list[dict]:
    check_behaviour(trajs, "OpenRLHF", inexact)
    rewards = require_rewards(trajs, "OpenRLHF")
    out = []
    for t, reward in zip(trajs, rewards, strict=True):
        lo, hi = version_span(t.versions)
        out.append(
            {
                "prompt": _prompt(t, decode),
                "label": t.metadata.get("label"),
                "observation_tokens": t.token_ids.tolist(),
                "action_ranges": action_ranges(t.loss_mask),
                "rollout_log_probs": logprobs(t, fill_logprob).astype(np.float64).tolist(),
                "reward": reward,
                "scores": reward,
                "truncated": finish_reason(t) == "length",
                "extra_logs": {
                    "num_turns": float(t.num_turns),
                    "sample_index": float(-1 if t.sample_index is None else t.sample_index),
                    "min_version": float(-1 if lo is None else lo),
                    "max_version": float(-1 if hi is None else hi),
                    "logprob_filled": float(
                        len(filled_positions(t)) if fill_logprob is not None else 0
                    ),
                },
            }
        )
    return out


def to_openrlhf_experience(
    trajs: Sequence[Trajectory],
    pad_token_id: int,
    fill_logprob: float | None = DEFAULT_FILL,
    inexact: str = "warn",
) -> dict[str, np.ndarray]:
    """``sequences [B, T]`` (right-padded), ``attention_mask [B, T]``, ``action_mask [B, T-1]``
    and ``rollout_log_probs [B, T-1]`` (both ``[:, 1:]``: shifted to the predicting position),
    ``rewards [B]``."""
    check_behaviour(trajs, "OpenRLHF", inexact)
    rewards = require_rewards(trajs, "OpenRLHF")
    T = max((len(t.token_ids) for t in trajs), default=1)
    seqs = pad([t.token_ids for t in trajs], T, pad_token_id, False, np.int64)
    attn = pad([np.ones(len(t.token_ids)) for t in trajs], T, 0, False, np.int64)
    mask = pad([t.loss_mask for t in trajs], T, 0, False, np.bool_)
    lps = pad([logprobs(t, fill_logprob) for t in trajs], T, 0.0, False, np.float32)
    return {
        "sequences": seqs,
        "attention_mask": attn,
        "action_mask": mask[:, 1:],
        "rollout_log_probs": lps[:, 1:],
        "rewards": np.array(rewards, dtype=np.float32),
    }
