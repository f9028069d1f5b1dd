"""The trainers' virtualenv for the contract tests: separate from the runtime's pinned venv,
in ``$TURNSTILE_CACHE/trainers-venv`` (default ``~/.cache/turnstile``), keyed by a hash of
the requirement files next to this one, built once with pip from PyPI and reused.

``python -m tests.trainers.venv`` (or ``python tests/trainers/venv.py``) builds it ahead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQS = HERE / "requirements.txt"
NODEPS = HERE / "requirements-nodeps.txt"
PYTHON = "python3.11"  # the CPU torch wheel on disk is cp311


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE") or Path.home() / ".cache" / "turnstile")


def key() -> str:
    h = hashlib.sha256()
    for f in (REQS, NODEPS, Path(__file__)):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def ensure(log=sys.stderr) -> Path:
    """The trainers venv's python, building the venv first if its stamp is missing.
    Raises RuntimeError (with pip's output) if it cannot be built."""
    venv = cache_dir() / "trainers-venv"
    stamp = venv / f".stamp-{key()}"
    python = venv / "bin" / "python"
    if stamp.exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "trainers-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if stamp.exists():
            return python
        t0 = time.monotonic()
        print(f"[trainers-venv] building {venv} (pip, PyPI)", file=log, flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        base = shutil.which(PYTHON) or sys.executable
        steps = [
            [base, "-m", "venv", str(venv)],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
                str(REQS),
            ],
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "-r",
                str(NODEPS),
            ],
        ]
        for cmd in steps:
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                err = "\n".join(
                    ln
                    for ln in (res.stdout + res.stderr).splitlines()
                    if "is ignored: it is neither" not in ln
                )
                raise RuntimeError(
                    f"trainers venv: {' '.join(cmd[:4])}... failed "
                    f"(exit {res.returncode}):\n{err[-4000:]}"
                )
        stamp.touch()
        print(f"[trainers-venv] built in {time.monotonic() - t0:.0f} s", file=log, flush=True)
    return python


if __name__ == "__main__":
    print(ensure())
