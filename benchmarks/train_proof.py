"""Does training on exact records matter? A small GRPO loop on the CPU, two arms from the same
seeds: the trainer consumes Turnstile's exact records, or what a chat-level pipeline has (the
messages the harness holds, rendered through the template and encoded again, the engine's
logprobs laid on by position).

Each step: the policy's weights (PyTorch, ``tests/trainers/policy.py`` in the trainers venv)
are written as a GGUF and llama-server is restarted on them (a real weight sync); a group of
two-turn tool rollouts per task runs through Turnstile (the official ``openai`` client: a
forced ``lookup`` call, the tool's answer, then a free reply); the reward is verifiable (does
the reply hold the code the tool returned?); GRPO advantages per group; one PPO-clip update
with the engine's logprobs as the old policy's (as decoupled trainers do), so the ratio at
the update is exactly the train-behaviour mismatch.

Per step and arm it records the share of samples whose re-tokenized IDs differ from the
sampled ones, the mismatch between the trainer's logprobs and the behaviour logprobs it was
given (mean |Δ|, k3 KL, max |Δ|), the importance ratio's spread and clip fraction, and the
mean reward; prints a table, writes JSON and a plot (``docs/train_proof.png``).

    ~/.cache/turnstile/venv/bin/python -m benchmarks.train_proof [--quick]  # from the root

(``-m`` from the root makes ``benchmarks`` and ``tests`` importable, for ``policy_gguf`` and the
trainers venv.)
        [--model tiny|smollm2] [--seeds 3] [--steps 6] [--tasks 2] [--group-size 4]
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
from turnstile import testbed
from turnstile.auth import load_or_create_token
from turnstile.demo import serve_in_thread
from turnstile.server.app import create_app
from turnstile.testbed_trainers import trainers_python
from turnstile.verify import rerendered
from turnstile.wiring import build_gateway

QWEN25 = "Qwen-Qwen2.5-7B-Instruct"  # the template (hermes tool calls) for both policies
CLIP = 0.2
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


async def rollout(
    session: turnstile.client.AsyncSession, key: str, code: str, seed: int, max_tokens: int
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
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed + 1,
    )
    msgs.append(r.choices[0].message.model_dump(exclude_none=True))
    final = msgs[-1].get("content") or ""
    reward = float(code in re.findall(r"\d+", final))
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
                jobs.append(rollout(s, key, code, sample_seed, args.max_tokens))
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


def samples(
    rows: list[dict], arm: str, render, encode, decode, show: bool = False
) -> tuple[list[dict], dict]:
    """The trainer's batch for ``arm``, and how many samples re-tokenize differently: in all,
    first in the tool call's turn, first in the reply's."""
    adv = advantages([r["reward"] for r in rows], [r["group"] for r in rows])
    batch, differ = [], {"all": 0, "call": 0, "reply": 0}
    for r, a in zip(rows, adv, strict=True):
        t = r["traj"]
        pos = np.flatnonzero(t.loss_mask).tolist()
        exact = {"ids": t.token_ids.tolist(), "positions": pos, "behaviour": t.logprobs[pos]}
        turns = [t.logprobs[x["completion_start"] : x["completion_end"]] for x in t.turns]
        nids, npos, nlps = rerendered(render, encode, r["messages"], tools(), turns)
        # what the trainer trains on is not what was sampled (the template's own "\n" after
        # the last end-of-turn is not a difference)
        ids = exact["ids"]
        if nids[: len(ids)] != ids or npos[: len(pos)] != pos:
            differ["all"] += 1
            f = next((i for i, (a, b) in enumerate(zip(ids, nids, strict=False)) if a != b), 0)
            differ[
                "call" if len(t.turns) > 1 and f < t.turns[1]["completion_start"] else "reply"
            ] += 1
            if show:
                show = False
                print(
                    f"  e.g. sampled {decode(ids[f : f + 6])!r} {ids[f : f + 6]} / "
                    f"re-tokenized {decode(nids[f : f + 6])!r} {nids[f : f + 6]}",
                    flush=True,
                )
        if arm == "exact":
            s = exact
        else:
            keep = [i for i, lp in enumerate(nlps) if not math.isnan(lp)]
            s = {
                "ids": nids,
                "positions": [npos[i] for i in keep],
                "behaviour": [nlps[i] for i in keep],
            }
        s["behaviour"] = [float(x) for x in s["behaviour"]]
        batch.append({**s, "advantage": a})
    return batch, differ


def mismatch(batch: list[dict], trainer: list[list[float]]) -> dict:
    """Train-behaviour mismatch over all sampled tokens of the batch."""
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


def sync(trainer: policy_gguf.Trainer, config: dict, setup: dict, out: Path) -> Path:
    """The weight sync: the trainer's tensors to a GGUF file for llama-server."""
    npz = out.with_suffix(".npz")
    trainer.call("save", path=str(npz))
    weights = dict(np.load(npz))
    return policy_gguf.write_gguf(weights, config, setup["vocab"], out, "f32", setup["template"])


def run_arm(
    arm: str,
    seed: int,
    args: argparse.Namespace,
    setup: dict,
    trainer: policy_gguf.Trainer,
    gw: dict,
) -> list[dict]:
    """One training run: ``steps`` GRPO steps, the trainer started from the initial weights
    again, its weights synced to the engine (restarted on them, under the same gateway) every
    step."""
    work = Path(tempfile.mkdtemp(prefix=f"train-proof-{arm}-{seed}-"))
    config = trainer.call("init", lr=args.lr, seed=seed, **setup["init"])["config"]
    rows = []
    for step in range(args.steps):
        t0 = time.monotonic()
        gguf = sync(trainer, config, setup, work / f"policy-{step % 2}.gguf")
        sync_s = time.monotonic() - t0
        with testbed.llama_server(gguf, ctx=4096, parallel=args.group_size, port=gw["port"]):
            t1 = time.monotonic()
            got = asyncio.run(collect(gw["base"], gw["data"], f"{arm}-s{seed}-t{step}", args))
            rollout_s = time.monotonic() - t1
        render, encode, decode = gw["render"], gw["encode"], gw["decode"]
        batch, differ = samples(got, arm, render, encode, decode, show=step == 0)
        t2 = time.monotonic()
        out = trainer.call("step", samples=batch, clip=CLIP)
        train_s = time.monotonic() - t2
        row = {
            "arm": arm,
            "seed": seed,
            "step": step,
            "reward": float(np.mean([g["reward"] for g in got])),
            "samples": len(got),
            "tokens_differ": differ["all"] / len(got),
            "differ_in_call": differ["call"] / len(got),
            "differ_in_reply": differ["reply"] / len(got),
            **mismatch(batch, out["trainer_logprobs"]),
            "sync_s": round(sync_s, 1),
            "rollout_s": round(rollout_s, 1),
            "train_s": round(train_s, 1),
        }
        rows.append(row)
        print(
            f"[{arm} seed {seed} step {step}] reward {row['reward']:.2f} "
            f"differ {row['tokens_differ']:.2f} mean|Δ| {row['mean_abs']:.4f} "
            f"max|Δ| {row['max_abs']:.3f} clip {row['clip_frac']:.3f} "
            f"({row['sync_s']}+{row['rollout_s']}+{row['train_s']} s)",
            flush=True,
        )
    return rows


def table(rows: list[dict]) -> str:
    """Per arm, means over seeds and steps (max: the worst of all). "re-tokenized differs":
    the share of the arm's samples whose re-rendered IDs are not the sampled ones (what the
    naive arm trains on; the exact arm never uses them)."""
    out = [
        "| arm | samples | re-tokenized differs | mean abs Δ logprob | KL (k3) | max abs Δ "
        "| ratio std | clip frac | reward (first step) | reward (last step) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ("exact", "naive"):
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        last = max(r["step"] for r in rs)
        first = [r["reward"] for r in rs if r["step"] == 0]
        final = [r["reward"] for r in rs if r["step"] == last]
        m = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if isinstance(rs[0][k], float)}
        out.append(
            f"| {arm} | {sum(r['samples'] for r in rs)} | {m['tokens_differ']:.0%} "
            f"| {m['mean_abs']:.2e} | {m['kl']:.2e} | {max(r['max_abs'] for r in rs):.3g} "
            f"| {m['ratio_std']:.3g} | {m['clip_frac']:.2%} | {np.mean(first):.2f} "
            f"| {np.mean(final):.2f} |"
        )
    return "\n".join(out)


_PLOT = """
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
rows = json.load(open(sys.argv[1]))["rows"]
fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
panels = [("mean_abs", "mean |Δ logprob| (train vs behaviour)", True),
          ("clip_frac", "clip fraction (|ratio-1| > 0.2)", False),
          ("max_abs", "max |Δ logprob|", True), ("reward", "mean reward", False)]
colors = {"exact": "tab:blue", "naive": "tab:red"}
for ax, (key, title, log) in zip(axes, panels):
    for arm in ("exact", "naive"):
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
    ap.add_argument("--arms", default="exact,naive")
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2, help="groups (keys) per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--plot", type=Path, help="write the PNG here (docs/train_proof.png)")
    args = ap.parse_args()
    if args.quick:
        args.model, args.seeds, args.steps, args.tasks, args.group_size = "tiny", 1, 2, 1, 3
        args.max_tokens = 16
    template = (testbed.templates_dir() / f"{QWEN25}.jinja").read_text()
    if args.model == "tiny":  # random weights on SmolLM2's vocabulary (49152: a fast step)
        global KEY_ENUM
        KEY_ENUM = True
        vocab = testbed.smollm2_gguf()
        n_vocab = len(
            next(
                v for k, _, v in policy_gguf.tokenizer_fields(vocab) if k == "tokenizer.ggml.tokens"
            )
        )  # type: ignore[arg-type]
        config = policy_gguf.tiny_config(n_vocab)
        npz = Path(tempfile.mkdtemp(prefix="train-proof-init-")) / "init.npz"
        np.savez(npz, **policy_gguf.random_weights(config, seed=0))
        init: dict = {"config": config, "weights": str(npz)}
    else:
        vocab = testbed.smollm2_gguf()
        init = {"hf": str(testbed.vllm_model())}
    testbed.llama_server_binary()
    setup = {"init": init, "vocab": vocab, "template": template}
    t0 = time.monotonic()
    rows = []
    trainer = policy_gguf.Trainer(trainers_python(), lr=args.lr, **init)
    server = None
    try:
        # one gateway for the whole run, built on the initial weights; each step's engine
        # restarts on its port under it
        work = Path(tempfile.mkdtemp(prefix="train-proof-"))
        gguf = sync(trainer, trainer.config, setup, work / "initial.gguf")
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
                rows += run_arm(arm, seed, args, setup, trainer, gw)
    finally:
        if server is not None:
            server.should_exit = True
        trainer.close()
    wall = time.monotonic() - t0
    print(
        f"\ntrain_proof: {args.model}, {args.seeds} seeds x {args.steps} steps x "
        f"{args.tasks} groups of {args.group_size}, {wall:.0f} s\n"
    )
    print(table(rows))
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall, "rows": rows}
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
    print("\nRESULT " + json.dumps({"wall_s": round(wall), "rows": len(rows)}))


if __name__ == "__main__":
    main()
