"""Write the routed-experts golden answers (``routed_golden.py`` says what each holds).

    cd tests && flock /tmp/turnstile-heavy.lock python -m fakes.record_routed_golden sglang
    cd tests && python -m fakes.record_routed_golden vllm

``sglang``: starts a real SGLang (the test bed's, ``--dtype float32``) on the tiny random
Qwen3-MoE with routing capture (or ``--url`` to one running) and records its answers.
``vllm``: vLLM's CPU build cannot capture routing, so this fills the real recorded answers of
the same requests (``golden/vllm-0.32.0.json``) with ``routed_experts`` made by vLLM's own
``numpy2base64``, run in the vLLM venv, on rows of the documented shape and dtype.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import httpx
import numpy as np

from fakes import routed_golden as r
from fakes import vllm_golden as g
from turnstile.testing.routing import HashRouter, forwarded
from turnstile_testbed import moe as testbed_moe
from turnstile_testbed import sglang as testbed_sglang
from turnstile_testbed import vllm as testbed_vllm

_NUMPY2BASE64 = """
import json, sys
import numpy as np
from vllm.utils.serial_utils import numpy2base64
arrays = json.loads(sys.stdin.read())
print(json.dumps([numpy2base64(np.asarray(a, dtype=np.uint8)) for a in arrays]))
"""


def _answers(url: str, cases: list[g.Case]) -> dict:
    out = {}
    with httpx.Client(timeout=120) as client:
        for case in cases:
            got = g.answer(client, url, case)
            out[case.name] = {
                "request": {"method": case.method, "path": case.path, "body": case.body},
                **got,
            }
            print(f"{case.name}: {got['status']} {got['media_type']}", file=sys.stderr)
    return out


def record_sglang(url: str | None) -> dict:
    if url:
        answers = _answers(url, r.sglang_cases())
    else:
        model = testbed_moe.tiny_moe()
        extra = ["--dtype", "float32"]
        with testbed_sglang.sglang_server(model, extra=extra, routed_experts=True) as started:
            answers = _answers(started, r.sglang_cases())
    return {
        "sglang": testbed_sglang.SGLANG[1],
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "model": f"tiny random Qwen3-MoE (turnstile_testbed.moe.tiny_moe: {testbed_moe.MOE_SHAPE})",
        "server": "--device cpu --dtype float32 --enable-return-routed-experts "
        "(testbed_sglang.cpu_routing_shim on its PYTHONPATH)",
        "cases": answers,
    }


def _vllm_b64(arrays: list[np.ndarray]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(testbed_vllm.vllm_python()), "-c", _NUMPY2BASE64],
        input=json.dumps([a.tolist() for a in arrays]),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def synthesize_vllm() -> dict:
    real = json.loads(g.GOLDEN.read_text())["cases"]
    router = HashRouter(r.LAYERS, r.TOP_K, r.EXPERTS)
    cases = {c.name: c for c in r.vllm_cases()}
    todo: list[tuple[str, np.ndarray]] = []
    for name, case in cases.items():
        base = real[r.VLLM_FROM[name]]
        if base["status"] != 200:
            continue
        f = r.routing_facts("vllm", case, base["example"])
        prompt, completion = f["prompt"], f["completion"]
        lo, hi = forwarded(len(prompt), len(completion), f["start"])
        todo.append((name, router.rows(prompt + completion)[lo:hi]))
    encoded = dict(zip([n for n, _ in todo], _vllm_b64([a for _, a in todo]), strict=True))
    answers = {}
    for name, case in cases.items():
        base = real[r.VLLM_FROM[name]]
        text = base["example"]
        if name in encoded:  # the finished choice: the whole answer's, a stream's final chunk
            events = text.split("\n\n")
            last = max(i for i, e in enumerate(events) if '"finish_reason":"' in e)
            assert '"routed_experts":null' in events[last], name
            events[last] = events[last].replace(
                '"routed_experts":null', f'"routed_experts":"{encoded[name]}"', 1
            )
            text = "\n\n".join(events)
        else:  # InputProcessor's VLLMValidationError, as 0.32 words a sampling error
            start = case.body["sampling_params"]["routed_experts_prompt_start"]  # type: ignore[index]
            message = (
                f"routed_experts_prompt_start must be between 0 and the prompt length "
                f"({len(r.PROMPT)}), inclusive. "
                f"(parameter=routed_experts_prompt_start, value={start})"
            )
            err = {
                "error": {
                    "message": message,
                    "type": "BadRequestError",
                    "param": "routed_experts_prompt_start",
                    "code": 400,
                }
            }
            text = json.dumps(err, separators=(",", ":"))
        kind = base["media_type"]
        if kind == "text/event-stream":
            shape = g.sse_shape(text.encode())
        else:
            shape = g.shape(json.loads(text))
        answers[name] = {
            "request": {"method": case.method, "path": case.path, "body": case.body},
            "status": base["status"],
            "media_type": kind,
            "shape": shape,
            "facts": g.facts(case, text, kind, base["status"]),
            "example": text,
            "made_from": r.VLLM_FROM[name],
        }
    return {
        "vllm": "0.32.0",
        "synthesized": "vLLM 0.32's CPU build refuses --enable-return-routed-experts "
        "('AuxOutput Connector requires Model Runner V2'; with VLLM_USE_V2_MODEL_RUNNER=1 "
        "'Model Runner V2 requires Triton'): each answer is the real recorded one named in "
        "made_from with routed_experts set by vLLM's own numpy2base64 (uint8, shape "
        "(prompt + completion - 1 - start, layers, top_k)), the error worded as "
        "InputProcessor raises it",
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "cases": answers,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=("sglang", "vllm"))
    ap.add_argument("--url", help="a running SGLang serving the tiny MoE with routing on")
    args = ap.parse_args()
    if args.engine == "sglang":
        golden, out = record_sglang(args.url), r.SGLANG
    else:
        golden, out = synthesize_vllm(), r.VLLM
    out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"{len(golden['cases'])} answers in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
