"""Turnstile: an OpenAI-compatible gateway that records the exact tokens an RL policy
saw and sampled."""

import os
from typing import Any

# Turnstile uses transformers for tokenizers and templates only, never its models: its advice
# that PyTorch is missing is noise on every command (set the variable to "" to see it again).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.2.0"

__all__ = ["AsyncClient", "Client", "Trajectory", "TurnstileError"]


def __getattr__(name: str) -> Any:
    """``turnstile.Client`` etc. without importing httpx for the server and CLI."""
    if name in ("AsyncClient", "Client", "TurnstileError"):
        from . import client

        return getattr(client, name)
    if name == "Trajectory":
        from .store.trajectories import Trajectory

        return Trajectory
    raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
