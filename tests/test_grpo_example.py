"""examples/grpo_loop.py runs end to end (llama-server, Turnstile, client, converter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_grpo_example_prints_a_consistent_verl_batch(tiny_qwen2, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",  # a crash prints where (CI once saw a bare SIGSEGV at exit)
            str(ROOT / "examples" / "grpo_loop.py"),
            "--model",
            "tiny",
            "--groups",
            "2",
            "--group-size",
            "3",
            "--max-tokens",
            "12",
            "--data",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    shapes = result["shapes"]
    assert result["n"] == 6
    assert result["uids"] == ["task-0"] * 3 + ["task-1"] * 3
    B, P = shapes["prompts"]
    R = shapes["responses"][1]
    assert B == 6 and shapes["input_ids"] == [6, P + R] == shapes["attention_mask"]
    assert shapes["rollout_log_probs"] == shapes["response_mask"] == [6, R]
    # Group-relative advantages sum to zero within each group.
    adv = result["advantages"]
    assert abs(sum(adv[:3])) < 1e-3 and abs(sum(adv[3:])) < 1e-3
    # The records stayed in the store the example named.
    assert (tmp_path / "data" / "turnstile.sqlite3").exists()
