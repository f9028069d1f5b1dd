"""The package as a user installs it (issue 46): the wheel built from this checkout, installed
into a clean virtualenv outside the repository, gives ``turnstile serve``, ``verify``,
``export``, ``view`` and the client; ``turnstile serve`` from it records a chat call against the
test bed's llama-server, and its export reads back what the engine sampled.

Nothing of the repository is on that venv's path: it runs from a scratch directory with no
``PYTHONPATH``, and the package it imports is the installed one. The wheel holds the package
only (no tests, benchmarks or docs). The dependencies come from the registry (pip's cache after
the first run), pinned by the wheel's own metadata.

The test bed is not in the wheel (it is the repository's own distribution, ``testbed/``):
no module of it is packed, none of the wheel's files names it, and importing ``turnstile`` and
every module of ``turnstile.testing`` (the fakes a user may test against) in that venv loads
nothing of it, where it is not installed at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest

import turnstile_testbed as testbed

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent


def _clean_env() -> dict[str, str]:
    """A user's shell: no PYTHONPATH (``./run`` sets one to this checkout), no venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "TURNSTILE_TOKEN")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _ok(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    p = subprocess.run(
        cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert p.returncode == 0, f"{cmd}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the venv's bin directory, a scratch directory outside the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # built from a copy of the checkout's files as a clone has them (tracked, and new ones not
    # ignored): setuptools' build/lib in the checkout keeps modules that have since moved
    # out of the package, and a wheel built there packed them again
    src = tmp / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True
    )
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, src / name)
    else:  # not a git checkout (an exported tree): everything but builds and caches
        junk = ("build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "site")
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*junk, "turnstile-data"))
    _ok([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], tmp)
    [wheel] = dist.glob("turnstile-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"turnstile"}, tops
    assert "turnstile/viewer/static/index.html" in names or any(
        n.startswith("turnstile/viewer/static/") for n in names
    )
    # the test bed's modules, by their names here and where they were inside the package
    bed = {p.stem for p in (ROOT / "testbed" / "turnstile_testbed").glob("*.py")} - {"__init__"}
    assert bed >= {"vllm", "sglang", "provision", "demo", "postgres", "moe_truth"}, bed
    old = re.compile(r"turnstile/(testing/)?(testbed\w*|provision|demo|postgres|moe_truth)\.py")
    packed = [n for n in names if old.fullmatch(n) or "turnstile_testbed" in n]
    assert not packed, packed
    with zipfile.ZipFile(wheel) as z:
        naming = [n for n in names if n.endswith(".py") and b"turnstile_testbed" in z.read(n)]
    assert not naming, naming
    venv = tmp / "venv"
    _ok([sys.executable, "-m", "venv", str(venv)], tmp)
    _ok(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)], tmp
    )
    yield venv / "bin", tmp


def test_the_installed_package_is_not_the_checkout(installed):
    bin_, tmp = installed
    where = _ok([str(bin_ / "python"), "-c", "import turnstile; print(turnstile.__file__)"], tmp)
    assert str(ROOT) not in where and "site-packages" in where, where
    for cmd in ("serve", "verify", "export", "view"):
        assert "usage:" in _ok([str(bin_ / "turnstile"), cmd, "--help"], tmp)
    # the same command as ``python -m turnstile``
    assert "usage: turnstile serve" in _ok(
        [str(bin_ / "python"), "-m", "turnstile", "serve", "-h"], tmp
    )
    # the client a trainer imports, from the installed package
    _ok([str(bin_ / "python"), "-c", "from turnstile import Client; Client"], tmp)


def test_the_installed_package_imports_nothing_of_the_test_bed(installed):
    """``turnstile`` and every ``turnstile.testing`` module, imported in the clean venv: none
    of the test bed's modules is loaded (under its own name or its old ``turnstile.*`` ones),
    and the test bed itself is not importable there."""
    bin_, tmp = installed
    probe = """
import importlib, pkgutil, sys
import turnstile, turnstile.testing, turnstile.app.cli
for m in pkgutil.iter_modules(turnstile.testing.__path__):
    importlib.import_module("turnstile.testing." + m.name)
print(len([m for m in sys.modules if m.startswith("turnstile.testing.")]))
old = ("turnstile.demo", "turnstile.provision", "turnstile.testing.postgres",
       "turnstile.testing.moe_truth")
print(sorted(m for m in sys.modules if m.split(".")[0] == "turnstile_testbed"
             or m.startswith("turnstile.testbed") or m in old))
try:
    import turnstile_testbed
    print("importable", turnstile_testbed.__file__)
except ModuleNotFoundError as e:
    print("absent", e.name)
"""
    count, loaded, bed = _ok([str(bin_ / "python"), "-c", probe], tmp).splitlines()[-3:]
    assert int(count) >= 10, count  # the fakes, the relay, the mock engine were all imported
    assert loaded == "[]", loaded
    assert bed == "absent turnstile_testbed", bed


def test_serve_from_the_wheel_records_what_llama_server_sampled(installed, tiny_qwen2):
    bin_, tmp = installed
    data, out = tmp / "data", tmp / "export"
    port = testbed.free_port()
    with testbed.llama_server(tiny_qwen2, ctx=2048, parallel=1) as engine:
        log = (tmp / "serve.log").open("wb")
        serve = subprocess.Popen(
            [
                str(bin_ / "turnstile"),
                "serve",
                "--engine",
                "llama-cpp",
                "--engine-url",
                engine,
                "--model",
                str(tiny_qwen2),
                "--port",
                str(port),
                "--data",
                str(data),
                "--no-auth",
            ],
            cwd=tmp,
            env=_clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            testbed.wait_healthy(url + "/v1/models", serve, timeout=120)
            import httpx

            session = httpx.post(url + "/v1/sessions", json={}).json()
            client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
            reply = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=6,
                logit_bias={"151645": -100, "151643": -100},  # no early end: 6 tokens
                logprobs=True,
            )
            calls = httpx.get(url + f"/v1/sessions/{session['id']}/calls").json()["data"]
        finally:
            serve.terminate()
            serve.wait(30)
            log.close()
    [call] = calls
    assert call["status"] == "ok" and len(call["completion_ids"]) == 6
    sent = [x.logprob for x in reply.choices[0].logprobs.content]
    assert call["completion_logprobs"] == pytest.approx(sent, abs=1e-6)
    # the installed export reads the same record back as the trainer's Parquet
    export = [str(bin_ / "turnstile"), "export", "--data", str(data), "--out", str(out)]
    _ok([*export, "--tables", "trajectories", "--partition", "none"], tmp)
    parts = sorted(out.rglob("*.parquet"))
    assert parts, sorted(out.rglob("*"))
    rows = [r for part in parts for r in pq.read_table(part).to_pylist()]
    [row] = [r for r in rows if r["session_id"] == session["id"]]
    assert row["token_ids"][-6:] == call["completion_ids"]
    assert row["loss_mask"][-6:] == [1] * 6 and sum(row["loss_mask"]) == 6
