"""TRL's own ``GRPOTrainer`` trains on Turnstile sessions: multi-turn tool rollouts through
Turnstile (token-in mode), the trainer's loss on the token IDs, loss mask and behaviour
logprobs Turnstile recorded, the weights synced to the engine between steps.

TRL 1.16's hook for this is ``GRPOTrainer(rollout_func=...)``: TRL calls
``rollout_func(prompts, trainer)`` once per generation batch (``prompts``: the batch's dataset
prompts, each repeated ``num_generations`` times, in order) and trains on what it returns.
:class:`TurnstileRollouts` is that function:

1. **Weight sync** (first, when ``trainer.state.global_step`` moved since the last sync, as TRL
   does for its own vLLM client): ``POST /admin/pause`` (Turnstile stops admitting calls and
   drains), the trainer's weights saved with ``save_pretrained`` and handed to ``sync`` (your
   engine's reload: ``--sync-command`` runs a shell command with ``{weights}`` and
   ``{version}``, e.g. convert to GGUF and restart llama-server, or call vLLM's weight-update
   endpoint), then ``POST /admin/resume {"weight_version": "<global_step>"}``: every token
   sampled after it is recorded with that policy version.
2. **Rollouts**: one Turnstile session per entry of ``prompts`` (``group_id`` per prompt,
   ``sample_index`` per repetition); the harness is any OpenAI-compatible client pointed at
   the session's ``base_url``. Here a two-turn tool task: a forced ``lookup(key)`` call, the
   tool's answer, a free reply; its reward (does the reply hold the code? plus a dense share
   of letters, so a tiny model's groups differ) is posted to the session.
3. **Hand-off**: the groups' trajectories from Turnstile, converted by
   :func:`turnstile.converters.trl.to_trl_rollout` in the order of ``prompts``:
   ``prompt_ids`` (the first prompt), ``completion_ids`` (every later token: sampled turns
   and the tool's tokens, as the engine saw them), ``logprobs`` (the engine's, per completion
   token: TRL's ``sampling_per_token_logps``), ``env_mask`` (TRL's ``tool_mask``: 0 on the
   tool's tokens, so they carry no loss), and per-row fields TRL hands the reward functions
   (``reward``, ``versions``, ``session_id``, ...).

TRL computes its own loss on those tensors. The behaviour logprobs enter it through
``GRPOConfig.off_policy_mask_threshold`` (TRL's off-policy sequence mask compares them with the
trainer's logprobs; with ``use_vllm`` they would also feed its importance-sampling
correction, which this CPU example does not use).

Run it in a venv with ``trl==1.16.0`` (transformers, torch, accelerate, datasets) and this
repository on ``PYTHONPATH`` (the client and converters need only httpx and numpy), against a
running ``turnstile serve`` whose engine serves the same weights as ``--model``::

    PYTHONPATH=. python examples/trl_grpo.py --turnstile http://127.0.0.1:8400 \\
        --token "$(cat DATA/turnstile.token)" --model ./policy-hf --steps 2 \\
        --sync-command './reload-engine.sh {weights} {version}'

``--token``: the trainer token (``DATA/turnstile.token`` of the server's ``--data``, or
``$TURNSTILE_TOKEN``). ``--model``: a Hugging Face folder holding the weights the engine serves
at the start (the first sync reloads the engine from it anyway). A working ``--sync-command``
for llama-server is ``tests/trainers/trl_engine.py {weights} --port P --state DIR`` (the
folder as an F32 GGUF, llama-server restarted on it on the same port, so Turnstile's engine
URL stays valid).

``tests/test_trl_grpo.py`` runs it on the CPU against llama-server (a tiny random-weight
Llama, its GGUF rewritten and the server restarted at each sync) and checks TRL's own batch
tensors against what the engine received and returned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

import turnstile
from turnstile.converters.trl import to_trl_rollout

KEYS = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "tango"]
# The key is an enum: a tiny random-weight policy never closes a free string, and the grammar
# of the forced call keeps its text valid.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the secret code of a key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "enum": KEYS}},
                "required": ["key"],
            },
        },
    }
]

Sync = Callable[[Any, str], None]  # (trainer, version) -> None, the engine runs the new weights


def code_of(key: str) -> str:
    """The tool's answer (the reward's truth)."""
    return str(random.Random(key).randrange(100, 1000))


def reward_of(reply: str, code: str) -> float:
    """1 when the reply holds the code, plus the share of its characters that are letters."""
    hit = float(code in re.findall(r"\d+", reply))
    return hit + sum(c.isalpha() for c in reply) / max(len(reply), 1)


async def lookup_rollout(
    session: turnstile.client.AsyncSession, key: str, seed: int, max_tokens: int = 16
) -> float:
    """The harness: plain Chat Completions on the session's base URL. Turn 1 must call
    ``lookup`` (forced), the tool answers, turn 2 replies freely. Returns the reward."""
    msgs: list[dict] = [
        {"role": "system", "content": "You answer with the tool's result."},
        {"role": "user", "content": f"What is the secret code of {key}? Use the lookup tool."},
    ]
    async with httpx.AsyncClient(base_url=session.base_url, timeout=120) as http:

        async def chat(**kw: Any) -> dict:
            body = {"model": "policy", "messages": msgs, "tools": TOOLS, "temperature": 1.0}
            r = await http.post("/chat/completions", json={**body, **kw})
            r.raise_for_status()
            return r.json()["choices"][0]["message"]

        call = await chat(
            tool_choice={"type": "function", "function": {"name": "lookup"}},
            max_tokens=96,
            seed=seed,
        )
        msgs.append(call)
        reward = 0.0
        if call.get("tool_calls"):
            for tc in call["tool_calls"]:
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": f"The code is {code_of(key)}.",
                    }
                )
            reply = await chat(max_tokens=max_tokens, seed=seed + 1)
            msgs.append(reply)
            reward = reward_of(reply.get("content") or "", code_of(key))
    await session.set_reward(reward)
    await session.close("done" if call.get("tool_calls") else "no call")
    return reward


class TurnstileRollouts:
    """TRL's ``rollout_func``: sync the weights if the trainer stepped, roll out one Turnstile
    session per prompt, hand back the recorded tokens (see the module docstring)."""

    def __init__(
        self,
        turnstile_url: str,
        token: str,
        sync: Sync,
        harness: Callable[..., Any] = lookup_rollout,
        max_tokens: int = 16,
        run: str = "trl",
    ):
        self.url, self.token, self.sync = turnstile_url.rstrip("/"), token, sync
        self.harness, self.max_tokens, self.run = harness, max_tokens, run
        self.synced_step: int | None = None
        self.calls = 0

    def admin(self, path: str, body: dict) -> dict:
        r = httpx.post(
            f"{self.url}/admin/{path}",
            json=body,
            headers={"authorization": f"Bearer {self.token}"},
            timeout=660,
        )
        r.raise_for_status()
        return r.json()

    def sync_weights(self, trainer: Any) -> None:
        """Pause Turnstile, have the engine load the trainer's weights, resume under the
        trainer's step as the policy version."""
        step = int(trainer.state.global_step)
        if step == self.synced_step:
            return
        self.admin("pause", {"mode": "drain"})
        try:
            self.sync(trainer, str(step))
        finally:
            self.admin("resume", {"weight_version": str(step)})
        self.synced_step = step

    def __call__(self, prompts: list, trainer: Any) -> dict:
        self.sync_weights(trainer)
        out = asyncio.run(self.collect([str(p) for p in prompts], trainer.state.global_step))
        self.calls += 1
        return out

    async def collect(self, prompts: Sequence[str], step: int) -> dict:
        # TRL repeats each prompt num_generations times in a row: one group per run of equal
        # prompts, its members by position
        groups: list[str] = []
        index: list[int] = []
        for i, p in enumerate(prompts):
            if i and p == prompts[i - 1]:
                index.append(index[-1] + 1)
                groups.append(groups[-1])
            else:
                index.append(0)
                groups.append(f"{self.run}-c{self.calls}-s{step}-p{i}")
        async with turnstile.AsyncClient(self.url, token=self.token) as ts:
            jobs = []
            for i, (key, gid, k) in enumerate(zip(prompts, groups, index, strict=True)):
                s = await ts.session({"key": key}, group_id=gid, sample_index=k)
                seed = 10_000 * self.calls + 10 * i
                jobs.append(self.harness(s, key, seed, self.max_tokens))
            await asyncio.gather(*jobs)
            trajs = [t for g in dict.fromkeys(groups) for t in await ts.group_trajectories(g)]
        # fill_logprob=None: a sampled token the engine gave no logprob for (llama-server: one
        # ending inside a UTF-8 character) stays NaN, which TRL 1.16 reads as "no evidence"
        # (its off-policy mask and importance ratio skip it); a number would be taken as real
        return to_trl_rollout(trajs, prompt_keys=groups, key="group_id", fill_logprob=None)


def command_sync(command: str, workdir: Path) -> Sync:
    """A ``sync`` that saves the trainer's weights (``save_pretrained``, safetensors) and runs
    ``command`` with ``{weights}`` (that folder) and ``{version}``; it must return once the
    engine serves them."""

    def sync(trainer: Any, version: str) -> None:
        out = workdir / f"weights-{version}"
        trainer.model.save_pretrained(out, safe_serialization=True)
        cmd = command.format(weights=shlex.quote(str(out)), version=shlex.quote(version))
        subprocess.run(cmd, shell=True, check=True)

    return sync


def turnstile_reward(prompts: list, completions: list, reward: list, **_: Any) -> list[float]:
    """The reward the harness posted to each session (TRL passes ``rollout_func``'s extra
    fields to its reward functions by name)."""
    return [0.0 if r is None else float(r) for r in reward]


def build_trainer(args: argparse.Namespace, trainer_cls: Any = None, reward: Any = None) -> Any:
    """A ``GRPOTrainer`` (or ``trainer_cls``) on ``args.model`` whose rollouts are Turnstile
    sessions."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager"
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    keys = KEYS[: args.prompts]
    config = GRPOConfig(
        output_dir=str(args.out),
        max_steps=args.steps,
        num_generations=args.group_size,
        per_device_train_batch_size=args.group_size * args.prompts,
        gradient_accumulation_steps=1,  # one rollout per optimizer step
        learning_rate=args.lr,
        beta=0.0,  # no reference model
        off_policy_mask_threshold=args.off_policy_mask,  # TRL's use of the behaviour logprobs
        mask_truncated_completions=False,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
    )
    sync = command_sync(args.sync_command, Path(args.out))
    rollouts = TurnstileRollouts(args.turnstile, args.token, sync, max_tokens=args.max_tokens)
    return (trainer_cls or GRPOTrainer)(
        model=model,
        processing_class=tokenizer,
        reward_funcs=reward or turnstile_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": keys * args.steps}),
        rollout_func=rollouts,
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turnstile", default="http://127.0.0.1:8400")
    ap.add_argument(
        "--token",
        default=os.environ.get("TURNSTILE_TOKEN"),
        help="the trainer token (DATA/turnstile.token; default $TURNSTILE_TOKEN)",
    )
    ap.add_argument("--model", required=True, help="the policy: the engine's weights, HF format")
    ap.add_argument("--sync-command", required=True, help="reloads the engine: {weights} {version}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2, help="tasks (groups) per step")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--off-policy-mask", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="trl-grpo-")))
    return ap


def main() -> None:
    args = parser().parse_args()
    trainer = build_trainer(args)
    trainer.train()
    print(json.dumps([h for h in trainer.state.log_history if "loss" in h]))


if __name__ == "__main__":
    main()
