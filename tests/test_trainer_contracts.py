"""Converters against the trainers' own code, in a separate virtualenv.

Trajectories are recorded through Turnstile's real store (SQLite) and stitched by its real
trajectory code, converted here, and handed (pickled) to ``tests/trainers/contract.py``
running in the trainers venv (``tests/trainers/venv.py``: ``$TURNSTILE_CACHE/trainers-venv``,
keyed by the hash of ``tests/trainers/requirements*.txt``, built with pip on first use). There
each output is built into the framework's classes and fed to the function that consumes it.
Each test also hands over the output a known converter bug produced, and requires the
framework to reject it: the checks can fail. A venv that cannot be built fails the tests.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
from array import array
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
from trainers import venv as trainers_venv

from turnstile.converters import areal, openrlhf, prime_rl, skyrl, slime, tinker, verl
from turnstile.store.records import CallRecord
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "trainers" / "contract.py"
TASKS = ("task-a", "task-b")
G = 3


@pytest.fixture(scope="module")
def trainers_python() -> Path:
    return trainers_venv.ensure()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two GRPO groups of three sessions, each a chain of three calls (a NaN logprob in the
    second, integer weight versions, one run cut on length), rewards posted."""
    store = Store(tmp_path_factory.mktemp("store"))
    rng = np.random.default_rng(7)
    sids = []
    for g, task in enumerate(TASKS):
        for i in range(G):
            sid = store.create_session(
                {"split": "train"}, group_id=f"grp-{task}", sample_index=i, task_id=task
            )
            parent, prefix = None, 0
            for c in range(3):
                delta = rng.integers(10, 5000, size=12 if c == 0 else 5).astype(np.int32)
                comp = rng.integers(10, 5000, size=6).astype(np.int32)
                lps = -rng.exponential(size=6).astype(np.float32)
                if c == 1:
                    lps[2] = np.nan  # llama-server omits some logprobs
                rec = CallRecord(
                    id=f"call_{g}{i}{c}",
                    session_id=sid,
                    seq=c,
                    parent_id=parent,
                    segment_reason="first_call" if parent is None else None,
                    reused_prefix_len=prefix,
                    prompt_delta=array("i", delta.tolist()),
                    completion_ids=array("i", comp.tolist()),
                    completion_logprobs=array("f", lps.tolist()),
                    finish_reason="length" if (c == 2 and i == 0) else "stop",
                    stop_token_id=None,
                    seam=None,
                    status="ok",
                    info={"weight_version": 3 + c, "sampling": {"temperature": 0.8}},
                )
                store.add_call(rec)
                parent, prefix = rec.id, prefix + len(delta) + len(comp)
            store.set_rewards(sid, {"reward": float(i) + 0.5 * g})
            store.close_session(sid)
            sids.append(sid)

    def load(mode):
        return [
            t.with_session(store.get_session(s)) for s in sids for t in stitch(store.calls(s), mode)
        ]

    merged, per_call = load("merged"), load("per_call")
    assert all(np.isnan(t.logprobs).sum() == 1 for t in merged)
    return merged, per_call


def _run(python: Path, framework: str, cases: dict, tmp_path: Path) -> dict:
    path = tmp_path / f"{framework}.pkl"
    path.write_bytes(pickle.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run(
        [str(python), str(SCRIPT), framework, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"{framework} contract script failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    out = json.loads(line[len("RESULT ") :])
    assert out.get("good") == "ok", (
        f"{framework} rejected the converter's output: "
        f"{out.get('good')}\n{out.get('good_traceback', '')}"
    )
    return out


def _rejected(out: dict, case: str, *needles: str) -> None:
    assert out[case] != "ok", f"the framework accepted {case!r}: the check cannot fail"
    assert any(n in out[case] for n in needles), out[case]


def test_verl(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    verl_uid = [f"uuid-{t.task_id}" for t in merged]  # verl's own, one per prompt
    good = {
        "batch": verl.to_verl_batch(merged, pad_token_id=0),
        "verl_uid": verl_uid,
        "agent_loop": verl.to_verl_agent_loop_outputs(merged),
    }
    no_reward = [deepcopy(t) for t in merged]
    for t in no_reward:
        t.reward = None
    cases = {
        "good": good,
        "no_rewards": {
            "batch": verl.to_verl_batch(no_reward, pad_token_id=0),
            "verl_uid": verl_uid,
            "expect_rm_scores": False,
        },
        # the old output: Turnstile's uid over verl's
        "uid_overwritten": {
            "batch": verl.to_verl_batch(merged, pad_token_id=0, with_uid=True),
            "verl_uid": verl_uid,
        },
        # the old default: NaN logprobs passed through
        "nan_logprobs": {
            "batch": verl.to_verl_batch(merged, pad_token_id=0, fill_logprob=None),
            "verl_uid": verl_uid,
        },
    }
    # router replay: routed experts on every token (verl's DataProto and AgentLoopOutput)
    routed = [deepcopy(t) for t in merged]
    for t in routed:
        t.arrays["routed_experts"] = (np.arange(len(t) * 8).reshape(len(t), 4, 2) % 64).astype(
            np.uint8
        )
        t.present["routed_experts"] = np.ones(len(t), dtype=np.int8)
    cases["routed"] = {
        "batch": verl.to_verl_batch(routed, pad_token_id=0),
        "verl_uid": verl_uid,
        "agent_loop": verl.to_verl_agent_loop_outputs(routed),
        "expect_routed": True,
    }
    out = _run(trainers_python, "verl", cases, tmp_path)
    assert out["no_rewards"] == "ok" and out["routed"] == "ok", out.get("routed")
    _rejected(out, "uid_overwritten", "uid", "not the same")
    _rejected(out, "nan_logprobs", "non-finite")
    with pytest.raises(ValueError, match="no reward"):
        verl.to_verl_batch([no_reward[0], *merged[1:]], pad_token_id=0)


def test_trl(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    b_first = merged[G:] + merged[:G]
    base = {"repo": str(ROOT), "num_generations": G, "dataset_tasks": list(TASKS)}
    cases = {
        "good": {**base, "trajs": b_first, "seed": 3},
        "other_seed": {**base, "trajs": merged, "seed": 11},
        # the old behaviour: group blocks in order of first appearance, not prompt order
        "order_assumed": {**base, "trajs": b_first, "seed": 3, "no_keys": True},
    }
    out = _run(trainers_python, "trl", cases, tmp_path)
    assert out["other_seed"] == "ok"
    _rejected(out, "order_assumed", "completion")


def test_skyrl(trainers_python, recorded, tmp_path):
    merged, per_call = recorded
    step = skyrl.to_skyrl_generator_output(list(reversed(per_call)), step_wise=True)
    flat = skyrl.to_skyrl_generator_output(merged, per_token_rewards=True)
    # the old TrajectoryID: task + (sample_index or 0): sessions without an index collide
    no_index = [deepcopy(t) for t in per_call[:6]]
    for t in no_index:
        t.sample_index = None
    collided = skyrl.to_skyrl_generator_output(no_index, step_wise=True)
    old_ids = dict(collided)
    old_ids["trajectory_ids"] = [skyrl.TrajectoryID(t.task_id, 0) for t in no_index]
    cases = {
        "good": {
            "output": step,
            "step_wise": True,
            "num_prompts": len(merged),
            "group_ids": [t.group_id for t in per_call],
        },
        "merged": {
            "output": flat,
            "step_wise": False,
            "num_prompts": len(merged),
            "group_ids": [t.group_id for t in merged],
        },
        "no_sample_index": {
            "output": collided,
            "step_wise": True,
            "num_prompts": 2,
            "group_ids": [t.group_id for t in no_index],
        },
        "old_ids": {
            "output": old_ids,
            "step_wise": True,
            "num_prompts": 2,
            "group_ids": [t.group_id for t in no_index],
        },
    }
    out = _run(trainers_python, "skyrl", cases, tmp_path)
    assert out["merged"] == "ok" and out["no_sample_index"] == "ok"
    _rejected(out, "old_ids", "is_last_step", "Non-contiguous")
    skyrl.check_step_wise(step)
    with pytest.raises(ValueError):
        skyrl.check_step_wise(old_ids)


def test_slime(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    samples = slime.to_slime_samples(list(reversed(merged)))
    data = slime.to_slime_train_data(samples)
    old = {k: v for k, v in data.items() if k != "rollout_mask_sums"}
    raw = {**data, "rewards": data["raw_reward"]}
    base = {"samples": samples, "n_samples_per_prompt": G}
    out = _run(
        trainers_python,
        "slime",
        {
            "good": {**base, "train_data": data},
            "no_mask_sums": {**base, "train_data": old},
            "raw_rewards": {**base, "train_data": raw},
        },
        tmp_path,
    )
    _rejected(out, "no_mask_sums", "rollout_mask_sums")
    _rejected(out, "raw_rewards", "AssertionError")


def test_areal(trainers_python, recorded, tmp_path):
    merged, per_call = recorded
    dicts = areal.to_areal_tensor_dicts(merged + per_call[:2])
    old = [{**d, "input_ids": d["input_ids"].astype(np.int64)} for d in dicts]
    old_pad = areal.concat_padded(dicts, pad_value=0)
    old_pad["versions"] = areal.concat_padded(dicts, pad_value=-1)["versions"]
    out = _run(
        trainers_python,
        "areal",
        {
            "good": {"dicts": dicts, "ours": areal.concat_padded(dicts)},
            "int64_ids": {"dicts": old, "ours": areal.concat_padded(old)},
            "versions_pad_minus_1": {"dicts": dicts, "ours": old_pad},
        },
        tmp_path,
    )
    _rejected(out, "int64_ids", "int64")
    _rejected(out, "versions_pad_minus_1", "versions")


def test_openrlhf(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    for t in merged:
        t.metadata = {**t.metadata, "prompt": f"solve {t.task_id}", "label": t.task_id}
    samples = openrlhf.to_openrlhf_samples(merged)
    old = deepcopy(samples)
    for s in old:
        s["extra_logs"]["session_id"] = "sess_x"  # the old string-valued extra_logs
    out = _run(
        trainers_python,
        "openrlhf",
        {"good": {"samples": samples}, "string_extra_logs": {"samples": old}},
        tmp_path,
    )
    _rejected(out, "string_extra_logs", "TypeError", "ValueError")


def test_prime_rl(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    samples = prime_rl.to_prime_rl_samples(merged)
    extra = [{**s, "reward": 1.0} for s in samples]
    no_adv = [{**s, "advantages": None} for s in samples]
    out = _run(
        trainers_python,
        "prime_rl",
        {
            "good": {"samples": samples},
            "extra_fields": {"samples": extra},
            "no_advantages": {"samples": no_adv},
        },
        tmp_path,
    )
    _rejected(out, "extra_fields", "reward")
    _rejected(out, "no_advantages", "advantages")


def test_tinker(trainers_python, recorded, tmp_path):
    merged, _ = recorded
    dicts = tinker.to_tinker_datums(merged, sdk=False)  # what a machine without the SDK gets
    assert isinstance(dicts[0], dict)
    adv = np.asarray(dicts[0]["loss_fn_inputs"]["advantages"]["data"])
    mask = np.asarray(dicts[0]["loss_fn_inputs"]["mask"]["data"])
    assert set(adv[mask == 1]) == {-1.0}  # reward 0 - group mean 1: the cookbook's, no std
    out = _run(
        trainers_python,
        "tinker",
        {
            "good": {"repo": str(ROOT), "trajs": merged},
            "plain_dicts": {"repo": str(ROOT), "trajs": merged, "datums": dicts},
        },
        tmp_path,
    )
    _rejected(out, "plain_dicts", "Datum")


def _png(color: tuple[int, int, int], size: tuple[int, int]):
    import io

    from PIL import Image as PILImage

    from turnstile import media

    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, "PNG")
    return media.decode(out.getvalue())


def test_images_verl_and_slime(trainers_python, tmp_path):
    """A VLM rollout (an image in the first prompt, another in a later turn's observation, a
    tool result's screenshot) and a text one: verl's AgentLoopOutput and slime's Sample get
    the pixels in block order, equal to the bytes read from the store file (sqlite3, not the
    Store); a swapped order and a misnamed field are rejected; TRL refuses the later image."""
    import sqlite3

    from turnstile import media
    from turnstile.converters import trl

    red, blue = _png((255, 0, 0), (6, 4)), _png((0, 0, 255), (3, 9))
    store = Store(tmp_path / "s")

    def item(im: media.Image, off: int) -> media.MediaItem:
        return media.MediaItem(im.sha256, im.mime, off, 7, {"name": "P"}, (1, 3, 32, 32))

    for sid, vlm in (("vlm", True), ("text", False)):
        store.create_session(session_id=sid, group_id="g", sample_index=int(not vlm))
        parent = None
        for c, (delta, items, ims) in enumerate(
            (
                (20, (item(red, 3),) if vlm else (), [red] if vlm else []),
                (12, (item(red, 3), item(blue, 25)) if vlm else (), [blue] if vlm else []),
            )
        ):
            rec = CallRecord(
                id=f"{sid}{c}",
                session_id=sid,
                seq=c,
                parent_id=parent,
                segment_reason="first_call" if parent is None else None,
                reused_prefix_len=0 if parent is None else 23,
                prompt_delta=array("i", range(100, 100 + delta)),
                completion_ids=array("i", [5, 6, 7]),
                completion_logprobs=array("f", [-0.5, -0.25, -0.125]),
                finish_reason="stop",
                stop_token_id=None,
                seam=None,
                status="ok",
                media=items,
                images={i.sha256: i for i in ims},
            )
            store.add_call(rec)
            parent = rec.id
        store.set_rewards(sid, {"reward": 1.0 if vlm else 0.0})
    trajs = [
        t.with_session(store.get_session(sid))
        for sid in ("vlm", "text")
        for t in stitch(store.calls(sid))
    ]
    assert [len(t.images) for t in trajs] == [2, 0]
    db = sqlite3.connect(tmp_path / "s" / "turnstile.sqlite3")
    blob = dict(db.execute("SELECT sha256, data FROM media_blobs").fetchall())
    db.close()
    raw = [[blob[red.sha256], blob[blue.sha256]], []]

    def read(sid: str, sha: str) -> bytes:
        got = store.image(sid, sha)
        assert got is not None
        return got.data

    loop = verl.to_verl_agent_loop_outputs(trajs, image_bytes=read)
    samples = slime.to_slime_samples(trajs, image_bytes=read)
    assert [s["session_id"] for s in samples] == ["vlm", "text"]
    swapped = deepcopy(loop)
    swapped[0]["multi_modal_data"]["images"].reverse()
    misnamed = deepcopy(loop)
    misnamed[0]["multi_modal_inputs"] = misnamed[0].pop("multi_modal_data")
    slime_misnamed = deepcopy(samples)
    slime_misnamed[0]["multimodal_data"] = slime_misnamed[0].pop("multimodal_inputs")
    base = {"agent_loop": loop, "slime": samples, "raw": raw}
    out = _run(
        trainers_python,
        "images",
        {
            "good": base,
            "swapped": {**base, "agent_loop": swapped},
            "misnamed": {**base, "agent_loop": misnamed},
            "slime_misnamed": {**base, "slime": slime_misnamed},
        },
        tmp_path,
    )
    _rejected(out, "swapped", "image 0 differs")
    _rejected(out, "misnamed", "multi_modal", "extra")
    _rejected(out, "slime_misnamed", "multimodal_data")
    with pytest.raises(ValueError, match="image_bytes"):
        slime.to_slime_samples(trajs)
    with pytest.raises(ValueError, match="other bytes"):
        verl.to_verl_agent_loop_outputs(trajs, image_bytes=lambda s, h: blob[blue.sha256])
    # TRL: pixels come only from the dataset row with the prompt; the later image is refused
    with pytest.raises(ValueError, match="after its prompt"):
        trl.to_trl_rollout(trajs)
    first = [t for s in ("vlm", "text") for t in stitch(store.calls(s)[:1])]
    assert trl.to_trl_rollout(first)["image_sha256"] == [[red.sha256], []]
    store.close()
