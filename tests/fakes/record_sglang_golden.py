"""Record a real SGLang's answers to every request shape in ``sglang_golden.py``.

    cd tests && python -m fakes.record_sglang_golden --url http://127.0.0.1:30000

(the Python of ``./run``'s venv; ``-m`` from ``tests/`` makes ``fakes`` importable). The
server must serve SmolLM2-135M-Instruct (``turnstile_testbed.vllm.vllm_model``) with
``--context-length 2048``; the suite does not start SGLang (README: SGLang on this CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import httpx

from fakes import sglang_golden as g
from fakes import vllm_golden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="a running SGLang")
    ap.add_argument("--out", type=Path, default=g.GOLDEN)
    args = ap.parse_args()
    with httpx.Client(timeout=120) as client:
        info = client.get(args.url + "/server_info").json()
        model = client.get(args.url + "/v1/models").json()["data"][0]["id"]
        answers = {}
        for case in g.cases(model):
            got = vllm_golden.answer(client, args.url, case)
            got["example"] = got["example"].replace(model, "<model>")
            answers[case.name] = {
                "request": {"method": case.method, "path": case.path, "body": case.body},
                **got,
            }
            print(f"{case.name}: {got['status']} {got['media_type']}", file=sys.stderr)
    golden = {
        "sglang": info.get("version"),
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "model": "SmolLM2-135M-Instruct (turnstile_testbed.vllm.vllm_model), named <model>",
        "server": "--device cpu --context-length 2048 (torch_native attention: no AMX here)",
        "cases": answers,
    }
    args.out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"SGLang {golden['sglang']}: {len(answers)} answers in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
