"""Routed experts as the fakes emit them: a deterministic router and the engines' encodings.

A fake's tokens come from the toy model (no MoE behind them), so its routing comes from a
rule: :class:`HashRouter` picks ``k`` distinct experts per token and layer from a rolling hash
of the token prefix. Like a real router it is causal (a row depends only on the tokens up to
and including its own), so a retry, an extension or a prefix-cache hit gives the same rows for
the same prefix, and a row differs when any earlier token does.

The bytes are the engines' own encodings, written from their code (and held to it by
``tests/test_routed_experts_fakes.py``, which runs the engines' serializers in their venvs):

- vLLM 0.32 (``vllm/utils/serial_utils.numpy2base64``): ``np.save(allow_pickle=False)`` of the
  ``(rows, layers, experts_per_token)`` array, base64; dtype ``uint8`` up to 256 experts, else
  ``uint16`` (``RoutedExpertsCapturer.output_dtype_name``);
- SGLang 0.5.23 (``DetokenizerManager._b64_encode_per_request``): ``tensor.numpy().tobytes()``
  of the int32 capture buffer, base64, no shape.

Both cover token positions ``[start, prompt + completion - 1)``: the last sampled token was
never forwarded, so it has no row.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15  # the golden-ratio constant: a well-mixed 64-bit rolling hash


class Router(Protocol):
    """A model's routing: the experts each token of a sequence goes to, per MoE layer."""

    layers: int
    top_k: int
    experts: int

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """``[len(ids), layers, top_k]`` int64: row ``i`` from ``ids[: i + 1]`` only."""
        ...


@dataclass(frozen=True)
class HashRouter:
    """``top_k`` distinct experts per token and layer from a rolling hash of the prefix."""

    layers: int = 2
    top_k: int = 2
    experts: int = 8
    seed: int = 0

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        out = np.empty((len(ids), self.layers, self.top_k), dtype=np.int64)
        h = self.seed & _MASK
        for i, tid in enumerate(ids):
            h = ((h ^ (int(tid) + 1)) * _MUL) & _MASK
            for layer in range(self.layers):
                x = ((h + layer * 0x632BE59BD9B4E019) * _MUL) & _MASK
                picked: list[int] = []
                while len(picked) < self.top_k:
                    x = ((x ^ (x >> 29)) * _MUL) & _MASK
                    e = (x >> 32) % self.experts
                    if e not in picked:
                        picked.append(e)
                out[i, layer] = picked
        return out


def forwarded(prompt_len: int, completion_len: int, start: int) -> tuple[int, int]:
    """The positions an engine returns rows for: ``[start, prompt + completion - 1)``."""
    end = max(prompt_len + completion_len - 1, 0)
    return min(start, end), end


def vllm_dtype(experts: int) -> np.dtype:
    """vLLM's capture dtype: uint8 up to 256 experts, else uint16."""
    return np.dtype(np.uint8) if experts <= 256 else np.dtype(np.uint16)


def vllm_b64(rows: np.ndarray, experts: int) -> str:
    """``numpy2base64`` of the rows in vLLM's dtype: the ``.npy`` bytes, base64."""
    with io.BytesIO() as buf:
        np.save(buf, np.ascontiguousarray(rows, dtype=vllm_dtype(experts)), allow_pickle=False)
        return base64.b64encode(buf.getbuffer()).decode("ascii")


def sglang_b64(rows: np.ndarray) -> str:
    """SGLang's raw int32 bytes of the rows, base64, no shape."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype=np.int32).tobytes()).decode("utf-8")


def decode_vllm(b64: str) -> np.ndarray:
    """What vLLM's docs tell a client to do: ``np.load(io.BytesIO(base64.b64decode(s)))``."""
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def decode_sglang(b64: str, layers: int, top_k: int) -> np.ndarray:
    """SGLang's ``extract_routed_experts_from_meta_info``, reshaped by the client."""
    flat = np.frombuffer(base64.b64decode(b64.encode("utf-8")), dtype=np.int32)
    return flat.reshape(-1, layers, top_k)
