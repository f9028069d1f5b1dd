"""TRL's own ``GRPOTrainer`` trains on Turnstile sessions (``examples/trl_grpo.py``): two
optimizer steps on the CPU, its rollouts two-turn tool sessions through Turnstile (token-in)
on llama-server, the weights synced to the engine between steps.

The model: a tiny random-weight Llama on SmolLM2's vocabulary, written here as a Hugging Face
folder (what TRL loads) and, at every sync, as an F32 GGUF llama-server is restarted on
(``tests/trainers/trl_engine.py``). Turnstile reaches llama-server through the recording relay,
and the truths are what the engine received and returned there, never Turnstile's own account:

- TRL's own batch tensors (``_compute_loss``'s ``prompt_ids``, ``completion_ids``, masks,
  ``sampling_per_token_logps``) against the relay: the tokens the engine saw, the loss mask 1
  exactly where it sampled (the prompt and the tool's tokens 0), the behaviour logprobs the
  ones it returned;
- TRL's own forward inside its loss against the engine's logprobs, at both steps: the second
  step's rollouts were sampled by the weights after the first update (the engine restarted on
  them), and their recorded policy version is the trainer's step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from trainers import venv as trainers_venv

import turnstile_testbed as testbed
from benchmarks import policy_gguf
from turnstile.app.wiring import build_gateway
from turnstile.auth import load_or_create_token
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.server.app import create_app
from turnstile.testing.relay import Exchange, start_relay
from turnstile_testbed.demo import serve_in_thread

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
BOUND = 2e-3  # trainer vs engine logprobs, F32 both (tests/test_trainer_agreement.py's bound)
STEPS = 2


def tiny_policy(out: Path) -> Path:
    """A random-weight Llama on SmolLM2's vocabulary as a Hugging Face folder: config,
    safetensors, and the tokenizer Turnstile reads from SmolLM2's GGUF (what the engine's
    file carries), saved as ``tokenizer.json``."""
    tok = load_tokenizer(str(testbed.smollm2_gguf()))
    config = policy_gguf.tiny_config(tok.tokenizer.get_vocab_size())
    out.mkdir(parents=True)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    full = {**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"], **ids}
    (out / "config.json").write_text(json.dumps(full))
    save_file(policy_gguf.random_weights(config, seed=0), out / "model.safetensors")
    tok.tokenizer.save(str(out / "tokenizer.json"))
    special = {k: v for k, v in tok.special_tokens.items() if k != "pad_token"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return out


class Engine:
    """The relay's record, as sequences: each session's last call's prompt + sample, where
    the engine sampled, and the logprob it returned for each sampled token it reported."""

    def __init__(self, exchanges: list[Exchange]):
        calls = [(e.request["prompt"], e.response) for e in exchanges]
        seqs = [p + r["tokens"] for p, r in calls]
        self.rows = []
        for i, seq in enumerate(seqs):
            if any(
                j != i and len(p) >= len(seq) and p[: len(seq)] == seq
                for j, (p, _) in enumerate(calls)
            ):
                continue  # a turn the session continued
            mask = [0] * len(seq)
            logps: dict[int, float] = {}
            for p, r in calls:
                sampled = r["tokens"]
                if len(p) + len(sampled) > len(seq) or seq[: len(p) + len(sampled)] != p + sampled:
                    continue
                mask[len(p) : len(p) + len(sampled)] = [1] * len(sampled)
                j = 0
                for k, tok in enumerate(sampled):  # none for a token ending mid-character
                    probs = r["completion_probabilities"]
                    if j < len(probs) and probs[j]["id"] == tok:
                        logps[len(p) + k] = probs[j]["logprob"]
                        j += 1
            self.rows.append({"ids": seq, "mask": mask, "logps": logps})


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    python = trainers_venv.ensure()
    work = tmp_path_factory.mktemp("trl-grpo")
    hf = tiny_policy(work / "policy-hf")
    state, port = work / "engine", testbed.free_port()
    engine = [sys.executable, str(ROOT / "tests/trainers/trl_engine.py")]
    where = ["--port", str(port), "--state", str(state)]
    subprocess.run([*engine, str(hf), *where], check=True, timeout=120)
    relay, relay_server = start_relay(f"http://127.0.0.1:{port}")
    server = None
    try:
        data = work / "data"
        gateway = build_gateway(relay.url, str(state / "policy.gguf"), data, model_name="policy")
        ts_port = testbed.free_port()
        base = f"http://127.0.0.1:{ts_port}"
        token = load_or_create_token(data)[0]
        server = serve_in_thread(create_app(gateway, base, token=token), ts_port)
        dump = work / "dump.json"
        sync = " ".join([*engine, "{weights}", *where])
        cmd = [
            str(python),
            str(ROOT / "tests/trainers/trl_run.py"),
            *("--turnstile", base, "--token", token, "--model", str(hf)),
            *("--sync-command", sync, "--steps", str(STEPS), "--out", str(work / "out")),
            *("--dump", str(dump)),
        ]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "1"}
        env["TRL_EXPERIMENTAL_SILENCE"] = "1"
        for k in ("TURNSTILE_CACHE", "TURNSTILE_LLAMA_BUILD"):  # where the test bed lives
            if k in os.environ:
                env[k] = os.environ[k]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        status = gateway.control.version
        return {
            "dump": json.loads(dump.read_text()),
            "engine": Engine(relay.completions()),
            "syncs": [json.loads(x) for x in (state / "syncs.jsonl").read_text().splitlines()],
            "version": status,
            "stderr": r.stderr,
        }
    finally:
        if server is not None:
            server.stop()
        relay_server.shutdown()
        relay_server.server_close()
        subprocess.run([*engine, "--stop", *where], timeout=60)


@pytest.mark.timeout(420)
def test_trl_ran_two_steps_with_a_finite_loss(run: dict) -> None:
    d = run["dump"]
    assert d["global_step"] == STEPS, d["logged"]
    assert [s["global_step"] for s in d["steps"]] == list(range(STEPS))
    assert d["finite"] and len(d["logged"]) == STEPS, d["logged"]
    assert all(np.isfinite(h["loss"]) for h in d["logged"])
    assert d["moved"] > 0  # the optimizer changed the weights
    # every step's batch: 2 prompts x 2 generations, a non-zero advantage somewhere
    assert all(len(s["rows"]) == 4 for s in d["steps"])
    assert any(abs(x["advantage"]) > 0 for s in d["steps"] for x in s["rows"])


def test_trl_batch_is_what_the_engine_saw(run: dict) -> None:
    """TRL's own tensors, row by row, against the relay's sequences: the same token IDs, the
    loss mask 1 exactly where the engine sampled (0 on the prompt and on the tool's tokens),
    the behaviour logprobs the engine's."""
    engine = run["engine"].rows
    trained = [x for s in run["dump"]["steps"] for x in s["rows"]]
    assert len(engine) == len(trained) == 4 * STEPS
    by_ids = {tuple(e["ids"]): e for e in engine}
    assert len(by_ids) == len(engine)  # distinct samples: a match by IDs is one-to-one
    assert Counter(tuple(x["prompt_ids"] + x["completion_ids"]) for x in trained) == Counter(
        by_ids.keys()
    )
    tool_tokens = unknown = 0
    for x in trained:
        e = by_ids[tuple(x["prompt_ids"] + x["completion_ids"])]
        n = len(x["prompt_ids"])
        assert e["mask"][:n] == [0] * n  # TRL's prompt: never sampled
        assert x["loss_mask"] == e["mask"][n:]  # TRL's loss mask: the sampled tokens
        assert x["tool_mask"] == e["mask"][n:]
        tool_tokens += x["loss_mask"].count(0)
        for i, lp in enumerate(x["sampling_logps"]):
            if n + i in e["logps"]:
                assert lp == pytest.approx(e["logps"][n + i], abs=1e-5), i
            elif x["loss_mask"][i]:  # sampled, no logprob reported: TRL's "unknown"
                assert np.isnan(lp), i
                unknown += 1
    assert tool_tokens > 0  # the tool's answer sits inside the completion, masked
    print(f"{tool_tokens} tool tokens masked, {unknown} sampled tokens without a logprob")


def test_step_two_was_sampled_by_the_updated_weights(run: dict) -> None:
    """TRL's forward inside its loss (the weights after the previous update) agrees with the
    engine's logprobs at both steps; the recorded policy version is the trainer's step; each
    sync rewrote the engine's file (the first with the initial weights)."""
    d = run["dump"]
    for s in d["steps"]:
        worst = max(
            abs(t - b)
            for x in s["rows"]
            for t, b, m in zip(x["trainer_logps"], x["sampling_logps"], x["loss_mask"], strict=True)
            if m and not np.isnan(b)  # NaN: the engine reported none (checked above)
        )
        assert worst <= BOUND, (s["global_step"], worst)
        print(
            f"step {s['global_step']}: loss {s['loss']:.6g}, trainer vs engine max |Δ| {worst:.3g}"
        )
    for step, rewarded in enumerate(d["rewarded"]):
        sampled = {v for vs in rewarded["versions"] for v in vs if v != -1}
        assert sampled == {step}, (step, sampled)
    assert run["version"] == str(STEPS - 1)
    shas = [x["sha256"] for x in run["syncs"]]
    assert len(shas) == 1 + STEPS  # the test's start, then one sync per step
    assert shas[0] == shas[1] and shas[1] != shas[2]
