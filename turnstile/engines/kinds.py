"""The engines Turnstile drives, declared once: a kind's name and aliases, its token-in
adapter, whether it has a capture mode (the engine renders and reports the token IDs it saw
and sampled) and which adapter options it takes. The CLI, ``wiring`` and ``verify`` read
these rows instead of branching on names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import EngineAdapter
from .llamacpp import LlamaCppEngine
from .sglang import SGLangEngine
from .vllm import VLLMEngine


@dataclass(frozen=True)
class EngineKind:
    name: str
    adapter: Callable[..., EngineAdapter]  # mypy checks each adapter meets the contract
    aliases: tuple[str, ...] = ()
    # the capture dialect (``engines.capture``) when the engine can render and report the IDs;
    # None: it cannot, and ``--mode passthrough`` is refused for it by name
    capture: str | None = None
    options: tuple[str, ...] = (
        "timeout",
        "connect_timeout",
    )  # what its adapter takes beyond the URL
    why_no_capture: str = ""


ENGINE_KINDS = (
    EngineKind(
        "llama-cpp",
        LlamaCppEngine,
        aliases=("llamacpp", "llama.cpp"),
        why_no_capture=(
            "llama-server's chat route does not report the prompt token IDs it rendered"
        ),
    ),
    EngineKind(
        "vllm",
        VLLMEngine,
        capture="vllm",
        options=("timeout", "connect_timeout", "api", "logprobs_mode", "routed_experts"),
    ),
    EngineKind(
        "sglang",
        SGLangEngine,
        capture="sglang",
        options=("timeout", "connect_timeout", "original_logprobs", "routed_experts"),
    ),
)

KINDS = tuple(k.name for k in ENGINE_KINDS)


def engine_kind(name: str) -> EngineKind:
    """The kind named ``name`` or one of its aliases (any case)."""
    wanted = name.lower()
    for kind in ENGINE_KINDS:
        if wanted == kind.name or wanted in kind.aliases:
            return kind
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(KINDS)}")


def capture_kind(name: str) -> EngineKind:
    """The kind for capture mode: refused by name where the engine has none."""
    kind = engine_kind(name)
    if kind.capture is None:
        capturing = ", ".join(k.name for k in ENGINE_KINDS if k.capture)
        raise ValueError(
            f"--mode passthrough needs an engine that renders and reports the token IDs "
            f"({capturing}); {kind.name} cannot: {kind.why_no_capture}. Serve it in "
            "token-in mode (the default)"
        )
    return kind
