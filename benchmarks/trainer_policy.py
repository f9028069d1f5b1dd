"""The trainer's side of the agreement test and of ``benchmarks/train_proof.py``: a PyTorch
``LlamaForCausalLM`` (transformers' own forward) holding the weights the engine ran.

Runs in the trainers venv (torch 2.13.0 CPU, :mod:`turnstile_testbed.trainers`), started by
``policy_gguf.Trainer`` as a subprocess that reads one JSON command a
line on stdin and answers one JSON line on stdout:

- ``init``: ``config`` (a LlamaConfig dict) and ``weights`` (an ``.npz`` of HF-named tensors)
  or ``hf`` (a model directory); ``lr``. Answers the config.
- ``logprobs``: ``seqs`` (``ids``, ``positions``), ``dtype`` (``float32`` | ``bfloat16``): the
  logprob of ``ids[p]`` after ``ids[:p]`` for each position, from one forward per sequence.
- ``step``: one GRPO/PPO update on ``samples`` (``ids``, ``positions``, ``behaviour`` logprobs,
  ``advantage``), the behaviour logprobs as the old policy's (as decoupled trainers do); answers
  the trainer's logprobs before the update (the train-behaviour mismatch) and the loss.
- ``save``: the weights to an ``.npz`` for the engine's next GGUF.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.set_num_threads(1)


class Policy:
    def __init__(self, cmd: dict):
        torch.manual_seed(int(cmd.get("seed", 0)))
        if cmd.get("hf"):
            self.model = LlamaForCausalLM.from_pretrained(cmd["hf"], dtype=torch.float32)
        else:
            config = LlamaConfig(**cmd["config"])
            self.model = LlamaForCausalLM(config).to(torch.float32)
            state = {k: torch.from_numpy(v) for k, v in np.load(cmd["weights"]).items()}
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            assert not unexpected and not missing, (missing, unexpected)
        self.model.config._attn_implementation = "eager"
        self.model.eval()  # no dropout: the forward is the engine's function
        self.opt = torch.optim.Adam(self.model.parameters(), lr=float(cmd.get("lr", 1e-5)))

    def config(self) -> dict:
        c = self.model.config
        keys = (
            "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
            "num_key_value_heads max_position_embeddings rms_norm_eps tie_word_embeddings"
        ).split()
        out = {k: getattr(c, k) for k in keys}
        rope = getattr(c, "rope_parameters", None) or {}
        out["rope_theta"] = float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
        return out

    def _token_logprobs(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        x = torch.tensor([ids])
        logits = self.model(input_ids=x).logits[0].float()
        pos = torch.tensor(positions)
        logp = torch.log_softmax(logits[pos - 1], dim=-1)
        return logp.gather(1, x[0, pos].unsqueeze(1)).squeeze(1)

    def logprobs(self, seqs: list[dict], dtype: str) -> list[list[float]]:
        saved = None
        if dtype == "bfloat16":  # the trainer's forward in bf16 (weights and activations)
            saved = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.model.to(torch.bfloat16)
        try:
            with torch.no_grad():
                return [self._token_logprobs(s["ids"], s["positions"]).tolist() for s in seqs]
        finally:
            if saved is not None:
                self.model.to(torch.float32)
                self.model.load_state_dict(saved)

    def step(self, samples: list[dict], clip: float) -> dict:
        """PPO-clip on token level, mean over all sampled tokens of the batch."""
        self.opt.zero_grad()
        n = sum(len(s["positions"]) for s in samples)
        before, total = [], 0.0
        for s in samples:
            new = self._token_logprobs(s["ids"], s["positions"])
            old = torch.tensor(s["behaviour"], dtype=torch.float32)
            before.append(new.detach().tolist())
            ratio = torch.exp(new - old)
            adv = float(s["advantage"])
            loss = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).sum() / n
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {"trainer_logprobs": before, "loss": total}

    def save(self, path: str) -> None:
        state = {k: v.detach().float().numpy() for k, v in self.model.state_dict().items()}
        np.savez(path, **state)


def main() -> None:
    policy: Policy | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "init":
            policy = Policy(cmd)
            out: dict = {"config": policy.config()}
        elif policy is None:
            out = {"error": "init first"}
        elif cmd["cmd"] == "logprobs":
            out = {"logprobs": policy.logprobs(cmd["seqs"], cmd.get("dtype", "float32"))}
        elif cmd["cmd"] == "step":
            out = policy.step(cmd["samples"], float(cmd.get("clip", 0.2)))
        elif cmd["cmd"] == "save":
            policy.save(cmd["path"])
            out = {"saved": cmd["path"]}
        else:
            out = {"error": f"unknown command {cmd['cmd']!r}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
