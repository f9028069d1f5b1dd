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

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from .testbed import _download, _log, cache_dir, free_port, locked, wait_healthy

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


# SGLang's server on this CPU (the opt-in tests/test_sglang_real.py): sglang and sglang-kernel
# without their dependencies, torch 2.14.1 (sglang's pin; the registry's build, CUDA libraries
# included, runs on a CPU) with the torchvision built for it, torchaudio, the modules sglang
# imports beyond vLLM's requirements, and everything else from the pinned vLLM venv
# (testbed_vllm) through a .pth file: the pins that ran here on 2026-12-02. About 7 GB.
SGLANG_KERNEL = ("sglang-kernel", "0.4.10")
SGLANG_TORCH = ("torch==2.14.1", "torchvision==0.29.1")
SGLANG_EXTRAS = (  # --no-deps, as they ran (torchaudio's own pin names another torch)
    "torchaudio==2.11.1",
    "orjson==3.13.0",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "soundfile==0.14.0",
    "cutlass==0.9.0",
)


def sglang_python() -> Path:
    """The Python of a venv that runs ``python -m sglang.launch_server --device cpu`` (built
    once, several minutes; pip's output in ``sglang-server-venv.log``)."""
    from .testbed_vllm import vllm_python

    root = cache_dir() / "sglang-server-venv"
    python = root / "bin" / "python"
    done = root / ".installed"
    pins = "\n".join([*SGLANG, *SGLANG_KERNEL, *SGLANG_TORCH, *SGLANG_EXTRAS])
    if done.exists() and done.read_text() == pins:
        return python
    vllm_site = sorted(vllm_python().parent.parent.glob("lib/python*/site-packages"))[0]
    with locked(cache_dir() / "sglang-server-venv.lock"):
        if done.exists() and done.read_text() == pins:
            return python
        base = shutil.which(SGLANG_PYTHON)
        if base is None:
            raise RuntimeError(f"the SGLang test bed needs {SGLANG_PYTHON}")
        wheel = _download(SGLANG, sdist=False)
        log = cache_dir() / "sglang-server-venv.log"
        _log(f"installing SGLang's server into {root}: minutes, once; log in {log}")
        shutil.rmtree(root, ignore_errors=True)
        pip = [str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
        kernel = f"{SGLANG_KERNEL[0]}=={SGLANG_KERNEL[1]}"
        with log.open("wb") as out:
            for cmd in (
                [base, "-m", "venv", str(root)],
                [*pip, *SGLANG_TORCH],
                [*pip, "--no-deps", str(wheel), kernel, *SGLANG_EXTRAS],
            ):
                out.write(f"$ {' '.join(cmd)}\n".encode())
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log.read_text(errors="replace").splitlines()[-30:]
                    raise RuntimeError("installing SGLang's server failed:\n" + "\n".join(tail))
        site = sorted(root.glob("lib/python*/site-packages"))[0]
        (site / "zz_vllm_venv.pth").write_text(f"{vllm_site}\n")  # after its own packages
        done.write_text(pins)
    return python


@contextlib.contextmanager
def sglang_server(
    model_dir: Path, extra: list[str] | None = None, log: Path | None = None, timeout: float = 600
) -> Iterator[str]:
    """SGLang's server on a free loopback port, ``--device cpu`` (torch_native attention where
    the CPU has no AMX); yields its URL once ``/health`` answers 200 and stops it after."""
    python = sglang_python()
    port = free_port()
    cmd = [
        str(python), "-m", "sglang.launch_server", "--model-path", str(model_dir),
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--max-total-tokens", "8192", "--context-length", "2048", *(extra or []),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url + "/health", proc, timeout=timeout)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text(errors="replace").splitlines()[-30:] if log else []
            raise RuntimeError(f"SGLang did not start: {exc}\n" + "\n".join(tail)) from None
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not isinstance(out, int):
            out.close()
