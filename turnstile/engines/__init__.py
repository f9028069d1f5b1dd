"""Engine adapters: one token-in/token-out contract (``base.Engine``) for every engine."""

from __future__ import annotations

from .base import (
    Engine,
    EngineAdapter,
    EngineControl,
    EngineError,
    Finish,
    SamplingParams,
    TokenBatch,
)
from .kinds import ENGINE_KINDS, KINDS, EngineKind, capture_kind, engine_kind
from .llamacpp import LlamaCppEngine
from .sglang import SGLangEngine
from .vllm import VLLMEngine

__all__ = [
    "ENGINE_KINDS",
    "KINDS",
    "EngineKind",
    "capture_kind",
    "engine_kind",
    "Engine",
    "EngineAdapter",
    "EngineControl",
    "EngineError",
    "Finish",
    "LlamaCppEngine",
    "SGLangEngine",
    "SamplingParams",
    "TokenBatch",
    "VLLMEngine",
    "make_engine",
]


def make_engine(kind: str, url: str, **options: object) -> EngineAdapter:
    """The adapter for ``kind`` (a name or alias of :data:`ENGINE_KINDS`) at ``url``.

    ``options`` go to the adapter: vLLM takes ``api`` ("auto" | "generate" | "completions")
    and ``logprobs_mode`` (its ``--logprobs-mode``); SGLang ``original_logprobs``; all take
    ``timeout`` (seconds)."""
    found = engine_kind(kind)
    unknown = sorted(set(options) - set(found.options))
    if unknown:
        raise ValueError(f"the {found.name} engine takes no option {', '.join(unknown)}")
    return found.adapter(url, **options)
