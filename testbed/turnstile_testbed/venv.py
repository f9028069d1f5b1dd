"""A virtualenv in the cache built once from pinned commands, rebuilt when its pins change.

The vLLM and SGLang test beds each need a venv of their own (their pins clash with
Turnstile's); this is the one way they are made: under a lock (parallel test workers), from
scratch, every command's output in a log beside the venv, a clear error with the log's tail
when a step fails, and a stamp holding the pins it was built from.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import _log, cache_dir, locked


def pinned_venv(
    name: str,
    python: str,
    pins: Sequence[str],
    steps: Callable[[Path], list[list[str]]],
    what: str,
    after: Callable[[Path], None] | None = None,
) -> Path:
    """The venv ``<cache>/<name>`` (its root), built with ``python`` (e.g. ``python3.11``) and
    then ``steps(venv_python)`` (commands run in order), unless it was built from the same
    ``pins`` already. ``after(root)`` runs once the steps succeeded, before the stamp."""
    root = cache_dir() / name
    done = root / ".installed"  # holds the pins it was built from: new pins, a new venv
    stamp = "\n".join(pins)
    if done.exists() and done.read_text() == stamp:
        return root
    with locked(cache_dir() / f"{name}.lock"):
        if done.exists() and done.read_text() == stamp:
            return root
        base = shutil.which(python)
        if base is None:
            raise RuntimeError(f"{what} needs {python}")
        log = cache_dir() / f"{name}.log"
        _log(f"installing {what} into {root}: minutes, once; log in {log}")
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        with log.open("wb") as out:
            for cmd in ([base, "-m", "venv", str(root)], *steps(root / "bin" / "python")):
                out.write(f"$ {' '.join(cmd)}\n".encode())
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log.read_text(errors="replace").splitlines()[-30:]
                    raise RuntimeError(f"installing {what} failed ({log}):\n" + "\n".join(tail))
            out.write(f"installed in {time.monotonic() - started:.0f} s\n".encode())
        if after is not None:
            after(root)
        done.write_text(stamp)
    return root


def pip_install(python: Path) -> list[str]:
    """The start of a quiet, non-interactive ``pip install`` in the venv of ``python``."""
    return [str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
