"""Virtualenvs for the harnesses whose pins cannot sit beside the runtime venv's (strands-agents
wants openai<3 and mcp<2.2; requirements.lock has openai 3.57.0 and mcp 2.3.0): one per
harness, in ``$TURNSTILE_CACHE/<name>-venv`` (default ``~/.cache/turnstile``), installed by pip
from ``tests/harnesses/<name>.txt`` (every package pinned exactly), keyed by a hash of that
file and this one, built once and reused. The test drives the harness there as a subprocess.

``python tests/harnesses/venv.py strands`` builds one ahead.
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


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE") or Path.home() / ".cache" / "turnstile")


def ensure(name: str, log=sys.stderr) -> Path:
    """The python of harness ``name``'s venv, built first if its stamp is missing. Raises
    RuntimeError (with pip's output) if it cannot be built."""
    reqs = HERE / f"{name}.txt"
    key = hashlib.sha256(reqs.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    venv = cache_dir() / f"{name}-venv"
    stamp = venv / f".stamp-{key}"
    python = venv / "bin" / "python"
    if stamp.exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"{name}-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if stamp.exists():
            return python
        t0 = time.monotonic()
        print(f"[{name}-venv] building {venv} (pip, PyPI)", file=log, flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        for cmd in ([sys.executable, "-m", "venv", str(venv)], [*pip, "-r", str(reqs)]):
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                err = "\n".join(
                    ln
                    for ln in (res.stdout + res.stderr).splitlines()
                    if "is ignored: it is neither" not in ln
                )
                raise RuntimeError(
                    f"{name} venv: {' '.join(cmd[:4])}... failed "
                    f"(exit {res.returncode}):\n{err[-4000:]}"
                )
        stamp.touch()
        print(f"[{name}-venv] built in {time.monotonic() - t0:.0f} s", file=log, flush=True)
    return python


if __name__ == "__main__":
    print(ensure(sys.argv[1]))
