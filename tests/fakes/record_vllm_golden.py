"""Record a real vLLM's answers to every request shape the fake serves, as golden files.

    cd tests && python -m fakes.record_vllm_golden                # starts both servers itself
    cd tests && python -m fakes.record_vllm_golden --main URL --defaults URL

(the Python of ``./run``'s venv, ``~/.cache/turnstile/venv/bin/python``; ``-m`` from ``tests/``
makes ``fakes`` importable, the venv gives ``turnstile``)

Both servers run SmolLM2-135M-Instruct from the test bed (``turnstile_testbed.vllm``): the
main one as ``tests/test_vllm_real.py`` starts it (scale-out, processed logprobs, 2048
tokens, dev mode), the other on vLLM's defaults (scale-out off). The answers' structure goes
into ``tests/fakes/golden/vllm-<version>.json`` (see ``vllm_golden.py``), with each request and
one raw answer for reading; ``tests/test_vllm_golden.py`` holds the fake to it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import tempfile
from pathlib import Path

import httpx

from fakes import vllm_golden as g


def record(main: str, defaults: str, out: Path) -> dict:
    with httpx.Client(timeout=120) as client:
        version = client.get(main + "/version").json()["version"]
        model = client.get(main + "/v1/models").json()["data"][0]["id"]
        answers = {}
        for case in g.cases(model):
            base = main if case.server == g.MAIN else defaults
            got = g.answer(client, base, case)
            got["example"] = got["example"].replace(model, "<model>")  # not this machine's path
            answers[case.name] = {
                "request": {"method": case.method, "path": case.path, "body": case.body},
                "server": case.server,
                **got,
            }
            print(f"{case.name}: {got['status']} {got['media_type']}", file=sys.stderr)
    golden = {
        "vllm": version,
        "recorded": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "model": "SmolLM2-135M-Instruct (turnstile_testbed.vllm.vllm_model), named <model>",
        "servers": {g.MAIN: g.MAIN_FLAGS + ["env VLLM_SERVER_DEV_MODE=1"], g.DEFAULTS: []},
        "cases": answers,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, indent=1, sort_keys=False) + "\n")
    return golden


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--main", help="a vLLM started with the main flags (else one is started)")
    ap.add_argument("--defaults", help="a vLLM on its defaults (else one is started)")
    ap.add_argument("--out", type=Path, default=g.GOLDEN)
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        from turnstile_testbed import vllm as testbed_vllm

        logs = Path(tempfile.mkdtemp(prefix="vllm-golden-"))
        urls = {}
        for name, url, flags, env in (
            ("main", args.main, g.MAIN_FLAGS, g.MAIN_ENV),
            ("defaults", args.defaults, [], {}),
        ):
            urls[name] = url or stack.enter_context(
                testbed_vllm.vllm_server(
                    testbed_vllm.vllm_model(), flags, log=logs / f"{name}.log", env=env
                )
            )
        golden = record(urls["main"], urls["defaults"], args.out)
    print(f"vLLM {golden['vllm']}: {len(golden['cases'])} answers in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
