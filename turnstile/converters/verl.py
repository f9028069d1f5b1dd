"""verl: the padded batch its PPO/GRPO trainer consumes, and agent-loop outputs.

Targets verl 0.9.1 (PyPI; ``verl.protocol.DataProto``, ``AgentLoopOutput`` in
``verl/experimental/agent_loop/agent_loop.py``; same layout at verl-project ``1dda039``).

Batch (``DataProto`` tensors, here numpy; ``DataProto.from_dict(tensors={k:
torch.from_numpy(v)}, non_tensors=...)`` wraps them):

- ``prompts [B, P]`` left-padded with ``pad_token_id``; ``responses [B, R]`` right-padded;
- ``input_ids = concat(prompts, responses)`` and ``attention_mask [B, P+R]`` (1 on real tokens);
- ``position_ids = clip(cumsum(attention_mask) - 1, 0)`` (verl's ``compute_position_id_with_mask``);
- ``response_mask [B, R]``: 1 on sampled tokens, 0 on observations (tool/user deltas) and pad;
- ``rollout_log_probs [B, R]`` float32, aligned to ``responses`` (no shift), 0 off-mask;
- ``rm_scores [B, R]``: the rollout's raw reward on the last real response token;
- ``routed_experts [B, P+R, layers, k]`` int16 where the samples recorded routing (router
  replay, R3; the layout Megatron's ``RouterReplay`` is given), on ``input_ids``' positions.

Rewards: verl takes raw scalar rewards and computes advantages itself (GRPO groups by the
``uid`` non-tensor field). As in verl's own agent loop, ``rm_scores`` is only written when
*every* sample has a reward; when none has one it is left out so verl's reward manager computes
them; a batch where only some have a reward raises ValueError (a missing reward is not 0.0).

Non-tensor (numpy object arrays): ``group_id`` (Turnstile's group), ``__num_turns__`` (int32),
``min_global_steps``/``max_global_steps`` (policy version span; verl before the ``v1`` trainer
read ``param_version_start``/``param_version_end``, written too), ``rollout_id`` (session),
``trajectory_id``, ``sample_index``, ``versions`` (per-token, response aligned: verl has no
slot for them), ``logprob_filled`` (response positions whose logprob the engine did not report
and that hold ``fill_logprob``). ``uid`` is verl's own: its trainer sets it on the prompt batch
and ``DataProto.union`` asserts equality, so it is only written with ``with_uid=True`` (when
this batch is the whole batch, e.g. a custom loop calling verl's advantage estimators).

IDs and masks are int64 (torch.long once wrapped), logprobs/scores float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..store.trajectories import Trajectory
from ._common import (
    DEFAULT_FILL,
    ImageBytes,
    batch_routing,
    behaviour_exact,
    check_behaviour,
    filled_positions,
    group_key,
    missing_rewards,
    pad,
    pil_images,
    split,
    version_span,
)


def _check_rewards(trajs: Sequence[Trajectory]) -> bool:
    """True if every sample has a reward, False if none has; mixed raises."""
    missing = missing_rewards(trajs)
    if missing and len(missing) < len({t.session_id for t in trajs}):
        raise ValueError(
            f"verl: {len(missing)} session(s) have no reward (e.g. {missing[:3]}) "
            "while others do; post every reward, or none and let verl's reward "
            "manager compute them (a missing reward is not 0.0)"
        )
    return not missing


def to_verl_batch(
    trajs: Sequence[Trajectory],
    pad_token_id: int,
    prompt_length: int | None = None,
    response_length: int | None = None,
    fill_logprob: float | None = DEFAULT_FILL,
    with_uid: bool = False,
    inexact: str = "warn",
) -> dict:
    """``{"batch": {...}, "non_tensor_batch": {...}, "meta_info": {}}``; lengths default to
    the longest prompt/response in the batch (a longer row raises: no silent truncation)."""
    check_behaviour(trajs, "verl", inexact)
    has_rewards = _check_rewards(trajs)
    parts = [split(t, fill_logprob) for t in trajs]
    P = prompt_length if prompt_length is not None else max((len(p[0]) for p in parts), default=0)
    R = (
        response_length
        if response_length is not None
        else max((len(p[1]) for p in parts), default=0)
    )
    prompts = pad([p[0] for p in parts], P, pad_token_id, True, np.int64)
    responses = pad([p[1] for p in parts], R, pad_token_id, False, np.int64)
    prompt_attn = pad([np.ones(len(p[0])) for p in parts], P, 0, True, np.int64)
    resp_attn = pad([np.ones(len(p[1])) for p in parts], R, 0, False, np.int64)
    attention_mask = np.concatenate([prompt_attn, resp_attn], axis=1)
    spans = [version_span(p[4]) for p in parts]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": pad([p[2] for p in parts], R, 0, False, np.int64),
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None),
        "rollout_log_probs": pad([p[3] for p in parts], R, 0.0, False, np.float32),
    }
    if has_rewards and trajs:
        rm_scores = np.zeros((len(trajs), R), dtype=np.float32)
        for i, (t, p) in enumerate(zip(trajs, parts, strict=True)):
            if not len(p[1]):
                raise ValueError(f"verl: sample {t.id} has an empty response")
            rm_scores[i, len(p[1]) - 1] = float(t.reward)  # type: ignore[arg-type]
        batch["rm_scores"] = rm_scores
    non_tensor = {
        "group_id": _obj([group_key(t) for t in trajs]),
        "__num_turns__": np.array([2 * t.num_turns for t in trajs], dtype=np.int32),
        "min_global_steps": _obj([s[0] for s in spans]),
        "max_global_steps": _obj([s[1] for s in spans]),
        "param_version_start": _obj([s[0] for s in spans]),
        "param_version_end": _obj([s[1] for s in spans]),
        "rollout_id": _obj([t.session_id for t in trajs]),
        "trajectory_id": _obj([t.id for t in trajs]),
        "sample_index": _obj([t.sample_index for t in trajs]),
        "versions": _obj([p[4] for p in parts]),
        "logprob_filled": _obj(
            [filled_positions(t, t.prompt_len) if fill_logprob is not None else [] for t in trajs]
        ),
    }
    if with_uid:
        non_tensor["uid"] = _obj([group_key(t) for t in trajs])
    routing = batch_routing(trajs, "verl")
    if routing is not None:
        # [B, P+R, layers, k] int16 on input_ids' positions (left-padded prompt), as verl's
        # agent loop aligns them and Megatron's RouterReplay (set_router_replay_data) reads
        shape = {r.shape[1:] for r in routing}
        if len(shape) != 1:
            raise ValueError(f"verl: samples' routing shapes differ ({sorted(shape)})")
        aligned = np.zeros((len(trajs), P + R, *shape.pop()), dtype=np.int16)
        for i, (r, p) in enumerate(zip(routing, parts, strict=True)):
            start = P - len(p[0])
            aligned[i, start : start + len(r)] = r
        batch["routed_experts"] = aligned
    return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": {}}


def to_verl_agent_loop_outputs(
    trajs: Sequence[Trajectory],
    fill_logprob: float | None = DEFAULT_FILL,
    image_bytes: ImageBytes | None = None,
    inexact: str = "warn",
) -> list[dict]:
    """One ``AgentLoopOutput`` field dict per sample (``AgentLoopOutput(**d)``), as an agent
    loop returns them: ``prompt_ids``, ``response_ids`` (sampled + observation tokens),
    ``response_mask``, ``response_logprobs``, ``reward_score`` (None when no reward was posted:
    verl then computes it; verl writes ``rm_scores`` only when all are set), ``num_turns``,
    ``metrics``, ``extra_fields`` (``min_global_steps``/``max_global_steps``, the Turnstile
    ids, the TransferQueue-style key ``{group}_{sample_index}_{n}``, ``logprob_filled``;
    never ``uid``, which verl owns). A sample with images gets ``multi_modal_data``
    (``{"images": [PIL images]}``, in the order of their blocks in the tokens, as verl's agent
    loop gives its processor): ``image_bytes(session_id, sha256)`` reads them
    (``Client.image``)."""
    check_behaviour(trajs, "verl", inexact)
    _check_rewards(trajs)
    routing = batch_routing(trajs, "verl")
    out = []
    seen: dict[tuple[str, int | None], int] = {}
    for i, t in enumerate(trajs):
        p, r, m, lp, v = split(t, fill_logprob)
        lo, hi = version_span(v)
        group = group_key(t)
        n = seen.setdefault((group, t.sample_index), 0)
        seen[(group, t.sample_index)] = n + 1
        out.append(
            {
                "prompt_ids": p.tolist(),
                "response_ids": r.tolist(),
                "response_mask": m.astype(np.int64).tolist(),
                "response_logprobs": lp.astype(np.float64).tolist(),
                "reward_score": None if t.reward is None else float(t.reward),
                # [len(prompt_ids) + len(response_ids), layers, k]: verl aligns it (int16)
                "routed_experts": None if routing is None else routing[i].astype(np.int16),
                "num_turns": 2 * t.num_turns,
                "metrics": {},
                "extra_fields": {
                    "min_global_steps": lo,
                    "max_global_steps": hi,
                    "group_id": group,
                    "rollout_id": t.session_id,
                    "sample_index": t.sample_index,
                    "key": f"{group}_{t.sample_index}_{n}",
                    "versions": v.tolist(),
                    # whether response_logprobs are the sampler's (TIS/MIS may divide by them)
                    "behaviour_exact": behaviour_exact(t),
                    "logprob_filled": filled_positions(t, t.prompt_len)
                    if fill_logprob is not None
                    else [],
                },
                **_multi_modal(t, image_bytes),
            }
        )
    return out


def _multi_modal(t: Trajectory, image_bytes: ImageBytes | None) -> dict:
    images = pil_images(t, image_bytes, "verl")
    return {"multi_modal_data": {"images": images}} if images else {}


def _obj(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr
