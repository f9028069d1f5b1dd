"""Verify compares routed experts too: Turnstile records a MoE session from the SGLang fake (a
causal hash router, SGLang's raw int32 bytes) through the recording relay, and ``turnstile
verify`` re-feeds each trajectory asking for the prompt's routing on the same prefill. Truths:
the rows the engine put on the wire (the relay), and the fake's router itself.

An exact record agrees on every (token, layer) row; a row tampered with is found at its
position and layer; a record scored by an engine holding other weights (another router seed,
other logprobs) agrees on few rows AND parts on logprobs: "other_weights"; logprobs agreeing
with routing that does not points at the router or the capture: "routing_changed".
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from itertools import combinations

import numpy as np
import pytest
from conftest import Turnstile
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI
from test_vllm_real import Relay, start_relay

from turnstile.store.store import Store
from turnstile.store.trajectories import stitch
from turnstile.testing import routing
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.verify import SGLangScorer, summary, verify, verify_sessions
from turnstile.verify import routing as vr

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ROUTER = routing.HashRouter(layers=3, top_k=2, experts=8)
SHAPE = f"{ROUTER.layers},{ROUTER.top_k},{ROUTER.experts}"


@pytest.fixture(scope="module")
def recorded(tiny_qwen2, tmp_path_factory) -> Iterator[tuple[SGLangFake, Relay, Store, str]]:
    """A two-turn session (the second an extension) recorded with routing on."""
    tmp = tmp_path_factory.mktemp("verify-routing")
    fake = SGLangFake(routed_experts=ROUTER, original_logprobs=True)
    with fake:
        relay, server = start_relay(fake.url, paths=("/generate",))
        args = ("--engine", "sglang", "--routed-experts", SHAPE)
        ts = Turnstile(relay.url, tiny_qwen2, tmp / "data", tmp / "ts.log", args).start()
        try:
            sid = ts.session()["id"]
            client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)
            msgs = [{"role": "user", "content": "Route me."}]
            for seed in (1, 2):
                r = client.chat.completions.create(
                    model="m", messages=msgs, max_tokens=8, temperature=1.0, seed=seed
                )
                msgs += [
                    {"role": "assistant", "content": r.choices[0].message.content or ""},
                    {"role": "user", "content": "More."},
                ]
            fake.data, fake.ts = ts.data, ts  # type: ignore[attr-defined]  # CLI, route
            yield fake, relay, Store(ts.data), sid
        finally:
            ts.stop()
            server.shutdown()
            server.server_close()


def _refeeds(relay: Relay) -> list:
    return [ex for ex in relay.exchanges if ex.request.get("logprob_start_len") == 0]


def test_an_exact_record_agrees_on_every_row(recorded):
    fake, relay, store, sid = recorded
    before = len(_refeeds(relay))
    [report] = asyncio.run(verify_sessions(store, "sglang", relay.url, [sid]))
    [ex] = _refeeds(relay)[before:]
    # the re-feed asked for the whole prompt's routing on the same prefill
    assert ex.request["return_routed_experts"] is True
    assert ex.request["routed_experts_start_len"] == 0
    wire = routing.decode_sglang(
        ex.response["meta_info"]["routed_experts"], ROUTER.layers, ROUTER.top_k
    )
    [traj] = stitch(store.calls(sid))
    n = len(traj.token_ids)
    assert wire.shape == (n, ROUTER.layers, ROUTER.top_k)  # every position forwarded
    assert (wire == ROUTER.rows(traj.token_ids.tolist())).all()  # the router's own rows
    ra = report.routing
    assert ra is not None
    # every recorded row but the last token's (never forwarded when sampled) compared, all agree
    assert ra.rows == (n - 1) * ROUTER.layers and ra.agree == ra.rows and ra.share == 1.0
    assert ra.absent_recorded == ROUTER.layers and ra.absent_refeed == 0
    assert ra.first_disagreement is None
    assert report.exact.tokens == 16 and report.exact.parted_at is None, report.exact
    assert report.diagnosis == vr.CONSISTENT
    print(f"\nEXACT routing {ra.agree}/{ra.rows}, logprobs max |Δ| {report.exact.max_abs}")
    assert sum(v["rows"] for v in ra.by_version.values()) == ra.rows
    [row] = summary([report])
    assert row["routing"]["share"] == 1.0 and row["routing"]["rows"] == ra.rows
    assert row["diagnosis"] == {vr.CONSISTENT: 1}


def test_the_cli_shows_routing_per_trajectory_and_version(recorded):
    fake, relay, store, sid = recorded
    cmd = [sys.executable, "-m", "turnstile", "verify", "--engine", "sglang"]
    cmd += ["--engine-url", relay.url, "--data", str(fake.data), "--session", sid]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    *trajs, last = [json.loads(line) for line in out.splitlines()]
    [t] = trajs
    assert t["routing"]["share"] == 1.0 and t["diagnosis"] == vr.CONSISTENT
    [row] = last["summary"]
    assert row["routing"]["by_version"]["none"]["share"] == 1.0
    table = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "routing:" in table.stdout and vr.CONSISTENT in table.stdout
    assert "1 agree (vnone 1)" in table.stderr, table.stderr


def test_the_verify_route_answers_routing_and_diagnosis(recorded):
    fake, relay, store, sid = recorded
    ts = fake.ts
    r = ts.http.post(f"{ts.url}/v1/sessions/{sid}/verify", headers=ts.headers, json={})
    assert r.status_code == 200, r.text
    body = r.json()
    [t] = body["data"]
    assert t["routing"]["share"] == 1.0 and t["routing"]["first_disagreement"] is None
    assert t["diagnosis"] == vr.CONSISTENT
    assert body["summary"][0]["routing"]["rows"] == t["routing"]["rows"] > 0


def _score(relay: Relay, traj):
    import httpx

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            return await verify(traj, SGLangScorer(client, relay.url), None)

    return asyncio.run(go())


def test_a_tampered_row_is_found_at_its_position_and_layer(recorded):
    _, relay, store, sid = recorded
    [traj] = stitch(store.calls(sid))
    name = vr.NAME
    rows = traj.arrays[name].copy()
    p, layer = len(rows) // 2, 1
    rows[p, layer] = (rows[p, layer] + 1) % ROUTER.experts  # other experts on one layer
    if set(rows[p, layer]) == set(traj.arrays[name][p, layer]):
        rows[p, layer] = (rows[p, layer] + 3) % ROUTER.experts
    one = _score(relay, dataclasses.replace(traj, arrays={**traj.arrays, name: rows}))
    assert one.routing is not None
    assert (one.routing.first_disagreement, one.routing.first_layer) == (p, layer)
    assert one.routing.agree == one.routing.rows - 1
    assert vr.TIE_NOTE in one.notes
    # the top-k in another order is the same set: agrees
    flipped = traj.arrays[name][:, :, ::-1].copy()
    same = _score(relay, dataclasses.replace(traj, arrays={**traj.arrays, name: flipped}))
    assert same.routing is not None and same.routing.share == 1.0
    # a whole layer captured wrong, logprobs intact: the router or the capture, not weights
    broad = traj.arrays[name].copy()
    broad[:, 0] = (broad[:, 0] + 1) % ROUTER.experts
    bad = _score(relay, dataclasses.replace(traj, arrays={**traj.arrays, name: broad}))
    assert bad.routing is not None and bad.routing.share < vr.ROUTING_AGREE
    assert bad.exact.parted_at is None
    assert bad.diagnosis == vr.ROUTING_CHANGED
    print(f"\nONE LAYER routing share {bad.routing.share:.3f} over {bad.routing.rows} rows")


def test_other_weights_part_on_logprobs_and_routing(recorded):
    fake, relay, store, sid = recorded
    fake.router, fake.weights = dataclasses.replace(ROUTER, seed=1), 1
    try:
        [report] = asyncio.run(verify_sessions(store, "sglang", relay.url, [sid]))
    finally:
        fake.router, fake.weights = ROUTER, 0
    ra = report.routing
    assert ra is not None and ra.rows > 0
    print(f"\nOTHER WEIGHTS routing share {ra.share:.3f} over {ra.rows} rows")
    assert ra.share < 0.5
    assert report.exact.parted_at is not None
    assert report.diagnosis == vr.OTHER_WEIGHTS
    print(f"OTHER WEIGHTS logprobs max |Δ| {report.exact.max_abs:.3f}")


def test_no_routing_on_the_refeed_is_unknown_not_guessed(recorded):
    fake, relay, store, sid = recorded
    fake.router = None  # restarted without routing capture
    try:
        [report] = asyncio.run(verify_sessions(store, "sglang", relay.url, [sid]))
    finally:
        fake.router = ROUTER
    ra = report.routing
    assert ra is not None and ra.rows == 0 and ra.absent_refeed > 0
    assert report.diagnosis == vr.UNKNOWN
    assert any("re-fed no routing" in n for n in report.notes)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_agreement_counts_expert_sets(data):
    """Against a brute-force count: rows equal as sets, absences apart."""
    t, layers = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 3))
    pairs = list(combinations(range(6), 2))
    pick = st.lists(st.sampled_from(pairs), min_size=t * layers, max_size=t * layers)
    rec = np.array(data.draw(pick), np.uint8).reshape(t, layers, 2)
    new = np.array(data.draw(pick), np.uint8).reshape(t, layers, 2)
    swap = data.draw(st.lists(st.booleans(), min_size=t, max_size=t))
    new[swap] = new[swap][:, :, ::-1]
    present = np.array(data.draw(st.lists(st.booleans(), min_size=t, max_size=t)), np.int8)
    got = data.draw(st.integers(0, t))
    ra = vr.agreement(rec, present, new[:got], ["v"] * t)
    rows = agree = 0
    for p in range(t):
        for lay in range(layers):
            if present[p] and p < got:
                rows += 1
                agree += set(rec[p, lay].tolist()) == set(new[p, lay].tolist())
    assert (ra.rows, ra.agree) == (rows, agree)
    assert ra.absent_refeed == sum(1 for p in range(t) if present[p] and p >= got) * layers
    assert ra.absent_recorded == sum(1 for p in range(t) if not present[p] and p < got) * layers


@pytest.mark.parametrize("other", [False, True], ids=["same-weights", "other-weights"])
def test_the_monitor_exports_routing_agreement(tiny_qwen2, tmp_path, other):
    """``serve --verify-fraction 1``: each call's routing share goes into
    ``turnstile_verify_routing_agreement``; scored by an engine holding other weights
    (``--verify-engine-url``: another router seed, other logprobs) the call parts on routing
    and is diagnosed so."""
    fake = SGLangFake(routed_experts=ROUTER, original_logprobs=True)
    scorer = SGLangFake(routed_experts=dataclasses.replace(ROUTER, seed=1), original_logprobs=True)
    scorer.weights = 1
    with fake, scorer:
        args = ["--engine", "sglang", "--routed-experts", SHAPE, "--verify-fraction", "1"]
        if other:
            args += ["--verify-engine-url", scorer.url]
        ts = Turnstile(fake.url, tiny_qwen2, tmp_path / "data", tmp_path / "ts.log", args)
        ts.start()
        try:
            sid = ts.session()["id"]
            client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)
            msgs = [{"role": "user", "content": "Route me."}]
            client.chat.completions.create(
                model="m", messages=msgs, max_tokens=6, temperature=1.0, seed=1
            )
            name = "turnstile_verify_routing_agreement"
            got = ts.wait_series("turnstile_verify", name + "_count", NONE, 1)
            top = got[(name + "_bucket", (("le", "0.999"), *NONE))]
            parted = got.get(("turnstile_verify_routing_parted_calls_total", NONE), 0)
            diagnosis = vr.OTHER_WEIGHTS if other else vr.CONSISTENT
            assert got[("turnstile_verify_diagnosis_total", (("diagnosis", diagnosis), *NONE))] == 1
            if other:
                assert got[(name + "_bucket", (("le", "0.5"), *NONE))] == 1
                assert parted == 1 and "routing agrees on" in ts.log.read_text()
            else:
                assert top == 0 and got[(name + "_sum", NONE)] == 1.0 and parted == 0
        finally:
            ts.stop()


NONE = (("weight_version", "none"),)


def test_vllm_refeeds_routing_as_npy_on_its_prompt_logprobs_call(tiny_qwen2, tmp_path):
    """vLLM (``--enable-return-routed-experts``; the CPU build refuses it, so the fake): the
    scorer's ``/v1/completions`` re-feed asks ``routed_experts_prompt_start`` 0 and reads the
    ``.npy`` rows; exact records agree, other weights part on both."""
    fake = VLLMFake(routed_experts=ROUTER)
    with fake:
        relay, server = start_relay(fake.url, paths=("/inference/v1/generate", "/v1/completions"))
        args = ("--engine", "vllm", "--routed-experts", SHAPE)
        ts = Turnstile(relay.url, tiny_qwen2, tmp_path / "data", tmp_path / "ts.log", args)
        ts.start()
        try:
            sid = ts.session()["id"]
            client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)
            msgs = [{"role": "user", "content": "Route me."}]
            client.chat.completions.create(
                model="m", messages=msgs, max_tokens=8, temperature=1.0, seed=1
            )
            store = Store(ts.data)
            [report] = asyncio.run(verify_sessions(store, "vllm", relay.url, [sid]))
            [ex] = [e for e in relay.exchanges if e.path == "/v1/completions"]
            assert ex.request["routed_experts_prompt_start"] == 0
            wire = routing.decode_vllm(ex.response["choices"][0]["routed_experts"])
            [traj] = stitch(store.calls(sid))
            assert (wire == ROUTER.rows(traj.token_ids.tolist())).all()
            ra = report.routing
            assert ra is not None and ra.share == 1.0
            assert ra.rows == (len(traj.token_ids) - 1) * ROUTER.layers
            assert report.exact.tokens == 8 and report.exact.parted_at is None
            assert report.diagnosis == vr.CONSISTENT
            fake.router, fake.weights = dataclasses.replace(ROUTER, seed=1), 1
            [other] = asyncio.run(verify_sessions(store, "vllm", relay.url, [sid]))
            assert other.routing is not None and other.routing.share < 0.5
            assert other.diagnosis == vr.OTHER_WEIGHTS
        finally:
            ts.stop()
            server.shutdown()
            server.server_close()
