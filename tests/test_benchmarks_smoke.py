"""Each benchmark script runs end to end in its --quick mode and prints its table.

No timing is asserted here: timings belong in the benchmarks' own output (see
benchmarks/README.md). This only keeps the scripts working as the code under them changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainers import venv as trainers_venv

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "agent_sessions.py": "later calls extended the recorded tokens",
    "overhead.py": "x fastest relay",
    "long_session.py": "Turnstile / relay",
    "memory.py": "bytes / recorded token",
    "end_to_end.py": "Turnstile / direct wall time",
    "soak.py": "RSS after close",
    "ray_scale.py": "1 vs 2 replicas, through Serve's proxy and direct, vs one process",
    "profile_call.py": "Turnstile CPU per call",
    "store_backends.py": "gateway+database pg/sqlite",
    "group_commit.py": "group / per call: CPU",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_quick(script: str) -> None:
    r = _quick(script)
    assert SCRIPTS[script] in r.stdout, r.stdout[-3000:]


def _quick(script: str, *args: str) -> subprocess.CompletedProcess:
    """``benchmarks/<script> --quick ARGS``, which must exit 0."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.timeout(120)
def test_agent_sessions_workers_quick() -> None:
    """agent_sessions.py with ``turnstile serve --workers 2`` as a third target: its sessions
    at their base URLs, every later call extending its recorded tokens."""
    r = _quick(
        "agent_sessions.py",
        *("--workers", "2", "--modes", "paced", "--conc", "4", "--deep", "0", "--flat", "0"),
    )
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("chained (2 workers)")]
    done, later = line.split(": ")[1].split(" ")[0].split("/")
    assert done == later and int(later) > 0, line
    assert "| 2 workers |" in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(120)
def test_peers_quick() -> None:
    """peers.py with the targets that need only the project venv (the peers' own venvs come
    from benchmarks/setup_peer_venvs.sh): the engine's drifting reply and the exactness check."""
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "peers.py"),
            "--quick",
            "--targets",
            "relay,turnstile",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "record completion = sampled" in r.stdout, r.stdout[-3000:]
    # Turnstile's records equal what the engine received and sampled, and every turn's prompt
    # carries the previous turn's sampled IDs (4 calls, 3 continuations, per mode).
    rows = [x for x in r.stdout.splitlines() if x.startswith("| turnstile ")]
    exact = [x for x in rows if "/3 " in x]
    assert len(exact) == 2 and all("4/4" in x and "3/3" in x for x in exact), r.stdout[-3000:]


@pytest.fixture(scope="module")
def trainers_python() -> Path:
    """The trainers venv (torch, ...), built here on a fresh machine: a fixture, so the
    minutes of pip are outside the test's timeout (``timeout_func_only``)."""
    return trainers_venv.ensure()


@pytest.mark.timeout(180)
def test_train_proof_quick(tmp_path: Path, trainers_python: Path) -> None:
    """train_proof.py --quick: two GRPO steps per arm on the tiny model through Turnstile and
    llama-server, the weights synced each step. The exact arm's trainer agrees with the
    behaviour logprobs (F32 engine, float32 trainer: the bound of
    tests/test_trainer_agreement.py) and never clips; the re-tokenized arm trains on tokens
    that were not sampled and clips."""
    out = tmp_path / "rows.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_proof.py"), "--quick", "--json", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| naive |" in r.stdout, r.stdout[-3000:]
    rows = json.loads(out.read_text())["rows"]
    exact = [x for x in rows if x["arm"] == "exact"]
    naive = [x for x in rows if x["arm"] == "naive"]
    assert len(exact) == len(naive) == 2
    assert all(x["max_abs"] <= 2e-3 and x["clip_frac"] == 0.0 for x in exact), exact
    assert all(x["tokens_differ"] > 0 and x["clip_frac"] > 0.05 for x in naive), naive
