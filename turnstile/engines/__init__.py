"""Engine adapters: one token-in/token-out contract (``base.Engine``) for every engine."""

from __future__ import annotations

from collections.abc import Callable

from .base import (
    Engine,
    EngineAdapter,
    EngineControl,
    EngineError,
    Finish,
    SamplingParams,
    TokenEvent,
)
from .llamacpp import LlamaCppEngine
from .sglang import SGLangEngine
from .vllm import VLLMEngine

KINDS = ("llama-cpp", "vllm", "sglang")

__all__ = [
    "KINDS",
    "Engine",
    "EngineAdapter",
    "EngineControl",
    "EngineError",
    "Finish",
    "LlamaCppEngine",
    "SGLangEngine",
    "SamplingParams",
    "TokenEvent",
    "VLLMEngine",
    "make_engine",
]


def make_engine(kind: str, url: str, **options: object) -> EngineAdapter:
    """The adapter for ``kind`` ("llama-cpp", "vllm", "sglang") at ``url``.

    ``options`` go to the adapter: vLLM takes ``api`` ("auto" | "generate" | "completions")
    and ``logprobs_mode`` (its ``--logprobs-mode``); SGLang ``original_logprobs``; all take
    ``timeout`` (seconds)."""
    # mypy checks here that each adapter meets the token-in contract
    kinds: dict[str, Callable[..., EngineAdapter]] = {
        "llama-cpp": LlamaCppEngine,
        "llamacpp": LlamaCppEngine,
        "llama.cpp": LlamaCppEngine,
        "vllm": VLLMEngine,
        "sglang": SGLangEngine,
    }
    try:
        cls = kinds[kind.lower()]
    except KeyError:
        raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(KINDS)}") from None
    return cls(url, **options)
