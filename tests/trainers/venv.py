"""The trainers venv for the tests that use it (``from trainers import venv``): built by
:mod:`turnstile_testbed.trainers`, its public home (the training proof's benchmark uses it
too, and benchmarks import no test code)."""

from __future__ import annotations

from pathlib import Path

from turnstile_testbed.trainers import trainers_python


def ensure() -> Path:
    """The trainers venv's Python, built first if it is missing (pip, minutes, once)."""
    return trainers_python()
