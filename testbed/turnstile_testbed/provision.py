"""The whole test bed, built or unpacked once into the cache (``python -m turnstile_testbed
provision``, run by ``./run test`` first): llama-server and the models (the package's
``__init__``), vLLM's CPU build and its model (``vllm``), the pinned SGLang package
(``sglang``)."""

from __future__ import annotations

from pathlib import Path

from . import (
    chromium,
    llama_server_binary,
    models_dir,
    node_harnesses,
    smollm2_gguf,
    templates_dir,
    tiny_model,
)
from .sglang import sglang_package
from .vllm import vllm_model, vllm_python


def provision() -> dict[str, Path]:
    """Build or unpack everything the tests and the demo need (vLLM's venv and model, the
    SGLang package: :mod:`turnstile_testbed.vllm`, :mod:`turnstile_testbed.sglang`)."""
    chromium_binary, chromium_driver = chromium()
    return {
        "vllm-python": vllm_python(),
        "vllm-model": vllm_model(),
        "sglang-package": sglang_package(),
        "chromium": chromium_binary,
        "chromedriver": chromium_driver,
        "llama-server": llama_server_binary(),
        "models": models_dir(),
        "templates": templates_dir(),
        "smollm2": smollm2_gguf(),
        "tiny-qwen2": tiny_model("qwen2", "Qwen-Qwen2.5-7B-Instruct"),
        "node-harnesses": node_harnesses(),
    }
