"""The router's truth: which experts transformers' own forward of a MoE routes each token to.

A recorded ``routed_experts`` is checked against this, not against Turnstile's idea of it:
the model's router logits (``output_router_logits=True``, one ``[tokens, experts]`` tensor
per layer) for the token sequence, their top-k per token and layer, and a tie flag where the
k-th and (k+1)-th logits are closer than ``eps`` (there the engine's kernel may pick either,
so a comparison skips those rows).

The forward runs in a Python that has torch and transformers (the vLLM venv's, by default):
Turnstile's own venv has neither. Sequences go over JSON in one child process.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIE_EPS = 1e-4

_FORWARD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model_dir, eps = sys.argv[1], float(sys.argv[2])
seqs = json.loads(sys.stdin.read())
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
k = model.config.num_experts_per_tok
out = []
with torch.no_grad():
    for ids in seqs:
        res = model(torch.tensor([ids]), output_router_logits=True)
        logits = torch.stack([r.reshape(len(ids), -1) for r in res.router_logits], dim=1)
        top = torch.topk(logits, k + 1, dim=-1)  # [tokens, layers, k+1], best first
        gap = top.values[..., k - 1] - top.values[..., k]
        out.append({
            "experts": top.indices[..., :k].tolist(),
            "tie": (gap < eps).tolist(),
            "next": res.logits[0].argmax(-1).tolist(),
        })
print(json.dumps(out))
"""


@dataclass(frozen=True)
class RouterTruth:
    """One sequence's routing as transformers computes it."""

    experts: np.ndarray  # [tokens, layers, k] int, best first
    tie: np.ndarray  # [tokens, layers] bool: the k-th and (k+1)-th logits within eps
    next_ids: list[int]  # the greedy next token after each position (a serving check)

    def agrees(self, rows: np.ndarray, start: int = 0) -> np.ndarray:
        """Per row of ``rows`` (``[n, layers, k]``, token positions ``start..start+n``), per
        layer: do the engine's experts equal these as a set (engines order them by weight,
        which ties can swap)? Tied rows count as agreeing."""
        mine = np.sort(self.experts[start : start + len(rows)], axis=-1)
        theirs = np.sort(np.asarray(rows), axis=-1)
        same = (mine == theirs).all(axis=-1)
        return same | self.tie[start : start + len(rows)]


def router_truth(
    model_dir: Path, sequences: Sequence[Sequence[int]], python: Path | None = None
) -> list[RouterTruth]:
    """transformers' top-k experts for each token of each sequence (one child process)."""
    if python is None:
        from .vllm import vllm_python

        python = vllm_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(python), "-c", _FORWARD, str(model_dir), str(TIE_EPS)],
        input=json.dumps([list(map(int, s)) for s in sequences]),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the router forward failed:\n{done.stderr[-3000:]}")
    return [
        RouterTruth(
            np.asarray(r["experts"], dtype=np.int64),
            np.asarray(r["tie"], dtype=bool),
            list(r["next"]),
        )
        for r in json.loads(done.stdout.strip().splitlines()[-1])
    ]
