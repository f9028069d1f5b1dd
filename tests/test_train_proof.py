"""``benchmarks/train_proof.py --quick`` runs exactly as its documentation says, from a fresh
shell (the venv's Python on the script's path, from the repository root, no ``PYTHONPATH``:
not through pytest's import path), and checks itself: the exact arm agrees with the engine
within the bound, the weights moved, and the negative control (the last update's weight sync
skipped) trips the bound. The truths are outside the script's own idea of itself: the
engine's logprobs as Turnstile recorded them against PyTorch's forward in the trainers venv,
the trainer's saved tensors, and the record's sampled tokens."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from trainers import venv as trainers_venv

import turnstile_testbed as testbed

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTED = "~/.cache/turnstile/venv/bin/python benchmarks/train_proof.py --quick"
# what a fresh login shell has; nothing of pytest's (no PYTHONPATH, no virtualenv activated)
WHERE = r"call \d+ (prompt|completion) token \d+|past the sampled end \(token \d+\)"
KEEP = ("HOME", "PATH", "LANG", "TMPDIR", "TURNSTILE_CACHE", "TURNSTILE_LLAMA_BUILD", "USER")


@pytest.fixture(scope="module")
def trainers_python() -> Path:
    """The trainers venv, built here first on a fresh machine (minutes of pip outside the
    test's timeout)."""
    return trainers_venv.ensure()


@pytest.fixture(scope="module")
def quick(trainers_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One documented run: its exit code, output and JSON."""
    out = tmp_path_factory.mktemp("train-proof") / "rows.json"
    command = DOCUMENTED
    if os.environ.get("TURNSTILE_CACHE"):  # the venv where this test bed keeps it
        command = command.replace("~/.cache/turnstile", shlex.quote(str(testbed.cache_dir())))
    env = {k: os.environ[k] for k in KEEP if k in os.environ}
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", f"{command} --json {shlex.quote(str(out))}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    return {"r": r, "json": json.loads(out.read_text()) if out.exists() else None}


@pytest.mark.timeout(600)
def test_train_proof_quick_runs_as_documented_and_its_checks_hold(quick: dict) -> None:
    r = quick["r"]
    tail = r.stdout[-4000:] + r.stderr[-3000:]
    assert r.returncode == 0, tail
    res = quick["json"]
    assert res is not None, tail
    checks = {c["check"]: c for c in res["checks"]}
    assert all(c["ok"] for c in checks.values()), checks
    assert "PASS" in r.stdout and "FAIL" not in r.stdout, tail
    rows = res["rows"]
    by = {a: [x for x in rows if x["arm"] == a] for a in ("exact", "naive", "recompute", "control")}
    assert [len(by[a]) for a in ("exact", "naive", "recompute", "control")] == [2, 2, 2, 1], rows
    # the exact arm within the agreement bound of tests/test_trainer_agreement.py, unclipped
    assert all(x["max_abs"] <= 2e-3 and x["clip_frac"] == 0.0 for x in by["exact"]), by["exact"]
    # every update moved the trainer's saved weights
    assert all(x["moved_max"] > 0 for a in ("exact", "naive", "recompute") for x in by[a]), rows
    # the negative control: the same engine on the weights before the last update trips it
    [control] = by["control"]
    assert control["moved_max"] is None and control["max_abs"] > 2e-3, control
    assert any(c.startswith("negative control") and c.endswith("> 0.002") for c in checks)
    # recompute: ratio 1 at the update, so nothing clips
    assert all(x["clip_frac"] == 0.0 for x in by["recompute"]), by["recompute"]
    # every sample says where its re-tokenized version first differs (or that it does not)
    for x in rows:
        for d in x["per_sample"]:
            loc = d["first_diff"]
            assert loc is None or re.fullmatch(WHERE, loc), d
    assert "Where the re-tokenized version first differs" in r.stdout, tail
