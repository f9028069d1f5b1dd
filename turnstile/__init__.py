"""Turnstile: an OpenAI-compatible gateway that records the exact tokens an RL policy
saw and sampled."""

from typing import Any

__version__ = "0.1.0"

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
