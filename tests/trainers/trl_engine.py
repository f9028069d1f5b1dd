"""The engine's side of the TRL weight sync (``examples/trl_grpo.py --sync-command``): the
trainer's ``save_pretrained`` folder → an F32 GGUF (``benchmarks/policy_gguf.py``) →
llama-server restarted on it, on the same port, so Turnstile's engine URL stays the same.

Runs in the project venv (``gguf``); ``tests/test_trl_grpo.py`` calls it once to start the
engine on the initial weights, and TRL's rollout function calls it at every sync::

    python tests/trainers/trl_engine.py WEIGHTS_DIR --port P --state DIR [--stop]

``DIR`` holds the server's pid, its log, the GGUF and ``syncs.jsonl`` (one line per sync:
the folder, the GGUF's sha256, the pid), which the test reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import turnstile_testbed as testbed  # noqa: E402
from benchmarks import policy_gguf  # noqa: E402

TEMPLATE = "Qwen-Qwen2.5-7B-Instruct"  # hermes tool calls: what Turnstile renders too


def stop(state: Path) -> None:
    pid_file = state / "llama.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid_file.unlink()


def sync(weights: Path, port: int, state: Path) -> dict:
    config = json.loads((weights / "config.json").read_text())
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 1e4))
    tensors = {
        k: np.asarray(v, np.float32) for k, v in load_file(weights / "model.safetensors").items()
    }
    gguf = state / "policy.gguf"
    template = (testbed.templates_dir() / f"{TEMPLATE}.jinja").read_text()
    policy_gguf.write_gguf(tensors, config, testbed.smollm2_gguf(), gguf, "f32", template)
    stop(state)
    cmd = [
        str(testbed.llama_server_binary()),
        *("-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)),
        *("-c", "4096", "-np", "4", "-t", "1", "--no-webui"),
    ]
    with (state / "llama.log").open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (state / "llama.pid").write_text(str(proc.pid))
    testbed.wait_healthy(f"http://127.0.0.1:{port}/health", proc)
    row = {
        "weights": str(weights),
        "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
        "pid": proc.pid,
    }
    with (state / "syncs.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("weights", type=Path, nargs="?")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--stop", action="store_true")
    args = ap.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    if args.stop:
        stop(args.state)
    else:
        print(json.dumps(sync(args.weights, args.port, args.state)))


if __name__ == "__main__":
    main()
