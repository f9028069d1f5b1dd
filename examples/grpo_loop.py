"""A GRPO-style data path, end to end on a CPU: rollouts through Turnstile → rewards → a
trainer batch.

1. llama-server runs a small model (SmolLM2-135M-Instruct, or ``--model tiny``: random
   weights on the Qwen2 vocabulary); Turnstile runs in-process in front of it.
2. For each task, a *group* of sessions is opened (``group_id`` = the task, ``sample_index`` =
   the repetition); a two-turn harness (the official ``openai`` client, unchanged) runs each
   rollout concurrently through its session's base URL.
3. A rule-based reward (is the right number in the final answer? is it short?) is attached to
   each session as a scalar plus named components, and the session is closed.
4. The group's trajectories are fetched as numpy arrays, GRPO advantages are computed per
   group, and the batch is converted to verl's padded format; its shapes are printed.

    ~/.cache/turnstile/venv/bin/python examples/grpo_loop.py [--model tiny] [--groups 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
from pathlib import Path

import numpy as np
import openai

import turnstile
import turnstile_testbed as testbed
from turnstile.app.wiring import build_gateway
from turnstile.auth import load_or_create_token
from turnstile.converters import grpo_advantages
from turnstile.converters.verl import to_verl_batch
from turnstile.server.app import create_app
from turnstile_testbed.demo import serve_in_thread

TASKS = [
    ("What is 3 + 5?", "8"),
    ("What is 12 minus 4?", "8"),
    ("What is 2 times 6?", "12"),
    ("What is 9 + 10?", "19"),
]
QWEN25_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct"


async def rollout(
    session: turnstile.client.AsyncSession, question: str, answer: str, max_tokens: int
) -> float:
    """The harness: plain OpenAI chat against the session's base URL, then the reward."""
    llm = openai.AsyncOpenAI(base_url=session.base_url, api_key="unused", max_retries=0)
    msgs: list[dict] = [{"role": "user", "content": question}]
    for follow_up in ("Answer with just the number.", None):
        r = await llm.chat.completions.create(
            model="policy",
            messages=msgs,
            max_tokens=max_tokens,
            temperature=1.0,
            seed=1000 * (session.sample_index or 0) + len(msgs),
        )
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
        if follow_up:
            msgs.append({"role": "user", "content": follow_up})
    final = msgs[-1].get("content") or ""
    correct = float(answer in re.findall(r"-?\d+", final))
    brevity = float(len(final) <= 40)
    reward = correct + 0.1 * brevity
    await session.set_reward(reward, rewards={"correct": correct, "brevity": brevity})
    await session.close("done")
    await llm.close()
    return reward


async def collect(base: str, data: Path, groups: int, group_size: int, max_tokens: int) -> list:
    async with turnstile.AsyncClient(base, data=data) as ts:  # the trainer token under data
        jobs = []
        for g, (question, answer) in enumerate(TASKS[:groups]):
            for i in range(group_size):
                s = await ts.session(
                    {"question": question, "answer": answer},
                    group_id=f"task-{g}",
                    sample_index=i,
                    task_id=f"task-{g}",
                )
                jobs.append(rollout(s, question, answer, max_tokens))
        await asyncio.gather(*jobs)
        trajs = []
        for g in range(min(groups, len(TASKS))):
            trajs += await ts.group_trajectories(f"task-{g}")
        return trajs


def main() -> None:
    ap = argparse.ArgumentParser(description="GRPO-style data path through Turnstile")
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--groups", type=int, default=2, help=f"tasks (at most {len(TASKS)})")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per task")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--data", help="record store directory (default: a temporary one)")
    args = ap.parse_args()

    model = (
        testbed.smollm2_gguf()
        if args.model == "smollm2"
        else testbed.tiny_model("qwen2", QWEN25_TEMPLATE)
    )
    testbed.llama_server_binary()
    data = Path(args.data or tempfile.mkdtemp(prefix="turnstile-grpo-"))
    with testbed.llama_server(model, ctx=4096, parallel=4) as engine_url:
        gateway = build_gateway(engine_url, str(model), data, model_name="policy")
        port = testbed.free_port()
        base = f"http://127.0.0.1:{port}"
        app = create_app(gateway, base, token=load_or_create_token(data)[0])
        with serve_in_thread(app, port):  # stopped (and joined) before the process exits
            trajs = asyncio.run(collect(base, data, args.groups, args.group_size, args.max_tokens))
    tok = gateway.tok
    pad_id = (
        tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else tok.eos_token_id
    )
    adv = grpo_advantages(trajs)
    # This batch is the whole batch (no verl prompt batch to union with): write the GRPO uid.
    batch = to_verl_batch(trajs, pad_token_id=pad_id, with_uid=True)

    print(f"\n{len(trajs)} trajectories in {args.groups} groups, records in {data}\n")
    print(
        f"{'group':<8} {'sample':>6} {'turns':>5} {'tokens':>6} {'sampled':>7} "
        f"{'reward':>6} {'advantage':>9}"
    )
    for t, a in zip(trajs, adv, strict=True):
        print(
            f"{t.group_id:<8} {t.sample_index:>6} {t.num_turns:>5} {len(t):>6} "
            f"{int(t.loss_mask.sum()):>7} {t.reward:>6.2f} {a:>9.3f}"
        )
    print("\nverl batch (DataProto tensors):")
    shapes = {k: list(v.shape) for k, v in batch["batch"].items()}
    for k, v in batch["batch"].items():
        print(f"  {k:<18} {str(tuple(v.shape)):<12} {v.dtype}")
    print("non-tensor: uid =", list(batch["non_tensor_batch"]["uid"]))
    print(
        "RESULT "
        + json.dumps(
            {
                "shapes": shapes,
                "n": len(trajs),
                "uids": list(batch["non_tensor_batch"]["uid"]),
                "rewards": [t.reward for t in trajs],
                "advantages": np.round(adv, 4).tolist(),
            }
        )
    )


if __name__ == "__main__":
    main()
