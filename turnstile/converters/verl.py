"""verl: the padded batch its PPO/GRPO trainer consumes, and agent-loop outputs.

Batch (``DataProto`` tensors, here numpy; ``DataProto.from_dict(tensors={k:
torch.from_numpy(v)}, non_tensors=...)`` wraps them):

- ``prompts [B, P]`` left-padded with ``pad_token_id``; ``responses [B, R]`` right-padded;
- ``input_ids = concat(prompts, responses)`` and ``attention_mask [B, P+R]`` (1 on real tokens);
- ``position_ids = clip(cumsum(attention_mask) - 1, 0)`` (verl's ``compute_position_id_with_mask``);
- ``response_mask [B, R]``: 1 on sampled tokens, 0 on observations (tool/user deltas) and pad;
- ``rollout_log_probs [B, R]`` float32, aligned to ``responses`` (no shift), 0 off-mask;
- ``rm_scores [B, R]``: the rollout reward on the last real response token.

Non-tensor (numpy object arrays): ``uid`` (the GRPO group verl passes as ``index=`` to its
advantage estimators), ``__num_turns__``, ``min_global_steps``/``max_global_steps`` (policy
version span), ``rollout_id`` (session), ``sample_index``, ``versions`` (per-token, response
aligned: verl has no slot for them).

IDs and masks are int64 (torch.long once wrapped), logprobs/scores float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import group_key, pad, reward_of, split, version_span


def to_verl_batch(trajs: Sequence[Trajectory], pad_token_id: int,
                  prompt_length: int | None = None, response_length: int | None = None,
                  fill_logprob: float | None = None) -> dict:
    """``{"batch": {...}, "non_tensor_batch": {...}, "meta_info": {}}``; lengths default to
    the longest prompt/response in the batch (a longer row raises: no silent truncation)."""
    parts = [split(t, fill_logprob) for t in trajs]
    P = prompt_length if prompt_length is not None else max((len(p[0]) for p in parts),
                                                             default=0)
    R = response_length if response_length is not None else max((len(p[1]) for p in parts),
                                                                 default=0)
    prompts = pad([p[0] for p in parts], P, pad_token_id, True, np.int64)
    responses = pad([p[1] for p in parts], R, pad_token_id, False, np.int64)
    prompt_attn = pad([np.ones(len(p[0])) for p in parts], P, 0, True, np.int64)
    resp_attn = pad([np.ones(len(p[1])) for p in parts], R, 0, False, np.int64)
    attention_mask = np.concatenate([prompt_attn, resp_attn], axis=1)
    rm_scores = np.zeros((len(trajs), R), dtype=np.float32)
    for i, (t, p) in enumerate(zip(trajs, parts, strict=True)):
        if len(p[1]):
            rm_scores[i, len(p[1]) - 1] = reward_of(t)
    spans = [version_span(p[4]) for p in parts]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": pad([p[2] for p in parts], R, 0, False, np.int64),
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None),
        "rollout_log_probs": pad([p[3] for p in parts], R, 0.0, False, np.float32),
        "rm_scores": rm_scores,
    }
    non_tensor = {
        "uid": _obj([group_key(t) for t in trajs]),
        "__num_turns__": np.array([2 * t.num_turns for t in trajs], dtype=np.int64),
        "min_global_steps": _obj([s[0] for s in spans]),
        "max_global_steps": _obj([s[1] for s in spans]),
        "rollout_id": _obj([t.session_id for t in trajs]),
        "trajectory_id": _obj([t.id for t in trajs]),
        "sample_index": _obj([t.sample_index for t in trajs]),
        "versions": _obj([p[4] for p in parts]),
    }
    return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": {}}


def to_verl_agent_loop_outputs(trajs: Sequence[Trajectory],
                               fill_logprob: float | None = None) -> list[dict]:
    """One ``AgentLoopOutput``-shaped dict per sample (unpadded lists), as an agent loop
    returns them: ``prompt_ids``, ``response_ids`` (sampled + observation tokens),
    ``response_mask``, ``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics``,
    ``extra_fields`` (with ``min_global_steps``/``max_global_steps`` and the TransferQueue key
    ``{uid}_{sample_index}_{n}``)."""
    out = []
    seen: dict[tuple[str, int | None], int] = {}
    for t in trajs:
        p, r, m, lp, v = split(t, fill_logprob)
        lo, hi = version_span(v)
        uid = group_key(t)
        n = seen.setdefault((uid, t.sample_index), 0)
        seen[(uid, t.sample_index)] = n + 1
        out.append({
            "prompt_ids": p.tolist(), "response_ids": r.tolist(),
            "response_mask": m.astype(np.int64).tolist(),
            "response_logprobs": lp.astype(np.float64).tolist(),
            "reward_score": t.reward, "num_turns": 2 * t.num_turns, "metrics": {},
            "extra_fields": {"min_global_steps": lo, "max_global_steps": hi, "uid": uid,
                             "rollout_id": t.session_id, "sample_index": t.sample_index,
                             "key": f"{uid}_{t.sample_index}_{n}",
                             "versions": v.tolist()},
        })
    return out


def _obj(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr
