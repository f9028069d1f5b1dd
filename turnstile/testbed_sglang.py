"""The SGLang part of the test bed: the pinned ``sglang`` package, for its own types.

The SGLang fake and adapter are checked against the package's request and response types
(``tests/test_sglang_types.py``): ``GenerateReqInput``'s fields, ``SamplingParams``' fields,
the ``meta_info`` keys the tokenizer manager writes and the finish reasons' JSON. The package
is installed ``--no-deps`` into its own venv (a 39 MB wheel, seconds): importing
``sglang.srt.managers.io_struct`` pulls torch 2.14.1, zmq, msgspec and the scheduler (the
full install is about 7 GB of CUDA wheels), so the test reads those classes from the
installed package's source with :mod:`ast` instead of importing them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .testbed import _download, _log, cache_dir, locked

SGLANG = (
    "sglang",
    "0.5.23",
    "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
)
SGLANG_PYTHON = "python3.11"  # the wheel is built for CPython 3.11


def sglang_package() -> Path:
    """The installed ``sglang`` package directory of :data:`SGLANG` (its sources), in a venv
    of its own in the cache, installed once without dependencies."""
    root = cache_dir() / "sglang-venv"
    done = root / ".installed"
    pins = "\n".join(SGLANG)
    found = sorted(root.glob("lib/python*/site-packages/sglang"))
    if done.exists() and done.read_text() == pins and found:
        return found[0]
    with locked(cache_dir() / "sglang-venv.lock"):
        found = sorted(root.glob("lib/python*/site-packages/sglang"))
        if done.exists() and done.read_text() == pins and found:
            return found[0]
        base = shutil.which(SGLANG_PYTHON)
        if base is None:
            raise RuntimeError(f"the SGLang test bed needs {SGLANG_PYTHON} (sglang's wheel)")
        wheel = _download(SGLANG, sdist=False)
        log = cache_dir() / "sglang-venv.log"
        _log(f"installing {SGLANG[0]}=={SGLANG[1]} (no dependencies) into {root}; log in {log}")
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        python = root / "bin" / "python"
        with log.open("wb") as out:
            for cmd in (
                [base, "-m", "venv", str(root)],
                [str(python), "-m", "pip", "install", "--no-input", "--no-deps", str(wheel)],
            ):
                out.write(f"$ {' '.join(cmd)}\n".encode())
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log.read_text(errors="replace").splitlines()[-20:]
                    raise RuntimeError(
                        f"installing {SGLANG[0]}=={SGLANG[1]} failed ({log}):\n" + "\n".join(tail)
                    )
            out.write(f"installed in {time.monotonic() - started:.0f} s\n".encode())
        done.write_text(pins)
        found = sorted(root.glob("lib/python*/site-packages/sglang"))
        if not found:
            raise RuntimeError(f"{SGLANG[0]}=={SGLANG[1]} installed no sglang package in {root}")
        return found[0]
