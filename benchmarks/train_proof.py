"""Does training on exact records matter? A small GRPO loop on the CPU, three arms from the
same seeds: the trainer consumes Turnstile's exact records (``exact``), or what a chat-level
pipeline has, the messages the harness holds rendered through the template and encoded again
(``verify.rerendered``), with either the engine's logprobs laid on by position (``naive``) or the
old policy's logprobs recomputed by the trainer on the re-tokenized text (``recompute``).

Each step: the policy's weights (PyTorch, ``trainer_policy.py`` in the trainers venv) are
written as a GGUF and llama-server is restarted on them (a real weight sync); a group of
two-turn tool rollouts per task runs through Turnstile (the official ``openai`` client: a
forced ``lookup`` call, the tool's answer, then a free reply); the reward is verifiable (does
the reply hold the code the tool returned?); GRPO advantages per group; one PPO-clip update
with the behaviour logprobs as the old policy's (as decoupled trainers do), so the ratio at
the update is exactly the train-behaviour mismatch.

Per step and arm it records, per sample, where the re-tokenized IDs first differ from the
sampled ones (which call, prompt or completion, token index), the share of loss-bearing
tokens that were never sampled as such, the mismatch between the trainer's logprobs and the
behaviour logprobs it was given (mean |Δ|, k3 KL, max |Δ|), the ratio's spread and clip
fraction, how far the update moved the weights, and the mean reward. It checks itself and
exits 1 when a check fails: the exact arm within the agreement bound, unclipped, on sampled
tokens only; the weights moved; and a negative control, one more rollout after the exact
arm's last update with that update's weight sync skipped, which must trip the bound.

    ~/.cache/turnstile/venv/bin/python benchmarks/train_proof.py --quick   # from the root
        [--model tiny|smollm2] [--seeds 3] [--steps 6] [--tasks 2] [--group-size 4]
        [--json rows.json] [--plot docs/train_proof.png]

(``--quick``: the random-weight tiny model, 1 seed, 2 steps; its reward adds a dense term, so
its groups' advantages are not all zero and the update moves the weights.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import openai
import policy_gguf

import turnstile
import turnstile_testbed as testbed
from turnstile.app.wiring import build_gateway
from turnstile.auth import load_or_create_token
from turnstile.server.app import create_app
from turnstile.verify import rerendered
from turnstile_testbed.demo import serve_in_thread
from turnstile_testbed.trainers import trainers_python
from turnstile_testbed.vllm import vllm_model

QWEN25 = "Qwen-Qwen2.5-7B-Instruct"  # the template (hermes tool calls) for both policies
CLIP = 0.2
# The exact arm's bound on max |Δ| between the trainer's and the engine's logprobs (F32 GGUF,
# float32 trainer): tests/test_trainer_agreement.py's for the tiny model (measured 2e-4 there);
# for SmolLM2's 30 layers twice the worst token of the last full run (0.0245).
BOUND = {"tiny": 2e-3, "smollm2": 0.05}
ARMS = ("exact", "naive", "recompute")
QUICK_LR = 1e-3  # the random tiny model's: one update moves its logprobs past the bound
CALL_TOKENS = 96  # the forced call's budget: its text is fixed but for the key, ~25-70 tokens
PLOT_VENV = "plot-venv"  # in the cache (see plot())
MATPLOTLIB = "3.11.2"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the secret code of a key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
]
KEYS = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "tango"]
# The random-weight policy (--model tiny) never closes a free string, and llama-server fails
# a grammar-forced call it runs past ("empty grammar stack"): its key is an enum of KEYS.
KEY_ENUM = False


def tools() -> list[dict]:
    if not KEY_ENUM:
        return TOOLS
    t = json.loads(json.dumps(TOOLS))
    t[0]["function"]["parameters"]["properties"]["key"]["enum"] = KEYS
    return t


def code_of(key: str, seed: int) -> str:
    """The tool's answer: a code per key and seed (the reward's truth)."""
    return str(random.Random(f"{key}|{seed}").randrange(100, 1000))


def reward_of(reply: str, code: str, dense: bool) -> float:
    """1 when the reply holds the code. ``dense`` (--quick: a random-weight model never writes
    it) adds the share of the reply's characters that are letters, a verifiable score that
    differs between a group's samples, so GRPO's advantages, and the update, are not zero."""
    hit = float(code in re.findall(r"\d+", reply))
    if not dense:
        return hit
    return hit + sum(c.isalpha() for c in reply) / max(len(reply), 1)


async def rollout(
    session: turnstile.client.AsyncSession,
    key: str,
    code: str,
    seed: int,
    args: argparse.Namespace,
) -> dict:
    """The harness: the model must call ``lookup`` (forced), then reply with the code."""
    llm = openai.AsyncOpenAI(base_url=session.base_url, api_key="unused", max_retries=0)
    msgs: list[dict] = [
        {"role": "system", "content": "You answer with the tool's result."},
        {"role": "user", "content": f"What is the secret code of {key}? Use the lookup tool."},
    ]
    r = await llm.chat.completions.create(
        model="policy",
        messages=msgs,  # type: ignore[arg-type]
        tools=tools(),  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        max_tokens=CALL_TOKENS,
        temperature=1.0,
        seed=seed,
    )
    call = r.choices[0].message
    msgs.append(call.model_dump(exclude_none=True))
    if not call.tool_calls:  # cut off before the call closed: no answer to give, reward 0
        await session.set_reward(0.0)
        await session.close("no call")
        await llm.close()
        return {"messages": msgs, "reward": 0.0, "session": session.id}
    for tc in call.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": f"The code is {code}."})
    r = await llm.chat.completions.create(
        model="policy",
        messages=msgs,  # type: ignore[arg-type]
        tools=tools(),  # type: ignore[arg-type]
        max_tokens=args.max_tokens,
        temperature=1.0,
        seed=seed + 1,
    )
    msgs.append(r.choices[0].message.model_dump(exclude_none=True))
    reward = reward_of(msgs[-1].get("content") or "", code, args.reward == "dense")
    await session.set_reward(reward)
    await session.close("done")
    await llm.close()
    return {"messages": msgs, "reward": reward, "session": session.id}


async def collect(base: str, data: Path, name: str, args: argparse.Namespace) -> list:
    """One step's groups (``name``: arm, seed, step): ``tasks`` keys × ``group_size``
    rollouts, each with its exact trajectory and the messages the harness ended with. The
    keys and the sampling seeds depend on seed and step only: both arms roll out alike."""
    _, s, t = name.split("-")
    seed, step = int(s[1:]), int(t[1:])
    rng = random.Random(f"{seed}|{step}")
    keys = rng.sample(KEYS, args.tasks)
    async with turnstile.AsyncClient(base, data=data) as ts:
        jobs, meta = [], []
        for g, key in enumerate(keys):
            code = code_of(key, seed)
            for i in range(args.group_size):
                gid = f"{name}-g{g}"
                s = await ts.session({"key": key}, group_id=gid, sample_index=i)
                sample_seed = 10_000 * seed + 100 * step + 10 * g + 2 * i
                jobs.append(rollout(s, key, code, sample_seed, args))
                meta.append(gid)
        results = await asyncio.gather(*jobs)
        trajs = {}
        for gid in dict.fromkeys(meta):
            for t in await ts.group_trajectories(gid):
                # one trajectory per rollout: a second one is a segment break (a harness
                # change that rewrote history), which this loop must not pair by position
                assert t.session_id not in trajs, (t.segment_reason, t.segment_detail)
                trajs[t.session_id] = t
    return [
        {"group": gid, "traj": trajs[res["session"]], **res}
        for gid, res in zip(meta, results, strict=True)
    ]


def advantages(rewards: list[float], groups: list[str]) -> list[float]:
    """GRPO: reward minus its group's mean, over the group's std (0 where all are equal)."""
    out = []
    for r, g in zip(rewards, groups, strict=True):
        rs = np.array([x for x, h in zip(rewards, groups, strict=True) if h == g])
        out.append(float((r - rs.mean()) / (rs.std() + 1e-6)))
    return out


def where(traj: turnstile.Trajectory, f: int) -> str:
    """Token ``f`` of the stitched sequence, named by the call it belongs to: its prompt
    (what Turnstile sent) or its completion (what the engine sampled), and the index there."""
    for k, turn in enumerate(traj.turns):
        if turn["prompt_start"] <= f < turn["completion_start"]:
            return f"call {k} prompt token {f - turn['prompt_start']}"
        if turn["completion_start"] <= f < turn["completion_end"]:
            return f"call {k} completion token {f - turn['completion_start']}"
    return f"past the sampled end (token {f})"


def retokenized(row: dict, render, encode, decode) -> dict:
    """One rollout as a chat-level pipeline has it (``verify.rerendered``), held against the
    exact record: where the IDs first differ, which laid-on logprobs belong to another token
    than the one sampled for them, and which loss-bearing tokens were never sampled there."""
    t = row["traj"]
    ids = t.token_ids.tolist()
    turns = [t.logprobs[x["completion_start"] : x["completion_end"]] for x in t.turns]
    nids, npos, nlps = rerendered(render, encode, row["messages"], tools(), turns)
    n = min(len(ids), len(nids))
    f = next((i for i in range(n) if ids[i] != nids[i]), None)
    if f is None and len(nids) < len(ids):
        f = len(nids)  # (longer is the template's own "\n" after the last end-of-turn)
    # the laid-on logprobs: the i-th of a turn's run of positions is the engine's logprob of
    # the i-th token it sampled in that turn (rerendered's per-turn realignment)
    runs: list[list[int]] = []
    for q in npos:
        if runs and q == runs[-1][-1] + 1:
            runs[-1].append(q)
        else:
            runs.append([q])
    other = laid = 0
    for run, turn in zip(runs, t.turns, strict=False):
        sampled = ids[turn["completion_start"] : turn["completion_end"]]
        for i, q in enumerate(run[: len(sampled)]):
            laid += 1
            other += nids[q] != sampled[i]
    out = {
        "ids": nids,
        "positions": npos,
        "laid_on": nlps,
        "first_diff": None if f is None else where(t, f),
        "laid": laid,
        "laid_other": other,
        "example": "",
    }
    if f is not None:
        out["example"] = (
            f"sampled {[decode([i]) for i in ids[f : f + 3]]} / "
            f"re-tokenized {[decode([i]) for i in nids[f : f + 3]]}"
        )
    return out


def unsampled(ids: list[int], positions: list[int], sampled: set[tuple[int, int]]) -> int:
    """Loss-bearing tokens never sampled as such: (position, token) not among the record's
    sampled ones (the record's loss mask and IDs: what the engine actually sampled)."""
    return sum((p, ids[p]) not in sampled for p in positions)


def samples(
    rows: list[dict], arm: str, render, encode, decode, trainer: policy_gguf.Trainer
) -> tuple[list[dict], list[dict]]:
    """The trainer's batch for ``arm`` and, per sample, how its re-tokenized version differs
    from the record (measured on every arm's rollouts; only naive and recompute train on it)."""
    adv = advantages([r["reward"] for r in rows], [r["group"] for r in rows])
    batch, detail = [], []
    for r, a in zip(rows, adv, strict=True):
        t = r["traj"]
        pos = np.flatnonzero(t.loss_mask).tolist()
        ids = t.token_ids.tolist()
        sampled = {(p, ids[p]) for p in pos}
        re = retokenized(r, render, encode, decode)
        if arm in ("exact", "control"):
            # a token llama-server gave no logprob for (its text ends inside a UTF-8
            # character) is recorded as NaN, "logprob unknown": not trained on
            known = [p for p in pos if math.isfinite(t.logprobs[p])]
            s = {"ids": ids, "positions": known, "behaviour": t.logprobs[known].tolist()}
        elif arm == "naive":
            keep = [i for i, lp in enumerate(re["laid_on"]) if not math.isnan(lp)]
            s = {
                "ids": re["ids"],
                "positions": [re["positions"][i] for i in keep],
                "behaviour": [re["laid_on"][i] for i in keep],
            }
        else:  # recompute: the old policy's logprobs of the re-tokenized text, by the trainer
            s = {"ids": re["ids"], "positions": re["positions"]}
            [s["behaviour"]] = trainer.logprobs([s])
        s["behaviour"] = [float(x) for x in s["behaviour"]]
        batch.append({**s, "advantage": a})
        detail.append(
            {
                "group": r["group"],
                "reward": r["reward"],
                "advantage": a,
                "first_diff": re["first_diff"],
                "example": re["example"],
                "laid": re["laid"],
                "laid_other": re["laid_other"],
                "loss_tokens": len(s["positions"]),
                "unsampled": unsampled(s["ids"], s["positions"], sampled),
            }
        )
    return batch, detail


def mismatch(batch: list[dict], trainer: list[list[float]]) -> dict:
    """Train-behaviour mismatch over all loss-bearing tokens of the batch."""
    b = np.concatenate([np.asarray(s["behaviour"], float) for s in batch])
    n = np.concatenate([np.asarray(x, float) for x in trainer])
    log_ratio = n - b
    ratio = np.exp(np.clip(log_ratio, -20, 20))
    return {
        "tokens": int(len(b)),
        "mean_abs": float(np.mean(np.abs(log_ratio))),
        "max_abs": float(np.max(np.abs(log_ratio))),
        "kl": float(np.mean(np.expm1(-log_ratio) + log_ratio)),  # k3 of KL(behaviour‖trainer)
        "ratio_std": float(np.std(ratio)),
        "clip_frac": float(np.mean(np.abs(ratio - 1) > CLIP)),
    }


def write_policy(npz: Path, config: dict, setup: dict, out: Path) -> Path:
    """The weight sync: the trainer's saved tensors as a GGUF file for llama-server."""
    weights = dict(np.load(npz))
    return policy_gguf.write_gguf(weights, config, setup["vocab"], out, "f32", setup["template"])


def weight_change(before: Path, after: Path) -> dict:
    """How far an update moved the weights, from the trainer's own saved tensors: the largest
    element change and the change's norm relative to the weights'."""
    worst, d2, w2 = 0.0, 0.0, 0.0
    with np.load(before) as a, np.load(after) as b:
        for k in a.files:
            d = b[k].astype(np.float64) - a[k]
            worst = max(worst, float(np.max(np.abs(d))))
            d2 += float(np.sum(d * d))
            w2 += float(np.sum(np.square(a[k], dtype=np.float64)))
    return {"moved_max": worst, "moved_rel": math.sqrt(d2 / max(w2, 1e-30))}


def run_arm(
    arm: str,
    seed: int,
    args: argparse.Namespace,
    setup: dict,
    trainer: policy_gguf.Trainer,
    gw: dict,
    control: bool,
) -> list[dict]:
    """One training run: ``steps`` GRPO steps, the trainer started from the initial weights
    again, its weights synced to the engine (restarted on them, under the same gateway) every
    step. ``control``: then one more rollout with the last update's sync skipped (the engine
    still on the weights before it), scored by the updated trainer, without an update."""
    work = Path(tempfile.mkdtemp(prefix=f"train-proof-{arm}-{seed}-"))
    config = trainer.call("init", lr=args.lr, seed=seed, **setup["init"])["config"]
    npz = work / "weights-0.npz"
    trainer.call("save", path=str(npz))
    gguf = work / "policy.gguf"
    render, encode, decode = gw["render"], gw["encode"], gw["decode"]
    rows = []
    for step in range(args.steps + int(control)):
        stale = step == args.steps
        name = "control" if stale else arm
        t0 = time.monotonic()
        if not stale:
            write_policy(npz, config, setup, gguf)
        sync_s = time.monotonic() - t0
        with testbed.llama_server(gguf, ctx=4096, parallel=args.group_size, port=gw["port"]):
            t1 = time.monotonic()
            got = asyncio.run(collect(gw["base"], gw["data"], f"{name}-s{seed}-t{step}", args))
            rollout_s = time.monotonic() - t1
        t2 = time.monotonic()
        batch, detail = samples(got, name, render, encode, decode, trainer)
        moved: dict = {"moved_max": None, "moved_rel": None}
        if stale:
            lps = trainer.logprobs([{k: s[k] for k in ("ids", "positions")} for s in batch])
        else:
            lps = trainer.call("step", samples=batch, clip=CLIP)["trainer_logprobs"]
            after = work / f"weights-{step + 1}.npz"
            trainer.call("save", path=str(after))
            moved = weight_change(npz, after)
            npz.unlink()
            npz = after
        train_s = time.monotonic() - t2
        n = len(got)
        loss_tokens = sum(d["loss_tokens"] for d in detail)
        laid = sum(d["laid"] for d in detail)
        row = {
            "arm": name,
            "seed": seed,
            "step": step,
            "reward": float(np.mean([g["reward"] for g in got])),
            "samples": n,
            "signal": any(d["advantage"] != 0 for d in detail),
            "tokens_differ": sum(d["first_diff"] is not None for d in detail) / n,
            "unsampled": sum(d["unsampled"] for d in detail) / max(loss_tokens, 1),
            "laid_other": sum(d["laid_other"] for d in detail) / max(laid, 1),
            **mismatch(batch, lps),
            **moved,
            "sync_s": round(sync_s, 1),
            "rollout_s": round(rollout_s, 1),
            "train_s": round(train_s, 1),
            "per_sample": detail,
        }
        rows.append(row)
        moved_s = "" if stale else f" moved {row['moved_max']:.2g}"
        print(
            f"[{name} seed {seed} step {step}] reward {row['reward']:.2f} "
            f"differ {row['tokens_differ']:.2f} unsampled {row['unsampled']:.3f} "
            f"mean|Δ| {row['mean_abs']:.4f} max|Δ| {row['max_abs']:.3g} "
            f"clip {row['clip_frac']:.3f}{moved_s} "
            f"({row['sync_s']}+{row['rollout_s']}+{row['train_s']} s)",
            flush=True,
        )
        for i, d in enumerate(detail):
            print(
                f"    sample {i} ({d['group']}) reward {d['reward']:.2f}: first differs at "
                f"{d['first_diff'] or 'nowhere'} {d['example']}; laid-on logprobs of another "
                f"token {d['laid_other']}/{d['laid']}; loss tokens never sampled as such "
                f"{d['unsampled']}/{d['loss_tokens']}",
                flush=True,
            )
    gguf.unlink(missing_ok=True)
    npz.unlink(missing_ok=True)
    return rows


def checks(rows: list[dict], args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    """What the run must show, each able to fail: (what, held, the figure)."""
    bound = BOUND[args.model]
    out = []
    by = {a: [r for r in rows if r["arm"] == a] for a in (*ARMS, "control")}
    if by["exact"]:
        worst = max(r["max_abs"] for r in by["exact"])
        out.append(
            (
                f"exact: trainer vs engine logprobs, max |Δ| <= {bound}",
                worst <= bound,
                f"{worst:.3g}",
            )
        )
        clip = max(r["clip_frac"] for r in by["exact"])
        out.append(("exact: no token clipped", clip == 0, f"{clip:.2%}"))
        un = max(r["unsampled"] for r in by["exact"])
        out.append(("exact: every loss token was sampled there", un == 0, f"{un:.2%}"))
    if by["recompute"]:
        worst = max(r["max_abs"] for r in by["recompute"])
        out.append(
            (
                "recompute: old logprobs are the trainer's own (ratio 1)",
                worst <= 1e-5,
                f"{worst:.2g}",
            )
        )
    updates = [r for r in rows if r["arm"] != "control"]
    with_signal = [r for r in updates if r["signal"]]
    out.append(
        (
            "some update had a non-zero advantage",
            bool(with_signal),
            f"{len(with_signal)}/{len(updates)} updates",
        )
    )
    still = [f"{r['arm']} s{r['seed']} t{r['step']}" for r in with_signal if not r["moved_max"]]
    out.append(
        (
            "the weights moved at every update with a non-zero advantage",
            bool(with_signal) and not still,
            f"smallest max |Δw| {min((r['moved_max'] for r in with_signal), default=0):.3g}"
            + (f"; unmoved: {', '.join(still)}" if still else ""),
        )
    )
    if args.control:
        ctl = by["control"]
        least = min((r["max_abs"] for r in ctl), default=0.0)
        out.append(
            (
                f"negative control (last sync skipped) trips the bound: max |Δ| > {bound}",
                bool(ctl) and least > bound,
                f"{least:.3g} over {len(ctl)} run(s)",
            )
        )
    return out


def table(rows: list[dict]) -> str:
    """Per arm, means over seeds and steps (max: the worst of all). "re-tokenized differs":
    the share of samples whose re-tokenized IDs are not the sampled ones; "never sampled":
    the share of the arm's loss-bearing tokens not sampled at that place (what naive and
    recompute train on); "laid-on, other token": the share of the engine's logprobs that
    rerendered lays on another token than the one they were sampled for (naive trains on
    them); "control" is the exact arm's extra rollout after its last update, sync skipped."""
    out = [
        "| arm | samples | re-tokenized differs | never sampled | laid-on, other token "
        "| mean abs Δ logprob | KL (k3) | max abs Δ | ratio std | clip frac "
        "| reward (first step) | reward (last step) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in (*ARMS, "control"):
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        last = max(r["step"] for r in rs)
        first = [r["reward"] for r in rs if r["step"] == min(r["step"] for r in rs)]
        final = [r["reward"] for r in rs if r["step"] == last]
        m = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if isinstance(rs[0][k], float)}
        laid = f"{m['laid_other']:.1%}" if arm == "naive" else "(not used)"
        out.append(
            f"| {arm} | {sum(r['samples'] for r in rs)} | {m['tokens_differ']:.0%} "
            f"| {m['unsampled']:.1%} | {laid} "
            f"| {m['mean_abs']:.2e} | {m['kl']:.2e} | {max(r['max_abs'] for r in rs):.3g} "
            f"| {m['ratio_std']:.3g} | {m['clip_frac']:.2%} | {np.mean(first):.2f} "
            f"| {np.mean(final):.2f} |"
        )
    return "\n".join(out)


def per_step(rows: list[dict]) -> str:
    """Per arm and step, means over seeds."""
    out = [
        "| arm | step | reward | mean abs Δ | max abs Δ | clip frac | never sampled "
        "| weights moved (max abs Δw, rel) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in (*ARMS, "control"):
        for step in sorted({r["step"] for r in rows if r["arm"] == arm}):
            rs = [r for r in rows if r["arm"] == arm and r["step"] == step]
            moved = [r for r in rs if r["moved_max"] is not None]
            mv = (
                f"{max(r['moved_max'] for r in moved):.2g}, "
                f"{np.mean([r['moved_rel'] for r in moved]):.2g}"
                if moved
                else "(no update)"
            )
            out.append(
                f"| {arm} | {step} | {np.mean([r['reward'] for r in rs]):.2f} "
                f"| {np.mean([r['mean_abs'] for r in rs]):.2e} "
                f"| {max(r['max_abs'] for r in rs):.3g} "
                f"| {np.mean([r['clip_frac'] for r in rs]):.1%} "
                f"| {np.mean([r['unsampled'] for r in rs]):.1%} | {mv} |"
            )
    return "\n".join(out)


def where_table(rows: list[dict]) -> str:
    """Where the re-tokenized version first differs, over every sample of the run: counted
    by call and part, with the token indexes seen."""
    seen: dict[str, list[int]] = {}
    total = 0
    for r in rows:
        for d in r["per_sample"]:
            total += 1
            loc = d["first_diff"] or "nowhere (identical IDs)"
            part, _, idx = loc.partition(" token ")
            seen.setdefault(part, []).append(int(idx) if idx.isdigit() else -1)
    out = ["| first differs in | samples | token indexes there |", "|---|---|---|"]
    for part, idx in sorted(seen.items(), key=lambda kv: -len(kv[1])):
        shown = sorted(set(i for i in idx if i >= 0))
        rng = f"{shown[0]}-{shown[-1]}" if len(shown) > 1 else (str(shown[0]) if shown else "-")
        out.append(f"| {part} | {len(idx)}/{total} | {rng} |")
    return "\n".join(out)


def per_sample(rows: list[dict]) -> str:
    """Every sample: where its re-tokenized version first differs, and the tokens there."""
    out = [
        "| arm | seed | step | sample | first differs at | tokens there |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for i, d in enumerate(r["per_sample"]):
            ex = d["example"].replace("|", "\\|")
            out.append(
                f"| {r['arm']} | {r['seed']} | {r['step']} | {i} "
                f"| {d['first_diff'] or 'nowhere'} | {ex} |"
            )
    return "\n".join(out)


_PLOT = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = json.load(open(sys.argv[1]))["rows"]
fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
panels = [("mean_abs", "mean |Δ logprob| (train vs behaviour)", True),
          ("clip_frac", "clip fraction (|ratio-1| > 0.2)", False),
          ("max_abs", "max |Δ logprob|", True), ("reward", "mean reward", False)]
colors = {"exact": "tab:blue", "naive": "tab:red", "recompute": "tab:green"}
for ax, (key, title, log) in zip(axes, panels):
    for arm in colors:
        seeds = sorted({r["seed"] for r in rows if r["arm"] == arm})
        for i, s in enumerate(seeds):
            rs = sorted((r for r in rows if r["arm"] == arm and r["seed"] == s),
                        key=lambda r: r["step"])
            ys = [max(r[key], 1e-7) if log else r[key] for r in rs]
            ax.plot([r["step"] for r in rs], ys, color=colors[arm], alpha=0.7, marker="o",
                    ms=3, label=arm if i == 0 else None)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("GRPO step")
    if log:
        ax.set_yscale("log")
axes[0].legend()
fig.suptitle(sys.argv[3], fontsize=10)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
"""


def plot(result: Path, png: Path, title: str) -> None:
    """The PNG, drawn by matplotlib in its own venv (``~/.cache/turnstile/plot-venv``,
    ``pip install matplotlib==3.11.2``) so neither the runtime nor the trainers venv changes."""
    venv = testbed.cache_dir() / PLOT_VENV
    python = venv / "bin" / "python"
    if not python.exists():  # made once, pinned, in the cache (outside the repository)
        print(f"creating {venv} (matplotlib {MATPLOTLIB})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"matplotlib=={MATPLOTLIB}"], check=True
        )
    subprocess.run([str(python), "-c", _PLOT, str(result), str(png), title], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 seed, 2 steps")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2, help="groups (keys) per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--reward", choices=["code", "dense"], default="code")
    ap.add_argument(
        "--control-seeds",
        type=int,
        default=1,
        help="the exact arm of this many seeds adds the negative control (0: none)",
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--plot", type=Path, help="write the PNG here (docs/train_proof.png)")
    args = ap.parse_args()
    if args.quick:
        args.model, args.seeds, args.steps, args.tasks, args.group_size = "tiny", 1, 2, 1, 3
        args.max_tokens, args.reward, args.lr = 16, "dense", QUICK_LR
    args.control = args.control_seeds > 0 and "exact" in args.arms.split(",")
    template = (testbed.templates_dir() / f"{QWEN25}.jinja").read_text()
    vocab = testbed.smollm2_gguf()
    if args.model == "tiny":  # random weights on SmolLM2's vocabulary (49152: a fast step)
        global KEY_ENUM
        KEY_ENUM = True
        tokens = next(
            v for k, _, v in policy_gguf.tokenizer_fields(vocab) if k == "tokenizer.ggml.tokens"
        )
        config = policy_gguf.tiny_config(len(tokens))  # type: ignore[arg-type]
        npz = Path(tempfile.mkdtemp(prefix="train-proof-init-")) / "init.npz"
        np.savez(npz, **policy_gguf.random_weights(config, seed=0))
        init: dict = {"config": config, "weights": str(npz)}
    else:
        init = {"hf": str(vllm_model())}
    testbed.llama_server_binary()
    setup = {"init": init, "vocab": vocab, "template": template}
    t0 = time.monotonic()
    rows = []
    trainer = policy_gguf.Trainer(trainers_python(), lr=args.lr, **init)
    server = None
    work = Path(tempfile.mkdtemp(prefix="train-proof-"))
    try:
        # one gateway for the whole run, built on the initial weights; each step's engine
        # restarts on its port under it
        trainer.call("save", path=str(work / "initial.npz"))
        gguf = write_policy(work / "initial.npz", trainer.config, setup, work / "initial.gguf")
        gw: dict = {"port": testbed.free_port(), "data": work / "data"}
        with testbed.llama_server(gguf, ctx=4096, port=gw["port"]) as url:
            gateway = build_gateway(url, str(gguf), gw["data"], model_name="policy")
        port = testbed.free_port()
        gw["base"] = f"http://127.0.0.1:{port}"
        token = load_or_create_token(gw["data"])[0]
        server = serve_in_thread(create_app(gateway, gw["base"], token=token), port)
        gw["render"], gw["encode"] = gateway.renderer.render, gateway.renderer.encoder.encode
        gw["decode"] = gateway.tok.decode
        for seed in range(args.seeds):
            for arm in args.arms.split(","):
                control = arm == "exact" and seed < args.control_seeds
                rows += run_arm(arm, seed, args, setup, trainer, gw, control)
    finally:
        if server is not None:
            server.stop()
        trainer.close()
        for name in ("initial.npz", "initial.gguf"):  # 1.2 GB for SmolLM2; the store stays
            (work / name).unlink(missing_ok=True)
    wall = time.monotonic() - t0
    print(
        f"\ntrain_proof: {args.model}, {args.seeds} seeds x {args.steps} steps x "
        f"{args.tasks} groups of {args.group_size}, lr {args.lr:g}, reward {args.reward}, "
        f"{wall:.0f} s\n"
    )
    print(table(rows))
    print("\nPer step (means over seeds; max: the worst):\n")
    print(per_step(rows))
    print("\nWhere the re-tokenized version first differs (all arms' samples):\n")
    print(where_table(rows))
    print("\nPer sample:\n")
    print(per_sample(rows))
    verdict = checks(rows, args)
    print("\nChecks:")
    for what, ok, figure in verdict:
        print(f"  {'PASS' if ok else 'FAIL'}  {what} ({figure})")
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "wall_s": wall,
        "rows": rows,
        "checks": [{"check": w, "ok": ok, "figure": f} for w, ok, f in verdict],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot:
        tmp = Path(tempfile.mkdtemp()) / "rows.json"
        tmp.write_text(json.dumps(result))
        title = (
            f"GRPO on {args.model} through Turnstile + llama-server: exact records vs "
            f"re-tokenized ({args.seeds} seeds)"
        )
        plot(tmp, args.plot, title)
    failed = [w for w, ok, _ in verdict if not ok]
    print("\nRESULT " + json.dumps({"wall_s": round(wall), "rows": len(rows), "failed": failed}))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
