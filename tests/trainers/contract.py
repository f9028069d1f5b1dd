"""Runs inside the trainers venv (tests/trainers/venv.py): hands a converter's output to the
framework's own classes and the function that consumes it.

``python contract.py FRAMEWORK PAYLOAD.pkl`` prints one JSON object: for each case in the
payload, ``"ok"`` or the error the framework raised. Where a framework's module cannot be
imported on this machine (it imports vLLM or a GPU stack at module level), the consuming
function is loaded by itself from the *installed package's* source (``load``): the real
released code, without the module's other imports. Frameworks that do not install at all
(slime, prime-rl) are checked against the field facts of a named commit, written out below.
"""

from __future__ import annotations

import ast
import json
import math
import pickle
import sys
import traceback
from importlib import metadata

import numpy as np


def load(dist: str, path: str, names: list[str], env: dict) -> dict:
    """Exec the top-level functions/classes (or ``Class.method``) ``names`` from ``path``
    inside the installed distribution ``dist``, with ``env`` as their globals."""
    src = metadata.distribution(dist).locate_file(path).read_text()
    tree = ast.parse(src)
    found = []
    for name in names:
        cls, _, meth = name.partition(".")
        for node in tree.body:
            if getattr(node, "name", None) != cls:
                continue
            if not meth:
                found.append(node)
            else:
                found += [n for n in node.body if getattr(n, "name", None) == meth]
    if len(found) != len(names):
        raise LookupError(f"{names} not all found in {dist}:{path}")
    ns = dict(env)
    exec(compile(ast.Module(body=found, type_ignores=[]), f"{dist}:{path}", "exec"), ns)
    return ns


# verl 0.9.1: DataProto + union with the trainer's own uid batch, GRPO advantages, and
# AgentLoopOutput.
def verl(p: dict) -> None:
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    b = p["batch"]
    gen = DataProto.from_dict(
        tensors={k: torch.from_numpy(v) for k, v in b["batch"].items()},
        non_tensors=dict(b["non_tensor_batch"]),
        meta_info=b["meta_info"],
    )
    # verl's trainer: the prompt batch carries ``uid`` (one per prompt, repeated n times);
    # the generated batch is unioned into it.
    prompts = DataProto.from_dict(
        tensors={"prompts": torch.from_numpy(b["batch"]["prompts"])},
        non_tensors={"uid": np.array(p["verl_uid"], dtype=object)},
    )
    batch = prompts.union(gen)
    assert list(batch.non_tensor_batch["uid"]) == list(p["verl_uid"])
    assert torch.isfinite(batch.batch["rollout_log_probs"]).all(), "non-finite logprobs"
    if "routed_experts" in batch.batch.keys():  # router replay: [B, P+R, layers, k]
        shape = tuple(batch.batch["routed_experts"].shape[:2])
        assert shape == tuple(batch.batch["input_ids"].shape), "routed_experts off input_ids"
    if p.get("expect_rm_scores", True):
        adv, _ = compute_grpo_outcome_advantage(
            token_level_rewards=batch.batch["rm_scores"],
            response_mask=batch.batch["response_mask"],
            index=batch.non_tensor_batch["uid"],
        )
        assert torch.isfinite(adv).all()
        got = adv[batch.batch["response_mask"].bool()]
        assert got.abs().sum() > 0
    else:
        assert "rm_scores" not in batch.batch.keys()
    if p.get("agent_loop"):
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

        for d in p["agent_loop"]:
            out = AgentLoopOutput(**d)
            assert "uid" not in out.extra_fields
            assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
            if p.get("expect_routed"):  # verl's field, not an extra it would let through
                assert out.routed_experts is not None, "no AgentLoopOutput.routed_experts"
                assert len(out.routed_experts) == len(out.prompt_ids) + len(out.response_ids)


# TRL 1.16.0: GRPOTrainer samples prompts with RepeatSampler (each prompt num_generations
# times in a row), calls rollout_func(prompts), requires prompt_ids/completion_ids/logprobs,
# takes env_mask as the tool mask and merges every other key into inputs[i] by position
# (``inp[key] = values[i]``, GRPOTrainer._generate_and_score_completions).
def trl(p: dict) -> None:
    from trl.trainer.utils import RepeatSampler

    rows, G = p["dataset_tasks"], p["num_generations"]
    order = list(
        RepeatSampler(rows, mini_repeat_count=G, batch_size=len(rows), shuffle=True, seed=p["seed"])
    )
    inputs = [{"task_id": rows[i]} for i in order]
    from turnstile.converters.trl import to_trl_rollout

    out = to_trl_rollout(
        p["trajs"],
        num_generations=G,
        prompt_keys=None if p.get("no_keys") else [i["task_id"] for i in inputs],
    )
    missing = {"prompt_ids", "completion_ids", "logprobs"} - out.keys()
    assert not missing, f"rollout_func must return keys {sorted(missing)}"
    extra = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
    tool_mask = extra.pop("env_mask")
    for c, lp, m in zip(out["completion_ids"], out["logprobs"], tool_mask, strict=True):
        assert len(c) == len(lp) == len(m) and all(math.isfinite(x) for x in lp)
    merged = [dict(inp) for inp in inputs]
    for i, inp in enumerate(merged):  # TRL's merge
        for k, values in extra.items():
            if isinstance(values, list) and i < len(values):
                inp[k] = values[i]
    for i, inp in enumerate(merged):
        # the dataset row TRL handed out at position i and the sample merged into it agree
        assert inp["task_id"] == inputs[i]["task_id"], (
            f"row {i}: prompt of task {inputs[i]['task_id']} got task {inp['task_id']}'s completion"
        )


# SkyRL 0.3.0: validate_generator_output + _validate_step_wise_fields and TrajectoryID, from
# the installed package's skyrl/train/utils/trainer_utils.py and generators/base.py (the
# modules import Ray workers, vLLM clients and need Python 3.12 typing at import).
def skyrl(p: dict) -> None:
    from dataclasses import dataclass

    from loguru import logger

    base = load(
        "skyrl", "skyrl/train/generators/base.py", ["TrajectoryID"], {"dataclass": dataclass}
    )
    fns = load(
        "skyrl",
        "skyrl/train/utils/trainer_utils.py",
        ["validate_generator_output", "_validate_step_wise_fields"],
        {"np": np, "logger": logger, "GeneratorOutput": dict},
    )
    TrajectoryID = base["TrajectoryID"]
    out = dict(p["output"])
    out["trajectory_ids"] = [
        TrajectoryID(instance_id=t.instance_id, repetition_id=t.repetition_id)
        for t in out["trajectory_ids"]
    ]
    n = p["num_prompts"]
    fns["validate_generator_output"](n, out, step_wise=p["step_wise"])
    if not p["step_wise"]:
        assert len({t.to_string() for t in out["trajectory_ids"]}) == len(out["trajectory_ids"])
    # GRPO groups are the instance ids; they must be Turnstile's groups.
    groups = {}
    for tid, g in zip(out["trajectory_ids"], p["group_ids"], strict=True):
        groups.setdefault(tid.instance_id, set()).add(g)
    assert all(len(v) == 1 for v in groups.values()), groups


# slime at 624b824 (not on PyPI: the name is another project): field facts of
# slime/utils/types.py::Sample and RolloutManager._convert_samples_to_train_data /
# _post_process_rewards in slime/ray/rollout.py.
SLIME_SAMPLE_FIELDS = {
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "multimodal_train_input_id",
    "apply_chat_template_kwargs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_routed_experts",
    "remove_sample",
    "teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "custom_rm_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
}
SLIME_STATUS = {"pending", "completed", "truncated", "aborted", "failed"}
SLIME_TRAIN_KEYS = {
    "tokens",
    "response_lengths",
    "rewards",
    "raw_reward",
    "truncated",
    "sample_indices",
    "rollout_ids",
    "loss_masks",
    "rollout_mask_sums",
    "rollout_log_probs",
}


def slime(p: dict) -> None:
    import torch

    samples, data, n = p["samples"], p["train_data"], p["n_samples_per_prompt"]
    for s in samples:
        unknown = set(s) - SLIME_SAMPLE_FIELDS
        assert not unknown, f"Sample() got unexpected keyword arguments {sorted(unknown)}"
        assert s["status"] in SLIME_STATUS
        assert len(s["loss_mask"]) == s["response_length"] == len(s["rollout_log_probs"])
        assert s["tokens"][-s["response_length"] :] and all(
            math.isfinite(x) for x in s["rollout_log_probs"]
        )
        assert isinstance(s["group_index"], int) and isinstance(s["rollout_id"], int)
    missing = SLIME_TRAIN_KEYS - data.keys()
    assert not missing, f"KeyError: {sorted(missing)}"
    # _post_process_rewards for grpo with rewards_normalization + grpo_std_normalization:
    raw = torch.tensor([float(s["reward"]) for s in samples], dtype=torch.float)
    r = raw.reshape(-1, n)
    r = r - r.mean(dim=-1, keepdim=True)
    r = r / (r.std(dim=-1, keepdim=True) + 1e-6)
    assert torch.allclose(torch.tensor(data["rewards"]), r.flatten(), atol=1e-5), (
        data["rewards"],
        r.flatten().tolist(),
    )
    assert data["raw_reward"] == raw.tolist()
    # rollout_mask_sums: the loss-mask total of each sample's whole rollout
    totals = {}
    for rid, m in zip(data["rollout_ids"], data["loss_masks"], strict=True):
        totals[rid] = totals.get(rid, 0) + sum(m)
    assert data["rollout_mask_sums"] == [totals[r] for r in data["rollout_ids"]]


# AReaL 1.0.4: concat_padded_tensors from the installed areal/utils/data.py (the module
# imports AReaL's launcher/platform stack).
def areal(p: dict) -> None:
    import torch

    fns = load(
        "areal",
        "areal/utils/data.py",
        ["get_batch_size", "is_multi_modal_key", "_pad_cat_dim0", "concat_padded_tensors"],
        {"torch": torch, "F": torch.nn.functional, "Any": object},
    )
    dicts = [{k: torch.from_numpy(v) for k, v in d.items()} for d in p["dicts"]]
    for d in dicts:
        assert d["input_ids"].dtype == torch.int32, d["input_ids"].dtype
        assert d["versions"].dtype == torch.int32 and d["attention_mask"].dtype == torch.bool
        assert torch.isfinite(d["logprobs"]).all()
    got = fns["concat_padded_tensors"](dicts)
    ours = p["ours"]
    assert set(got) == set(ours)
    for k, v in got.items():
        assert v.dtype == torch.from_numpy(ours[k]).dtype, k
        assert torch.equal(v, torch.from_numpy(ours[k])), f"{k} differs from AReaL's padding"


# OpenRLHF 0.11.2: SamplesGenerator._process_response_into_experience from the installed
# samples_generator.py (the module imports vLLM) with the real Experience class.
def openrlhf(p: dict) -> None:
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    fns = load(
        "openrlhf",
        "openrlhf/trainer/ppo_utils/samples_generator.py",
        ["SamplesGenerator._process_response_into_experience"],
        {"torch": torch, "Experience": Experience},
    )
    for r in p["samples"]:
        exp = fns["_process_response_into_experience"](None, r, max_len=10**6)
        T = len(r["observation_tokens"])
        assert exp.sequences.shape == (1, T) and exp.action_mask.shape == (1, T - 1)
        assert exp.rollout_log_probs.shape == (1, T - 1)
        assert torch.isfinite(exp.rollout_log_probs).all()
        assert exp.rewards is not None and exp.labels == [r["label"]]
        assert exp.prompts == [r["prompt"]] and r["prompt"]
        assert bool(exp.truncated[0]) == r["truncated"]
        for k in r["extra_logs"]:
            assert exp.info[k].shape == (1,)


# prime-rl at 559b447 (not on PyPI): field facts of TrainingSample
# (src/prime_rl/transports/rollouts/types.py, msgspec, array_like) and the trainer's rule
# that trainable tokens need advantages.
def prime_rl(p: dict) -> None:
    import msgspec

    fields = [
        ("token_ids", list[int]),
        ("mask", list[bool]),
        ("logprobs", list[float]),
        ("temperatures", list[float]),
        ("env_name", str),
        ("ref_logprobs", list[float] | None, None),
        ("mm_refs", dict | None, None),
        ("routed_experts", dict | None, None),
        ("mm_token_type_ids", list[int] | None, None),
        ("rl_weights", list[float] | None, None),
        ("ce_weights", list[float] | None, None),
        ("ref_kl_weights", list[float] | None, None),
        ("advantages", list[float] | None, None),
    ]
    TrainingSample = msgspec.defstruct(
        "TrainingSample", fields, array_like=True, omit_defaults=True
    )
    for d in p["samples"]:
        s = TrainingSample(**d)  # unknown keys: "Unexpected keyword argument"
        wire = msgspec.msgpack.encode(s)
        s = msgspec.msgpack.decode(wire, type=TrainingSample)
        n = len(s.token_ids)
        assert len(s.mask) == len(s.logprobs) == len(s.temperatures) == n
        assert all(math.isfinite(x) for x in s.logprobs)
        if any(s.mask):
            assert s.advantages is not None, "advantages None on a sample with trainable tokens"
            assert len(s.advantages) == n


# Tinker SDK 0.38.0: the converter run here, where the SDK is importable, gives real Datums.
def tinker(p: dict) -> None:
    import tinker as tk

    from turnstile.converters.tinker import to_tinker_datums

    datums = p.get("datums") or to_tinker_datums(p["trajs"])
    for d, t in zip(datums, p["trajs"], strict=True):
        assert isinstance(d, tk.Datum), f"not a tinker.Datum: {type(d)}"
        assert isinstance(d.model_input, tk.ModelInput), type(d.model_input)
        T = len(t.token_ids)
        assert d.model_input.length == T - 1
        assert d.model_input.to_ints() == t.token_ids[:-1].tolist()
        f = d.loss_fn_inputs
        assert set(f) == {"target_tokens", "logprobs", "advantages", "mask"}
        assert all(isinstance(v, tk.TensorData) and v.shape == [T - 1] for v in f.values())
        assert f["target_tokens"].dtype == "int64" and f["advantages"].dtype == "float32"
        adv, mask = f["advantages"].to_numpy(), f["mask"].to_numpy()
        assert (adv[mask == 0] == 0).all() and np.isfinite(f["logprobs"].to_numpy()).all()


# Images (issue 43): verl 0.9.1's AgentLoopOutput takes multi_modal_data {"images": [PIL]}
# (the agent loop hands them to its processor with the tokens); slime's Sample keeps
# multimodal_inputs {"images": [PIL]}. The pixels must be the stored bytes in block order:
# ``raw`` holds each sample's bytes as read from the store file, in span order.
def images(p: dict) -> None:
    import io

    from PIL import Image
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    def same(got: list, raw: list[bytes]) -> None:
        assert len(got) == len(raw), f"{len(got)} images for {len(raw)} blocks"
        for k, (im, data) in enumerate(zip(got, raw, strict=True)):
            want = Image.open(io.BytesIO(data)).convert("RGB")
            assert im.size == want.size and im.tobytes() == want.tobytes(), f"image {k} differs"

    for d, raw in zip(p["agent_loop"], p["raw"], strict=True):
        out = AgentLoopOutput(**d)
        if not raw:
            assert not out.multi_modal_data, "a text sample with multi_modal_data"
            continue
        assert out.multi_modal_data is not None, "no AgentLoopOutput.multi_modal_data"
        same(out.multi_modal_data["images"], raw)
    for s, raw in zip(p["slime"], p["raw"], strict=True):
        unknown = set(s) - SLIME_SAMPLE_FIELDS
        assert not unknown, f"Sample() got unexpected keyword arguments {sorted(unknown)}"
        same((s.get("multimodal_inputs") or {}).get("images", []), raw)


def main() -> None:
    fw, path = sys.argv[1], sys.argv[2]
    with open(path, "rb") as fh:
        cases = pickle.load(fh)
    check = globals()[fw]
    result = {}
    for name, payload in cases.items():
        try:
            check(payload)
            result[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result[name] = f"{type(exc).__name__}: {exc}"[:2000]
            if name == "good":
                result["good_traceback"] = traceback.format_exc()[-4000:]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
