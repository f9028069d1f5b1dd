"""The trainer's side of exactness: PyTorch (transformers' ``LlamaForCausalLM``, torch 2.13.0
CPU in the trainers venv) computes the logprobs of trajectories Turnstile recorded from
llama-server, with the weights the engine ran, and agrees with the recorded logprobs within
the tolerance measured for that dtype; the same conversation re-tokenized the way chat-level
pipelines do it (the harness's messages rendered through the template and encoded again, the
engine's logprobs laid on by position) does not.

Truth: PyTorch's own forward of the same weights (not Turnstile's, not llama.cpp's). The
weights are seeded random ones on SmolLM2's vocabulary with the Qwen2.5 template, written as
F32, F16 and BF16 GGUF files (``benchmarks/policy_gguf.py``); the trainer loads the same
tensors rounded as each file stores them. The conversation is forced, so it is the same on any
x86 machine: a tool call whose arguments the grammar fixes (``tool_choice`` naming the tool,
an ``enum`` key), the tool's answer, then a reply whose every token a +100 ``logit_bias``
forces to "-": twelve "-" tokens the tokenizer encodes again as one "------------".

Tolerances measured here (|Δ| of the recorded logprobs against PyTorch's float32 forward over
the 64 sampled tokens, max / mean): F32 2.0e-4 / 8.6e-5, F16 2.6e-3 / 7.7e-4, BF16
2.2e-2 / 8.1e-3; the trainer's bfloat16 forward against the F32 engine 4.8e-2 / 1.5e-2. The
bounds below sit 4-10x above those. The re-tokenized version of the same record parts by up
to 15.8 nats (mean 4.4 over its 33 laid-on logprobs).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from trainers import venv as trainers_venv

import turnstile_testbed as testbed
from benchmarks import policy_gguf
from turnstile.app.wiring import build_gateway
from turnstile.auth import load_or_create_token
from turnstile.client import AsyncClient
from turnstile.server.app import create_app
from turnstile.store.trajectories import Trajectory, stitch
from turnstile.verify import rerendered
from turnstile_testbed.demo import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

# engine dtype → bound on max |Δ| against the trainer's float32 forward (measured worst x ~5)
TOLERANCE = {"f32": 2e-3, "f16": 1e-2, "bf16": 1e-1}
BF16_TRAINER = 0.4  # the trainer's bfloat16 forward against the F32 engine
QWEN25 = "Qwen-Qwen2.5-7B-Instruct"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the code of a key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "enum": ["alpha"]}},
                "required": ["key"],
            },
        },
    }
]
DASH = "-"


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Seeded random weights on SmolLM2's vocabulary, a GGUF per dtype, and the tensors as
    each file stores them (for the trainer)."""
    vocab = testbed.smollm2_gguf()
    tokens = next(v for k, _, v in policy_gguf.tokenizer_fields(vocab) if k.endswith(".tokens"))
    config = policy_gguf.tiny_config(len(tokens))  # type: ignore[arg-type]
    weights = policy_gguf.random_weights(config, seed=7)
    template = (testbed.templates_dir() / f"{QWEN25}.jinja").read_text()
    d = tmp_path_factory.mktemp("policy")
    out: dict = {"config": config, "gguf": {}, "npz": {}}
    for dtype in TOLERANCE:
        out["gguf"][dtype] = policy_gguf.write_gguf(
            weights, config, vocab, d / f"{dtype}.gguf", dtype, template
        )
        np.savez(d / f"{dtype}.npz", **policy_gguf.as_stored(weights, dtype))
        out["npz"][dtype] = str(d / f"{dtype}.npz")
    np.savez(d / "other.npz", **policy_gguf.random_weights(config, seed=8))
    out["npz"]["other"] = str(d / "other.npz")
    return out


@pytest.fixture(scope="module")
def trainer(policy: dict) -> Iterator[policy_gguf.Trainer]:
    t = policy_gguf.Trainer(
        trainers_venv.ensure(), config=policy["config"], weights=policy["npz"]["f32"]
    )
    yield t
    t.close()


async def _conversation(base: str, data: Path, dash: int) -> tuple[str, list[dict]]:
    """The forced three-message rollout through Turnstile; the session and what the harness
    holds at the end."""
    async with AsyncClient(base, data=data) as ts:
        session = await ts.session({})
        llm = openai.AsyncOpenAI(base_url=session.base_url, api_key="x", max_retries=0)
        msgs: list[dict] = [{"role": "user", "content": "What is the code of alpha?"}]
        r = await llm.chat.completions.create(
            model="policy",
            messages=msgs,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "lookup"}},
            max_tokens=96,
            seed=1,
        )
        call = r.choices[0].message
        assert call.tool_calls and call.tool_calls[0].function.arguments == '{"key": "alpha"}'
        msgs.append(call.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "417"})
        r = await llm.chat.completions.create(
            model="policy",
            messages=msgs,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=12,
            seed=2,
            logit_bias={str(dash): 100},
        )
        assert r.choices[0].message.content == DASH * 12, r.choices[0].message.content
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
        await session.close("done")
        await llm.close()
        return session.id, msgs


@pytest.fixture(scope="module")
def recorded(policy: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each dtype's GGUF served by llama-server behind an in-process Turnstile, the forced
    conversation recorded: the exact trajectory, the harness's messages, the renderer."""
    out = {}
    for dtype, gguf in policy["gguf"].items():
        data = tmp_path_factory.mktemp(f"data-{dtype}")
        with testbed.llama_server(gguf, ctx=2048, parallel=1) as url:
            gateway = build_gateway(url, str(gguf), data, model_name="policy")
            [dash] = gateway.tok.encode(DASH)
            port = testbed.free_port()
            base = f"http://127.0.0.1:{port}"
            app = create_app(gateway, base, token=load_or_create_token(data)[0])
            with serve_in_thread(app, port):
                sid, msgs = asyncio.run(_conversation(base, data, dash))
        [traj] = stitch(gateway.store.calls(sid))
        out[dtype] = {"traj": traj, "messages": msgs, "renderer": gateway.renderer}
    return out


def _exact(traj: Trajectory) -> tuple[dict, np.ndarray]:
    pos = np.flatnonzero(traj.loss_mask)
    return {"ids": traj.token_ids.tolist(), "positions": pos.tolist()}, traj.logprobs[pos]


def _stats(recorded: np.ndarray, computed: list[float]) -> dict:
    d = np.abs(np.asarray(recorded, float) - np.asarray(computed, float))
    return {"tokens": len(d), "max": float(d.max()), "mean": float(d.mean())}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_the_trainer_recomputes_the_recorded_logprobs(dtype, policy, recorded, trainer):
    """PyTorch's float32 forward with the weights as the engine's file stores them gives
    every recorded logprob back within the dtype's tolerance; other weights do not."""
    traj = recorded[dtype]["traj"]
    seq, logprobs = _exact(traj)
    assert len(seq["positions"]) >= 20 and not np.isnan(logprobs).any()
    trainer.call("init", config=policy["config"], weights=policy["npz"][dtype])
    [mine] = trainer.logprobs([seq])
    got = _stats(logprobs, mine)
    print(f"\nAGREEMENT engine={dtype} trainer=float32 {got}")
    assert got["max"] <= TOLERANCE[dtype], got
    if dtype == "f32":
        [bf16] = trainer.logprobs([seq], "bfloat16")
        half = _stats(logprobs, bf16)
        print(f"AGREEMENT engine=f32 trainer=bfloat16 {half}")
        assert half["max"] <= BF16_TRAINER, half
        # the check has power: the same architecture with other weights parts at once
        trainer.call("init", config=policy["config"], weights=policy["npz"]["other"])
        [other] = trainer.logprobs([seq])
        assert _stats(logprobs, other)["max"] > 1.0


def test_re_tokenized_records_misalign(policy, recorded, trainer):
    """The same conversation as a chat-level pipeline holds it: the forced reply's twelve
    sampled "-" encode again as one token (and the end-of-turn moves up); the engine's
    logprobs laid on by position then meet tokens the policy never sampled, and PyTorch's
    logprobs of those part from them by whole nats. The exact record is the control."""
    rec = recorded["f32"]
    traj, renderer = rec["traj"], rec["renderer"]
    seq, logprobs = _exact(traj)
    turns = [traj.logprobs[t["completion_start"] : t["completion_end"]] for t in traj.turns]
    assert len(turns) == 2 and len(turns[1]) == 12
    ids, positions, laid = rerendered(
        renderer.render, renderer.encoder.encode, rec["messages"], TOOLS, turns
    )
    # the prompt renders alike; the first difference is in what was sampled (the tool call's
    # text when the policy split it otherwise than the tokenizer does, else the reply)
    first = next(i for i, (a, b) in enumerate(zip(ids, seq["ids"], strict=False)) if a != b)
    assert traj.turns[0]["completion_start"] <= first <= traj.turns[1]["completion_start"]
    # the reply the pipeline trains on: "-" x 12 encoded again (one token), not twelve "-"
    again = renderer.tok.encode(DASH * 12)
    assert len(again) < 12 and ids[-len(again) - 2 : -2] == again, ids[-8:]
    assert seq["ids"][-12:] == [seq["ids"][-1]] * 12
    keep = [i for i, lp in enumerate(laid) if not math.isnan(lp)]
    naive = {"ids": ids, "positions": [positions[i] for i in keep]}
    trainer.call("init", config=policy["config"], weights=policy["npz"]["f32"])
    [exact_lp, naive_lp] = trainer.logprobs([seq, naive])
    exact = _stats(logprobs, exact_lp)
    got = np.abs(np.asarray([laid[i] for i in keep]) - np.asarray(naive_lp))
    mis = [p for p in naive["positions"] if p >= first]
    off = got[[naive["positions"].index(p) for p in mis]]
    print(
        f"\nNAIVE tokens={len(got)} misaligned={len(mis)} max={got.max():.3f} "
        f"mean={got.mean():.3f} (exact: {exact})"
    )
    assert exact["max"] <= TOLERANCE["f32"]
    assert off.max() > 1.0 and off.mean() > 0.5, off
    # where the tokens are the same (the tool call, when split canonically) it agrees
    same = got[[i for i, p in enumerate(naive["positions"]) if p < first]]
    assert same.max(initial=0.0) <= TOLERANCE["f32"], same
