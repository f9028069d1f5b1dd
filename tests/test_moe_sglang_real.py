"""Routed experts from a real engine, held to the model's own router: SGLang 0.5.23 on this CPU
serves the tiny random Qwen3-MoE (``turnstile_testbed.moe.tiny_moe``, float32) with
``--enable-return-routed-experts``; Turnstile (token-in, ``--routed-experts on``) records a
multi-turn session through the recording relay; the trajectory's ``routed_experts`` must equal
what SGLang sent for every row, and transformers' forward of the same weights on the recorded
``token_ids`` must pick the same top-2 experts per token and layer (rows where the 2nd and 3rd
router logits tie within 1e-4 aside: none occurred here).

SGLang 0.5.23 refuses routing capture on a machine without a GPU ("Found no NVIDIA driver on
your system": its capture buffer is pinned with ``cudaHostRegister`` unconditionally); the test
bed's shim (``testbed_sglang.cpu_routing_shim``) skips that registration, touching nothing else.
The first test shows the refusal without it, so a release that fixes it is noticed.

Opt-in, as ``tests/test_sglang_real.py``: ``TURNSTILE_SGLANG=1`` (the test bed builds the
venv, about 7 GB, and starts the server: a minute or two each).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import Turnstile
from openai import OpenAI
from test_vllm_real import Relay, start_relay

import turnstile_testbed as testbed
from turnstile.store.store import Store
from turnstile.testing import routing
from turnstile.verify import verify_sessions
from turnstile.verify.routing import CONSISTENT
from turnstile_testbed import moe as testbed_moe
from turnstile_testbed import sglang as testbed_sglang
from turnstile_testbed.moe_truth import router_truth

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        os.environ.get("TURNSTILE_SGLANG") != "1",
        reason="opt-in: TURNSTILE_SGLANG=1 (SGLang's CPU venv, about 7 GB; README)",
    ),
]
LAYERS = testbed_moe.MOE_SHAPE["num_hidden_layers"]
TOP_K = testbed_moe.MOE_SHAPE["num_experts_per_tok"]


def test_without_the_shim_sglang_refuses_routing_on_a_cpu(tmp_path):
    python = testbed_sglang.sglang_python()
    cmd = [
        str(python), "-m", "sglang.launch_server", "--model-path", str(testbed_moe.tiny_moe()),
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(testbed.free_port()),
        "--dtype", "float32", "--enable-return-routed-experts",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "RoutedExpertsCapturer" in out and "_cuda_host_register" in out
    assert "Found no NVIDIA driver on your system" in out


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    log = tmp_path_factory.mktemp("sglang-moe") / "sglang.log"
    model = testbed_moe.tiny_moe()
    extra = ["--dtype", "float32"]
    with testbed_sglang.sglang_server(model, extra=extra, log=log, routed_experts=True) as url:
        rel, server = start_relay(url, paths=("/generate",))
        yield rel
        server.shutdown()
        server.server_close()


def test_recorded_routing_is_what_sglang_sent_and_what_the_router_picks(relay, tmp_path):
    model = testbed_moe.tiny_moe()
    args = ("--engine", "sglang", "--routed-experts", "on")
    ts = Turnstile(relay.url, model, tmp_path / "data", tmp_path / "ts.log", args).start()
    try:
        sid = ts.session()["id"]
        client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)

        def turn(messages: list[dict], stream: bool) -> str:
            kw = dict(model="m", messages=messages, max_tokens=8, temperature=1.0, seed=5)
            if not stream:
                return client.chat.completions.create(**kw).choices[0].message.content or ""
            parts = client.chat.completions.create(**kw, stream=True)
            return "".join(p.choices[0].delta.content or "" for p in parts if p.choices)

        msgs = [{"role": "user", "content": "Which experts?"}]
        msgs.append({"role": "assistant", "content": turn(msgs, stream=False)})
        msgs.append({"role": "user", "content": "And now?"})
        turn(msgs, stream=True)  # an extension: only new rows asked for
        turn(msgs, stream=False)  # a retry (SGLang's prefix cache holds the prompt)

        exchanges = [ex for ex in relay.exchanges if "input_ids" in ex.request]
        assert len(exchanges) == 3
        wire = []
        for ex in exchanges:
            assert ex.request["return_routed_experts"] is True
            parts = ex.parts()
            out: list[int] = []
            rows = None
            for p in parts:
                ids, meta = p["output_ids"], p["meta_info"]
                out = list(ids) if len(ids) == meta["completion_tokens"] else out + list(ids)
                if meta.get("routed_experts"):
                    rows = routing.decode_sglang(meta["routed_experts"], LAYERS, TOP_K)
            start = ex.request.get("routed_experts_start_len", 0)
            prompt = ex.request["input_ids"]
            assert rows is not None and len(rows) == len(prompt) + len(out) - 1 - start
            wire.append((prompt, out, start, rows))
        assert wire[0][2] == 0 and wire[1][2] > 0

        trajs = ts.get(f"/v1/sessions/{sid}/trajectories")["data"]
        for prompt, out, start, rows in wire:
            full = prompt + out
            t = next(t for t in trajs if t["token_ids"][: len(full)] == full)
            got = np.asarray(t["routed_experts"])[start : start + len(rows)]
            assert (got == rows).all()  # what SGLang sent, row for row
        truth = router_truth(model, [t["token_ids"] for t in trajs])
        checked = 0
        for t, tr in zip(trajs, truth, strict=True):
            present = np.asarray(t["routed_experts_present"]).astype(bool)
            assert present[:-1].all() and not present[-1]
            got = np.asarray(t["routed_experts"])[present]
            agree = tr.agrees(got, 0)
            assert agree.all(), np.argwhere(~agree)  # transformers' router, the same top-2
            checked += int(present.sum())
        assert checked >= 40
        print(f"{checked} rows agree; tied rows: {sum(int(tr.tie.sum()) for tr in truth)}")

        # verify re-feeds each trajectory and asks for its routing on the same prefill: the
        # recorded rows agree with SGLang's re-feed as expert sets (turnstile/verify/routing.py)
        reports = asyncio.run(verify_sessions(Store(ts.data), "sglang", relay.url, [sid]))
        refeeds = [ex for ex in relay.exchanges if ex.request.get("logprob_start_len") == 0]
        assert len(refeeds) == len(reports) == len(trajs)
        assert all(ex.request["return_routed_experts"] is True for ex in refeeds)
        for r in reports:
            ra = r.routing
            print(
                f"VERIFY {r.trajectory_id}: routing {ra and ra.agree}/{ra and ra.rows}, "
                f"logprobs max |Δ| {r.exact.max_abs:.3g} over {r.exact.tokens}, {r.diagnosis}"
            )
            assert ra is not None and ra.rows > 0 and ra.share == 1.0, ra
            assert r.diagnosis == CONSISTENT, (r.diagnosis, r.exact, r.notes)
    finally:
        ts.stop()
