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
from collections.abc import Iterator
from pathlib import Path

from . import _download, cache_dir, engine_process, free_port
from .venv import pinned_venv, pip_install

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

    def steps(python: Path) -> list[list[str]]:
        wheel = _download(SGLANG, sdist=False)
        return [[*pip_install(python), "--no-deps", str(wheel)]]

    what = f"{SGLANG[0]}=={SGLANG[1]} (no dependencies)"
    root = pinned_venv("sglang-venv", SGLANG_PYTHON, SGLANG, steps, what)
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
    from .vllm import vllm_python

    def steps(python: Path) -> list[list[str]]:
        wheel = _download(SGLANG, sdist=False)
        kernel = f"{SGLANG_KERNEL[0]}=={SGLANG_KERNEL[1]}"
        return [
            [*pip_install(python), *SGLANG_TORCH],
            [*pip_install(python), "--no-deps", str(wheel), kernel, *SGLANG_EXTRAS],
        ]

    def link_vllm(root: Path) -> None:
        vllm_site = sorted(vllm_python().parent.parent.glob("lib/python*/site-packages"))[0]
        site = sorted(root.glob("lib/python*/site-packages"))[0]
        (site / "zz_vllm_venv.pth").write_text(f"{vllm_site}\n")  # after its own packages

    pins = [*SGLANG, *SGLANG_KERNEL, *SGLANG_TORCH, *SGLANG_EXTRAS]
    root = pinned_venv(
        "sglang-server-venv", SGLANG_PYTHON, pins, steps, "SGLang's server", after=link_vllm
    )
    return root / "bin" / "python"


# SGLang 0.5.23 on a CPU refuses routed-expert capture at start: its capturer's host buffer is
# allocated with ``pin_memory=True`` and registered with ``cudaHostRegister`` unconditionally
# (``mem_cache/pool_host/common.alloc_with_host_register``; its unregister in
# ``state_capturer/base.py`` is guarded by ``is_cuda() or is_hip()``, the register is not), so
# ``--enable-return-routed-experts`` dies with "RuntimeError: Found no NVIDIA driver on your
# system". Pinning means nothing without a GPU: this ``sitecustomize`` (on the server's
# ``PYTHONPATH``, so every process SGLang spawns loads it) skips the registration there, as
# the unregister already does; nothing else of SGLang's capture path is touched. The routing
# it then returns equals transformers' router (tests/test_moe_sglang_real.py).
_CPU_PIN_SHIM = """\
import importlib.abc, importlib.machinery, sys

_TARGET = "sglang.srt.mem_cache.pool_host.common"


class _SkipHostRegisterWithoutCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import torch

            if not torch.cuda.is_available():
                module._cuda_host_register = lambda *args, **kwargs: None

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _SkipHostRegisterWithoutCuda())
"""


def cpu_routing_shim() -> Path:
    """A directory holding the ``sitecustomize`` above (written once into the cache): put it
    on SGLang's ``PYTHONPATH`` for ``--enable-return-routed-experts`` on a CPU."""
    folder = cache_dir() / "sglang-cpu-routing-shim"
    path = folder / "sitecustomize.py"
    if not path.exists() or path.read_text() != _CPU_PIN_SHIM:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_text(_CPU_PIN_SHIM)
        os.replace(tmp, path)
    return folder


@contextlib.contextmanager
def sglang_server(
    model_dir: Path,
    extra: list[str] | None = None,
    log: Path | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    routed_experts: bool = False,
) -> Iterator[str]:
    """SGLang's server on a free loopback port, ``--device cpu`` (torch_native attention where
    the CPU has no AMX); yields its URL once ``/health`` answers 200 and stops it after.
    ``routed_experts``: start it with ``--enable-return-routed-experts`` and the CPU shim
    (:func:`cpu_routing_shim`); ``env``: more environment."""
    python = sglang_python()
    port = free_port()
    cmd = [
        str(python), "-m", "sglang.launch_server", "--model-path", str(model_dir),
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--max-total-tokens", "8192", "--context-length", "2048", *(extra or []),
    ]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **(env or {})}
    if routed_experts:
        cmd.append("--enable-return-routed-experts")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(cpu_routing_shim()), env.get("PYTHONPATH")])
        )
    with engine_process("SGLang", cmd, env, port, log, timeout) as url:
        yield url
