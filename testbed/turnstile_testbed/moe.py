"""The MoE part of the test bed: a tiny random Qwen3-MoE built locally with transformers.

Routed-expert replay (R3) is checked against the model's own router: an engine serves these
weights, Turnstile records the experts the engine says it routed each token to, and
transformers' forward of the same weights on the recorded tokens must pick the same top-k
(:mod:`turnstile_testbed.moe_truth`). Nothing is downloaded: the weights are random (seeded),
the tokenizer and chat template are SmolLM2's (:func:`turnstile_testbed.vllm.vllm_model`).

Shape (:data:`MOE_SHAPE`): 2 layers, 8 experts, top-2, head_dim 64 (vLLM's CPU attention
refuses 16), float32 so the engine's router and transformers' agree to well under the gap
between the 2nd and 3rd expert. The LM head is scaled up so greedy decoding has clear
margins (the same argmax on any kernel), and the router's weights so experts differ per
token.
"""

from __future__ import annotations

import json
from pathlib import Path

MOE_SHAPE = {
    "num_hidden_layers": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "moe_intermediate_size": 64,
    "intermediate_size": 256,
    "norm_topk_prob": True,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
MOE_SEED = 0
_VERSION = "v1"  # bump when the build below changes: a new directory, never a stale one

_BUILD = """
import json, sys, shutil, torch
from pathlib import Path
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
shape, seed = json.loads(sys.argv[1]), int(sys.argv[2])
tok_dir, out = Path(sys.argv[3]), Path(sys.argv[4])
tok_cfg = json.loads((tok_dir / "config.json").read_text())
config = Qwen3MoeConfig(
    vocab_size=tok_cfg["vocab_size"], bos_token_id=tok_cfg["bos_token_id"],
    eos_token_id=tok_cfg["eos_token_id"], pad_token_id=tok_cfg["pad_token_id"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rms_norm_eps=1e-6, dtype="float32", **shape,
)
config.architectures = ["Qwen3MoeForCausalLM"]
torch.manual_seed(seed)
model = Qwen3MoeForCausalLM(config).to(torch.float32).eval()
with torch.no_grad():
    model.lm_head.weight.mul_(50.0)  # logits ~ N(0, 10): greedy margins of whole units
    for layer in model.model.layers:
        layer.mlp.gate.weight.mul_(10.0)  # router logits ~ N(0, 2): distinct top-k
model.save_pretrained(str(out), safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(tok_dir / name, out / name)
gen = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
       "pad_token_id": config.pad_token_id}
(out / "generation_config.json").write_text(json.dumps(gen, indent=2))
print("built", out)
"""


def tiny_moe() -> Path:
    """A Hugging Face directory (safetensors, config, SmolLM2's tokenizer and chat template)
    holding a random Qwen3-MoE of :data:`MOE_SHAPE`, built once in the vLLM venv; seconds."""
    from .vllm import model_built_in_vllm_venv

    return model_built_in_vllm_venv(
        "tiny-qwen3-moe",
        json.dumps([MOE_SHAPE, MOE_SEED, _VERSION], sort_keys=True),
        _BUILD,
        lambda tok_dir, out: [json.dumps(MOE_SHAPE), str(MOE_SEED), str(tok_dir), str(out)],
    )
