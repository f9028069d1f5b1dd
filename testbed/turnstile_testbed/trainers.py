"""The trainers' part of the test bed: the trainers' own packages (torch, transformers, verl,
TRL, OpenRLHF, AReaL, SkyRL, Tinker) in a cached venv of their own, separate from the
runtime's pinned one.

Two users, hence its place here and not under ``tests/``: the converters' contract tests
(``tests/trainers/contract.py`` runs in it) and the PyTorch policy of the training proof
(``benchmarks/trainer_policy.py``, used by ``benchmarks/train_proof.py`` and
``tests/test_trainer_agreement.py``). Built once with pip (~2-3 minutes; the log in
``trainers-venv.log`` beside it) by :func:`testbed_venv.pinned_venv`, rebuilt when a pin
changes. ``python -m turnstile_testbed.trainers`` builds it ahead and prints its Python.
"""

from __future__ import annotations

from pathlib import Path

from .venv import pinned_venv, pip_install

# torch==2.13.0 is the CPU wheel this machine keeps on disk (pip's find-links); a looser pin
# pulls a CUDA build. The rest: what the trainers' modules the tests load import.
TRAINERS_REQUIREMENTS = (
    "torch==2.13.0",
    "numpy==2.4.6",
    "tinker==0.38.0",
    "trl==1.16.0",
    "transformers==5.24.0",
    "accelerate==1.15.0",
    "datasets==5.2.0",
    "tensordict==0.10.0",
    "ray==2.60.0",
    "msgspec",
    "orjson",
    # what verl's DataProto, OpenRLHF's agent/experience modules and AReaL's data utils import
    "hydra-core==1.3.8",
    "codetiming==1.4.0",
    "dill==0.4.1",
    "pylatexenc==2.11",
    "aiohttp==3.14.5",
    "loguru==0.7.3",
    "torchdata==0.11.0",
    "colorlog==6.12.0",
    # what verl's agent-loop module (AgentLoopOutput) imports
    "pillow==13.0.0",
    "cachetools==8.0.2",
    "uvicorn==0.54.0",
    "fastapi==0.165.0",
)
# Installed with --no-deps: their full dependency lists pin GPU stacks (vLLM, flash-attn,
# deepspeed, CUDA torch) that cannot install here; the modules the tests load need only the
# requirements above. skyrl 0.3.0 is the last release that installs on Python 3.11 (0.4.0
# needs 3.12, and the CPU torch wheel here is for 3.11).
TRAINERS_NODEPS = ("verl==0.9.1", "openrlhf==0.11.2", "areal==1.0.4", "skyrl==0.3.0")
TRAINERS_PYTHON = "python3.11"  # the CPU torch wheel on disk is cp311


def trainers_python() -> Path:
    """The Python of the trainers venv (``<cache>/trainers-venv``), built first if it is
    missing or was built from other pins; a clear error with pip's log tail if it cannot."""

    def steps(python: Path) -> list[list[str]]:
        return [
            [*pip_install(python), *TRAINERS_REQUIREMENTS],
            [*pip_install(python), "--no-deps", *TRAINERS_NODEPS],
            [str(python), "-c", "import torch, transformers; print(torch.__version__)"],
        ]

    pins = [*TRAINERS_REQUIREMENTS, "--no-deps", *TRAINERS_NODEPS]
    root = pinned_venv("trainers-venv", TRAINERS_PYTHON, pins, steps, "the trainers venv")
    return root / "bin" / "python"


if __name__ == "__main__":
    print(trainers_python())
