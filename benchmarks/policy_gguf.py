"""A trainer's weights ⇄ the GGUF file llama-server runs: the weight sync of a CPU RL loop.

The trainer (PyTorch, ``benchmarks/trainer_policy.py``) holds a Hugging Face ``LlamaForCausalLM``
state dict; llama-server reads GGUF. This writes those tensors under llama.cpp's names (with
the rotary permutation llama.cpp's ``llama`` architecture expects of ``q``/``k``), in F32, F16
or BF16, with a real tokenizer copied from a vocabulary GGUF; and reads a GGUF back into the
state dict the engine actually ran (the weights rounded to the file's dtype), so the trainer
can compute with exactly those.

Runs in the project venv (``gguf``, ``numpy``); the weights cross as ``.npz`` files.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import gguf
import numpy as np

DTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
}
FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "bf16": gguf.LlamaFileType.MOSTLY_BF16,
}
# HF name (after ``model.layers.{i}.``) → llama.cpp name (after ``blk.{i}.``)
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def tiny_config(n_vocab: int, n_embd: int = 64, n_layer: int = 2, n_head: int = 4) -> dict:
    """A ``LlamaConfig`` (as a dict) for a random-weight model on a real vocabulary."""
    return {
        "vocab_size": n_vocab,
        "hidden_size": n_embd,
        "intermediate_size": 4 * n_embd,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }


def random_weights(config: dict, seed: int) -> dict[str, np.ndarray]:
    """Seeded random HF-named float32 weights; the output scale makes sampling wander (a
    random model then samples tokenizations its tokenizer never makes)."""
    rng = np.random.default_rng(seed)
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {
        "model.embed_tokens.weight": w(v, d, scale=1.0),
        "model.norm.weight": np.ones(d, np.float32),
        "lm_head.weight": w(v, d, scale=0.5),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = np.ones(d, np.float32)
        out[p + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
        for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{t}.weight"] = w(d, d)
        out[p + "mlp.gate_proj.weight"] = w(f, d)
        out[p + "mlp.up_proj.weight"] = w(f, d)
        out[p + "mlp.down_proj.weight"] = w(d, f)
    return out


@functools.cache
def tokenizer_fields(vocab_gguf: Path) -> list[tuple[str, str, object]]:
    """The ``tokenizer.*`` fields of a GGUF file, as (name, kind, value). gguf's reader takes
    30-50 s over a 150k-token vocabulary on this machine, so they are kept as JSON in the
    cache beside the test bed, keyed by the file's size and mtime."""
    st = vocab_gguf.stat()
    cached = _cache_dir() / "vocab-fields" / f"{vocab_gguf.stem}-{st.st_size}-{st.st_mtime_ns}.json"
    if cached.exists():
        return [tuple(x) for x in json.loads(cached.read_text())]  # type: ignore[misc]
    reader = gguf.GGUFReader(str(vocab_gguf))
    kinds = {
        gguf.GGUFValueType.ARRAY: "array",
        gguf.GGUFValueType.STRING: "string",
        gguf.GGUFValueType.BOOL: "bool",
        gguf.GGUFValueType.FLOAT32: "float32",
    }
    out = [
        (name, kinds.get(field.types[0], "uint32"), field.contents())
        for name, field in reader.fields.items()
        if name.startswith("tokenizer.")
    ]
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".part")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, cached)
    return out


def _cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE") or Path.home() / ".cache" / "turnstile")


def _rope_rows(w: np.ndarray, n_head: int, inverse: bool = False) -> np.ndarray:
    """HF keeps each head's rotary pairs as (first half, second half); llama.cpp's ``llama``
    rope rotates adjacent rows. Reorder each head's rows from one layout to the other."""
    rows, cols = w.shape
    half = rows // n_head // 2
    if inverse:
        return w.reshape(n_head, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)
    return w.reshape(n_head, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)


def _gguf_name(hf: str) -> str:
    if hf in _TOP:
        return _TOP[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{_LAYER[rest]}"


def write_gguf(
    weights: dict[str, np.ndarray],
    config: dict,
    vocab_gguf: Path,
    out: Path,
    dtype: str = "f32",
    chat_template: str | None = None,
) -> Path:
    """Write ``weights`` (HF names) as a llama-architecture GGUF llama-server can load, the
    tokenizer fields copied from ``vocab_gguf``; norms stay F32 (llama.cpp reads them so)."""
    fields = tokenizer_fields(vocab_gguf)
    tmp = out.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    template = chat_template
    for name, kind, value in fields:
        if name == "tokenizer.chat_template":
            template = value if template is None else template
        elif kind == "array":
            writer.add_array(name, value)
        elif kind == "string":
            writer.add_string(name, value)
        elif kind == "bool":
            writer.add_bool(name, value)
        elif kind == "float32":
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, int(value))
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    n_head, d = config["num_attention_heads"], config["hidden_size"]
    writer.add_name("turnstile-policy")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(d)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(d // n_head)
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_file_type(FILE_TYPES[dtype])
    for hf, w in weights.items():
        if hf == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp reuses token_embd when output.weight is absent
        w = np.asarray(w, np.float32)
        if hf.endswith("q_proj.weight"):
            w = _rope_rows(w, n_head)
        elif hf.endswith("k_proj.weight"):
            w = _rope_rows(w, config["num_key_value_heads"])
        name = _gguf_name(hf)
        if w.ndim == 1 or dtype == "f32":
            writer.add_tensor(name, w)
        else:
            qtype = DTYPES[dtype]
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def as_stored(weights: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """The weights as the engine holds them from a ``dtype`` file (the bytes
    :func:`write_gguf` writes, widened back to float32): what the trainer must compute with
    to run the engine's function."""
    out = {}
    for k, w in weights.items():
        w = np.asarray(w, np.float32)
        if w.ndim > 1 and dtype != "f32":
            qtype = DTYPES[dtype]
            w = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).astype(np.float32)
        out[k] = w.reshape(weights[k].shape)
    return out


class Trainer:
    """The PyTorch policy (``trainer_policy.py`` beside this file) as a subprocess in the
    trainers venv (:func:`turnstile_testbed.trainers.trainers_python`); one JSON command a
    line."""

    def __init__(self, python: Path, **init: object):
        import subprocess

        script = Path(__file__).resolve().parent / "trainer_policy.py"
        self.proc = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
        self.config: dict = self.call("init", **init)["config"]

    def call(self, cmd: str, **kw: object) -> dict:
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the trainer process exited ({self.proc.wait()}) on {cmd!r}")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    def logprobs(self, seqs: list[dict], dtype: str = "float32") -> list[list[float]]:
        return self.call("logprobs", seqs=seqs, dtype=dtype)["logprobs"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
