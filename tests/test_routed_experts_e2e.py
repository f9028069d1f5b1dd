"""Routed experts end to end: a harness (the official ``openai`` client) talks to Turnstile as a
process, Turnstile to an engine fake through the recording relay, and the trainer's stitched
``routed_experts`` is held to what the engine sent on the wire, row by row.

A multi-turn session: the first turn asks for every row; the second extends it (Turnstile asks
only for rows after the reused prefix: ``routed_experts_prompt_start`` / ``routed_experts_start
_len`` on the wire, the rest from the parent's record); a retry of the second turn (the same
prompt again); and a turn whose engine captured no routing (the server restarted without it:
its rows absent and marked so). The fakes route with a causal rule
(:class:`turnstile.testing.routing.HashRouter`), so every row the engine sent for a position
must be the one the trajectory holds there, whichever call it came from. The Parquet export's
columns give the same rows back.

Against transformers' router on a real engine: ``tests/test_moe_sglang_real.py`` (opt-in).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import Turnstile
from openai import OpenAI
from test_vllm_real import Relay, start_relay

from turnstile.store.export import export
from turnstile.testing import routing
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.fake_vllm import VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ROUTER = routing.HashRouter(layers=3, top_k=2, experts=8)
SHAPE = f"{ROUTER.layers},{ROUTER.top_k},{ROUTER.experts}"
PATHS = {"vllm": "/inference/v1/generate", "sglang": "/generate"}


def _wire(engine: str, ex) -> tuple[list[int], list[int], int, np.ndarray | None]:
    """What the engine received and sent for one generation: prompt, completion, the start
    asked, and the routing rows it returned (None: none)."""
    req = ex.request
    parts = ex.parts()
    out: list[int] = []
    rows = None
    if engine == "vllm":
        prompt = list(req["token_ids"])
        start = req["sampling_params"].get("routed_experts_prompt_start", 0)
        for p in parts:
            for c in p.get("choices") or []:
                out += c.get("token_ids") or []
                if c.get("routed_experts"):
                    rows = routing.decode_vllm(c["routed_experts"])
    else:
        prompt = list(req["input_ids"])
        start = req.get("routed_experts_start_len", 0) if req.get("return_routed_experts") else 0
        for p in parts:
            meta = p["meta_info"]
            ids = p["output_ids"]
            out = list(ids) if len(ids) == meta["completion_tokens"] else out + list(ids)
            if meta.get("routed_experts"):
                rows = routing.decode_sglang(meta["routed_experts"], ROUTER.layers, ROUTER.top_k)
    return prompt, out, start, rows


@pytest.fixture(params=["vllm", "sglang"])
def engine(request) -> Iterator[tuple[str, object, Relay]]:
    kind = request.param
    fake = VLLMFake(routed_experts=ROUTER) if kind == "vllm" else SGLangFake(routed_experts=ROUTER)
    with fake:
        relay, server = start_relay(fake.url, paths=(PATHS[kind],))
        yield kind, fake, relay
        server.shutdown()
        server.server_close()


def test_a_session_records_the_rows_the_engine_sent(engine, tiny_qwen2, tmp_path):
    kind, fake, relay = engine
    args = ("--engine", kind, "--routed-experts", SHAPE)
    ts = Turnstile(relay.url, tiny_qwen2, tmp_path / "data", tmp_path / "ts.log", args).start()
    try:
        sid = ts.session()["id"]
        client = OpenAI(base_url=f"{ts.url}/s/{sid}/v1", api_key=ts.token, max_retries=0)

        def turn(messages: list[dict], stream: bool) -> str:
            kw = dict(model="m", messages=messages, max_tokens=6, temperature=1.0, seed=3)
            if not stream:
                return client.chat.completions.create(**kw).choices[0].message.content or ""
            parts = client.chat.completions.create(**kw, stream=True)
            return "".join(p.choices[0].delta.content or "" for p in parts if p.choices)

        msgs = [{"role": "user", "content": "Count the experts."}]
        msgs.append({"role": "assistant", "content": turn(msgs, stream=False)})
        msgs.append({"role": "user", "content": "Again, longer."})
        second = turn(msgs, stream=True)  # an extension of the first turn
        turn(msgs, stream=False)  # a retry: the same prompt again
        msgs += [{"role": "assistant", "content": second}, {"role": "user", "content": "Last."}]
        fake.router = None  # the engine restarted without routing capture
        turn(msgs, stream=True)
        fake.router = ROUTER

        prompt_key = "token_ids" if kind == "vllm" else "input_ids"
        exchanges = [  # the generations (not the adapter's start-up probe of the route)
            ex for ex in relay.exchanges if ex.path == PATHS[kind] and prompt_key in ex.request
        ]
        assert len(exchanges) == 4
        wire = [_wire(kind, ex) for ex in exchanges]
        # the first asks from 0; the extension only past the reused prefix; the last got none
        assert wire[0][2] == 0
        assert 0 < wire[1][2] <= len(wire[0][0]) + len(wire[0][1]) - 1
        assert wire[2][0] == wire[1][0]
        assert wire[3][3] is None and all(w[3] is not None for w in wire[:3])
        for prompt, out, start, rows in wire[:3]:
            assert rows is not None
            assert rows.shape == (len(prompt) + len(out) - 1 - start, ROUTER.layers, ROUTER.top_k)

        trajs = ts.get(f"/v1/sessions/{sid}/trajectories")["data"]
        by_ids = {tuple(t["token_ids"]): t for t in trajs}
        checked = 0
        for prompt, out, start, rows in wire:
            full = tuple(prompt + out)
            t = next((v for k, v in by_ids.items() if k[: len(full)] == full), None)
            assert t is not None, "no trajectory holds this call's tokens"
            got = np.asarray(t["routed_experts"])
            present = np.asarray(t["routed_experts_present"])
            assert got.shape == (len(t["token_ids"]), ROUTER.layers, ROUTER.top_k)
            if rows is None:  # the call without routing: its new rows absent, zero
                new = slice(len(wire[1][0]) + len(wire[1][1]), len(full))
                assert not present[new].any()
                assert not got[new].any()
                continue
            span = slice(start, start + len(rows))
            assert present[span].all()
            assert (got[span] == rows).all()  # row for row what the engine sent
            checked += len(rows)
        assert checked >= 20
        # every row is there but the last token's (never forwarded) and those of the call
        # without routing; each is the one the engine sent for that position, whichever call
        # it came from
        last = wire[3][0] + wire[3][1]
        for t in trajs:
            got = np.asarray(t["routed_experts"])
            present = np.asarray(t["routed_experts_present"]).astype(bool)
            n = len(t["token_ids"])
            holes = wire[3][2] if t["token_ids"][: len(last)] == last else n - 1
            assert present.tolist() == [True] * holes + [False] * (n - holes)
            want = ROUTER.rows(t["token_ids"])
            assert (got[present] == want[present]).all()

        # the Parquet export's columns give the same rows back
        out_dir = tmp_path / "export"
        export(ts.data, out_dir, fmt="parquet", session_ids=[sid])
        _check_parquet(out_dir, trajs)
    finally:
        ts.stop()


def _check_parquet(out_dir: Path, trajs: list[dict]) -> None:
    files = sorted(out_dir.rglob("*.parquet"))
    assert files
    rows = [r for f in files for r in pq.read_table(f).to_pylist() if r.get("routed_experts")]
    by_ids = {tuple(t["token_ids"]): t for t in trajs}
    assert rows
    for row in rows:
        t = by_ids[tuple(row["token_ids"])]
        assert row["routed_experts"] == t["routed_experts"]
        assert row["routed_experts_present"] == t["routed_experts_present"]
