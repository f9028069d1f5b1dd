"""Turnstile: an OpenAI-compatible gateway that records the exact tokens an RL policy
saw and sampled."""

__version__ = "0.1.0"
