"""Routed experts (issue 42) on the per-token arrays: the vLLM and SGLang adapters read the rows
from answers of the engines' documented shapes (vLLM: base64 ``.npy`` ``(tokens - 1 - start,
layers, k)`` on the choice, the final chunk when streamed; SGLang: base64 raw int32 in
``meta_info``), ask only for rows the parent's record lacks, and a token-in session (turns, a
retry, a call with routing off) stitches them into ``routed_experts`` aligned with ``token_ids``,
absent where no engine answer held the row; the export's columns and the converters' fields
carry them.

The answers are built here as the engines build them (``np.save`` into base64, vLLM's
``numpy2base64``; ``tensor.numpy().tobytes()`` into base64, SGLang's detokenizer), from a
routing table that is a function of (position, token) alone: the truth each stitched row is held
to. The request fields' names are checked against the engines' own sources in their venvs."""

from __future__ import annotations

import asyncio
import base64
import io
import math
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turnstile.converters.skyrl import to_skyrl_generator_output
from turnstile.converters.slime import to_slime_samples
from turnstile.converters.verl import to_verl_agent_loop_outputs, to_verl_batch
from turnstile.dialects.chat.answer import completion
from turnstile.dialects.chat.request import parse_chat_request
from turnstile.engines import routing
from turnstile.engines.base import EngineError, Finish, SamplingParams
from turnstile.engines.sglang import SGLangEngine, _Reader
from turnstile.engines.vllm import VLLMEngine
from turnstile.engines.vllm_reader import COMPLETIONS, GENERATE, Reader
from turnstile.store.export import export
from turnstile.store.trajectories import stitch
from turnstile.testing.fake_server import FakeServer
from turnstile.testing.mock_engine import MockEngine, Reply
from turnstile.token_arrays import Rows

pytestmark = pytest.mark.integration

LAYERS, K, EXPERTS = 4, 2, 16
VENVS = Path.home() / ".cache" / "turnstile"


def truth(ids: list[int], start: int = 0) -> np.ndarray:
    """The routing of each position of ``ids`` from ``start``: a function of (position,
    token) only, so any call that forwards a position agrees on its row."""
    pos = np.arange(start, len(ids), dtype=np.int64)[:, None, None]
    tok = np.asarray(ids[start:], dtype=np.int64)[:, None, None]
    layer = np.arange(LAYERS)[None, :, None]
    k = np.arange(K)[None, None, :]
    return ((pos * 7 + tok * 3 + layer * 5 + k * 11) % EXPERTS).astype(np.uint8)


def npy_b64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=a.dtype == object)
    return base64.b64encode(buf.getvalue()).decode()


def int32_b64(a: np.ndarray) -> str:
    return base64.b64encode(a.astype(np.int32).tobytes()).decode()


def _err(route: str, status: int, raw: bytes) -> EngineError:
    return EngineError(f"{route} {status}", 502)


# --- the adapters' readers, on answers of the engines' shapes --------------------------------

PROMPT = [11, 12, 13, 14, 15]
OUT = [21, 22, 23]


def _vllm_choice(start: int, **extra: object) -> dict:
    return {
        "index": 0,
        "token_ids": OUT,
        "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in OUT]},
        "finish_reason": "stop",
        "stop_reason": None,
        "routed_experts": npy_b64(truth(PROMPT + OUT)[start : len(PROMPT + OUT) - 1]),
        **extra,
    }


@pytest.mark.parametrize("route", [GENERATE, COMPLETIONS])
@pytest.mark.parametrize("start", [0, 3, 5])
def test_vllm_rows_land_on_the_positions_they_cover(route: str, start: int) -> None:
    params = SamplingParams(max_tokens=3, rows_from=start)
    r = Reader(route, params, PROMPT, "raw_logprobs", _err, routing=True)
    choice = _vllm_choice(start)
    if route == COMPLETIONS:
        choice["logprobs"] = {
            "tokens": [f"token_id:{t}" for t in OUT],
            "token_logprobs": [-0.5] * 3,
        }
    r.feed({"choices": [choice], "usage": {"prompt_tokens": 5}})
    f = r.finish()
    rows = f.arrays["routed_experts"]
    assert rows.start == start and rows.end == len(PROMPT + OUT) - 1
    assert rows.values.dtype == np.uint8
    assert (rows.values == truth(PROMPT + OUT)[start:-1]).all()
    assert f.asked["routed_experts"] == {"asked": True, "from": start, "rows": 7 - start}


def test_vllm_streamed_rows_come_on_the_final_chunk() -> None:
    params = SamplingParams(max_tokens=3, rows_from=2)
    r = Reader(GENERATE, params, PROMPT, "raw_logprobs", _err, routing=True)
    for i, t in enumerate(OUT):
        last = i == len(OUT) - 1
        chunk = {
            "index": 0,
            "token_ids": [t],
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5}]},
            "finish_reason": "stop" if last else None,
            "routed_experts": npy_b64(truth(PROMPT + OUT)[2:-1]) if last else None,
        }
        r.feed({"choices": [chunk]})
    rows = r.finish().arrays["routed_experts"]
    assert rows.start == 2 and (rows.values == truth(PROMPT + OUT)[2:-1]).all()


def test_vllm_keeps_uint16_for_more_than_256_experts() -> None:
    big = (truth(PROMPT + OUT).astype(np.uint16) + 300)[:-1]
    r = Reader(GENERATE, SamplingParams(max_tokens=3), PROMPT, "raw_logprobs", _err, routing=True)
    r.feed({"choices": [_vllm_choice(0, routed_experts=npy_b64(big))]})
    rows = r.finish().arrays["routed_experts"]
    assert rows.values.dtype == np.uint16 and (rows.values == big).all()


@pytest.mark.parametrize(
    "field, why",
    [
        (None, "no routing"),
        (npy_b64(truth(PROMPT + OUT)), "returned 8 routing rows, expected 7"),
        (npy_b64(np.array([[1, 2]], dtype=object)), "could not be read"),  # a pickle: refused
        ("not base64!", "could not be read"),
        (npy_b64(truth(PROMPT + OUT)[:-1, 0]), "could not be read"),  # 2-D
        (npy_b64(-1 - truth(PROMPT + OUT)[:-1].astype(np.int32)), "outside"),
    ],
)
def test_rows_that_cannot_be_vouched_for_are_absent_and_said(field: object, why: str) -> None:
    """Never zero-filled, never a 500: the call is recorded, the rows absent, the note why."""
    r = Reader(GENERATE, SamplingParams(max_tokens=3), PROMPT, "raw_logprobs", _err, routing=True)
    r.feed({"choices": [_vllm_choice(0, routed_experts=field)]})
    f = r.finish()
    assert "routed_experts" not in f.arrays
    assert why in f.asked["routed_experts"]["note"] and f.asked["routed_experts"]["rows"] is None


def test_routing_off_asks_and_records_nothing() -> None:
    r = Reader(GENERATE, SamplingParams(max_tokens=3), PROMPT, "raw_logprobs", _err)
    r.feed({"choices": [_vllm_choice(0)]})
    f = r.finish()
    assert f.arrays == {} and f.asked == {}
    body = VLLMEngine("http://x").request_body(
        PROMPT, SamplingParams(max_tokens=3), False, "r", GENERATE
    )
    assert "routed_experts_prompt_start" not in orjson.dumps(body).decode()
    body = SGLangEngine("http://x").request_body(PROMPT, SamplingParams(max_tokens=3), False, "r")
    assert "routed_experts" not in orjson.dumps(body).decode()


def _sglang_meta(start: int, routed: object) -> dict:
    return {
        "output_ids": OUT,
        "meta_info": {
            "id": "r",
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "output_token_logprobs": [[-0.5, t, None] for t in OUT],
            "finish_reason": {"type": "stop", "matched": 23},
            "routed_experts": routed,
        },
    }


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_int32_rows_are_reshaped_with_the_models_shape(stream: bool) -> None:
    engine = SGLangEngine("http://x", routed_experts=f"{LAYERS},{K},{EXPERTS}")
    params = SamplingParams(max_tokens=3, rows_from=4)
    want = truth(PROMPT + OUT)[4:-1]
    r = _Reader(engine, params, len(PROMPT))
    if stream:  # incremental events; the finished one carries the rows
        for i, t in enumerate(OUT):
            last = i == len(OUT) - 1
            ev = _sglang_meta(4, int32_b64(want) if last else None)
            ev["output_ids"] = [t]
            ev["meta_info"]["output_token_logprobs"] = [[-0.5, t, None]]
            ev["meta_info"]["completion_tokens"] = i + 1
            if not last:
                ev["meta_info"]["finish_reason"] = None
            r.feed(ev, cumulative=False)
    else:
        r.feed(_sglang_meta(4, int32_b64(want)), cumulative=True)
    rows = r.finish().arrays["routed_experts"]
    assert rows.start == 4 and rows.values.dtype == np.uint8 and (rows.values == want).all()


def test_sglang_without_the_models_shape_records_why() -> None:
    engine = SGLangEngine("http://x", routed_experts="on")  # no config read: not refreshed
    r = _Reader(engine, SamplingParams(max_tokens=3), len(PROMPT))
    r.feed(_sglang_meta(0, int32_b64(truth(PROMPT + OUT)[:-1])), cumulative=True)
    f = r.finish()
    assert f.arrays == {} and "layers and top-k" in f.asked["routed_experts"]["note"]
    # a count of ids that is no whole number of rows: absent, said
    engine = SGLangEngine("http://x", routed_experts="3,2")
    r = _Reader(engine, SamplingParams(max_tokens=3), len(PROMPT))
    r.feed(_sglang_meta(0, int32_b64(np.arange(7))), cumulative=True)
    assert "whole number" in r.finish().asked["routed_experts"]["note"]


def test_the_shape_is_read_from_a_models_config(tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 48, "num_experts_per_tok": 8, "num_experts": 128}
    (tmp_path / "config.json").write_bytes(orjson.dumps(cfg))
    assert routing.shape_from_model_dir(str(tmp_path)) == routing.RoutingShape(48, 8, 128)
    nested = {"text_config": {"num_hidden_layers": 2, "num_experts_per_tok": 2}}
    assert routing.shape_from_config(nested) == routing.RoutingShape(2, 2, None)
    assert routing.parse_option(None) == (False, None)
    assert routing.parse_option("on") == (True, None)
    with pytest.raises(ValueError, match="LAYERS,TOPK"):
        routing.parse_option("48")


def test_the_request_fields_are_the_engines_own() -> None:
    """The names sent are those vLLM's SamplingParams and SGLang's request declare (read from
    the pinned packages' sources, not from Turnstile)."""
    vllm = VENVS / "vllm-venv"
    sglang = VENVS / "sglang-venv"
    sp = next(vllm.glob("lib/python3*/site-packages/vllm/sampling_params.py"), None)
    io_struct = next(
        sglang.glob("lib/python3*/site-packages/sglang/srt/managers/io_struct.py"), None
    )
    if sp is None or io_struct is None:
        pytest.skip("the engines' venvs are not installed")
    body = VLLMEngine("http://x", routed_experts="on").request_body(
        PROMPT, SamplingParams(max_tokens=3, rows_from=4), False, "r", GENERATE
    )
    assert body["sampling_params"]["routed_experts_prompt_start"] == 4
    assert "routed_experts_prompt_start: int = 0" in sp.read_text()
    body = VLLMEngine("http://x", routed_experts="on").request_body(
        PROMPT, SamplingParams(max_tokens=3, rows_from=9), False, "r", COMPLETIONS
    )
    assert body["routed_experts_prompt_start"] == 5  # at most the prompt (vLLM refuses more)
    body = SGLangEngine("http://x", routed_experts="on").request_body(
        PROMPT, SamplingParams(max_tokens=3, rows_from=4), False, "r"
    )
    assert body["return_routed_experts"] is True and body["routed_experts_start_len"] == 4
    src = io_struct.read_text()
    assert "return_routed_experts: bool" in src and "routed_experts_start_len: int" in src


# --- a token-in session: turns, a retry, a call with routing off ------------------------------


def _engine(off: set[int]) -> MockEngine:
    """Answers each call as vLLM/SGLang would: rows ``[rows_from, total - 1)`` of the truth,
    none for the calls numbered in ``off`` (an engine with routing off)."""
    n = {"calls": 0}

    def handler(prompt: list[int], params: SamplingParams) -> Reply:
        i = n["calls"]
        n["calls"] += 1
        out = [9707 + i, 11, 151645]  # a few tokens, then <|im_end|>
        fields: dict = {"stop_token_id": 151645}
        if i not in off:
            start = min(params.rows_from, len(prompt))
            rows = truth(prompt + out)[start:-1]
            fields["arrays"] = {"routed_experts": Rows(start, rows)}
            fields["asked"] = {"routed_experts": {"asked": True, "from": start, "rows": len(rows)}}
        return Reply(out, finish_fields=fields)

    return MockEngine(handler)


def _chat(gw, sid: str, messages: list[dict]) -> dict:
    req = parse_chat_request({"messages": messages, "max_tokens": 8})
    return completion(asyncio.run(gw.complete(sid, req)))  # as the Chat dialect answers


@pytest.fixture
def session(tiny_qwen2, tmp_path):
    from turnstile.app.wiring import build_gateway

    def run(off: set[int]) -> tuple:
        gw = build_gateway(
            "http://127.0.0.1:9", str(tiny_qwen2), tmp_path / "d", audit_template=False
        )
        gw.engine = _engine(off)
        gw.store.create_session({}, "s")
        msgs = [{"role": "user", "content": "list the files"}]
        a = _chat(gw, "s", msgs)
        msgs += [a["choices"][0]["message"], {"role": "user", "content": "now read one"}]
        _chat(gw, "s", msgs)  # turn 2
        _chat(gw, "s", msgs)  # its retry: a sibling of turn 2
        b = _chat(gw, "s", msgs)  # and another, which the harness goes on from
        msgs += [b["choices"][0]["message"], {"role": "user", "content": "done?"}]
        _chat(gw, "s", msgs)
        return gw, gw.store.calls("s")

    return run


def _check_against_truth(t) -> None:
    ids = t.token_ids.tolist()
    want = truth(ids)
    got, present = t.arrays["routed_experts"], t.present["routed_experts"].astype(bool)
    assert got.shape == (len(ids), LAYERS, K) and got.dtype == np.uint8
    assert (got[present] == want[present]).all()
    assert (got[~present] == 0).all()
    assert not present[-1]  # the last sampled token: no engine forwarded it


def test_a_session_records_every_row_asking_only_for_new_ones(session) -> None:
    gw, calls = session(off=set())
    asked = [p.rows_from for p in gw.engine.params]
    reused = [c.reused_prefix_len for c in calls]
    assert asked == [0] + [r - 1 for r in reused[1:]]  # only rows the parent lacks
    assert [c.info["arrays_asked"]["routed_experts"]["from"] for c in calls] == asked
    trajs = stitch(calls)
    assert len(trajs) == 3  # two retried siblings end early, the main path goes on
    for t in trajs:
        _check_against_truth(t)
        assert t.present["routed_experts"][:-1].all()  # nothing missing along any path
    for t in stitch(calls, mode="per_call"):
        _check_against_truth(t)


def test_a_call_with_routing_off_leaves_its_rows_absent(session, tmp_path) -> None:
    gw, calls = session(off={3})  # the retry the harness went on from
    main = max(stitch(calls), key=len)
    _check_against_truth(main)
    third = calls[3]
    own = range(
        third.reused_prefix_len - 1,
        third.reused_prefix_len + len(third.prompt_delta) + len(third.completion_ids) - 1,
    )
    assert not main.present["routed_experts"][list(own)].any()
    assert "arrays_asked" not in third.info
    with pytest.raises(ValueError, match="no recorded routing"):
        to_verl_batch([main], pad_token_id=0)
    # the export carries the array and its mask as columns
    res = export(tmp_path / "d", tmp_path / "out", batch="b")
    rows = [r for f in res.files["trajectories"] for r in pq.read_table(f).to_pylist()]
    row = next(r for r in rows if r["id"] == main.id)
    assert np.array(row["routed_experts"]).shape == (len(main), LAYERS, K)
    assert row["routed_experts_present"] == main.present["routed_experts"].tolist()
    assert (np.array(row["routed_experts"]) == main.arrays["routed_experts"]).all()


def test_the_converters_give_the_trainers_their_fields(session) -> None:
    gw, calls = session(off=set())
    trajs = stitch(calls)
    for t in trajs:
        t.reward, t.sample_index, t.group_id = 1.0, 0, "g"
    verl = to_verl_batch(trajs, pad_token_id=0)
    P = verl["batch"]["prompts"].shape[1]
    for i, t in enumerate(trajs):
        start = P - t.prompt_len  # the prompt is left-padded
        re = verl["batch"]["routed_experts"][i]
        assert re.dtype == np.int16 and re.shape[1:] == (LAYERS, K)
        assert (re[start : start + len(t)] == t.arrays["routed_experts"]).all()
        assert (verl["batch"]["input_ids"][i, start : start + len(t)] == t.token_ids).all()
    loop = to_verl_agent_loop_outputs(trajs)
    assert all(
        len(d["routed_experts"]) == len(d["prompt_ids"]) + len(d["response_ids"]) for d in loop
    )
    sky = to_skyrl_generator_output(trajs)
    assert [len(r) for r in sky["rollout_expert_indices"]] == [len(t) for t in trajs]
    slime = to_slime_samples(trajs)
    for s in slime:
        assert s["rollout_routed_experts"].shape == (len(s["tokens"]) - 1, LAYERS, K)
        assert s["rollout_routed_experts"].dtype == np.int32
    assert not math.isnan(float(sum(len(t) for t in trajs)))


# --- a whole answer of megabytes over real HTTP -----------------------------------------------


class _WholeAnswers(FakeServer):
    """vLLM's generate route answering whole, with the rows of a 48-layer top-8 router: an
    answer of megabytes (the adapters' connection paused reading at 1 MiB and a whole-body
    read never resumed it: the call hung until the engine timeout)."""

    def routes(self) -> list:
        async def generate(request: Request) -> Response:
            body = orjson.loads(await request.body())
            if not body.get("token_ids"):
                return Response(b'{"error": "token_ids required"}', 400)
            n = len(body["token_ids"]) + len(OUT)
            start = body["sampling_params"]["routed_experts_prompt_start"]
            rows = (np.arange(start, n - 1)[:, None, None] % 128 + np.zeros((1, 48, 8))).astype(
                np.uint8
            )
            choice = _vllm_choice(0, routed_experts=npy_b64(rows))
            return Response(orjson.dumps({"choices": [choice]}), media_type="application/json")

        async def models(request: Request) -> Response:
            return Response(orjson.dumps({"data": [{"id": "m", "max_model_len": 1 << 20}]}))

        async def version(request: Request) -> Response:
            return Response(b'{"version": "0.32.0"}')

        return [
            Route("/inference/v1/generate", generate, methods=["POST"]),
            Route("/v1/models", models),
            Route("/version", version),
        ]


def test_a_whole_answer_of_megabytes_is_read() -> None:
    async def run(url: str) -> Finish:
        engine = VLLMEngine(url, api="generate", routed_experts="on", timeout=20)
        await engine.start()
        try:
            events = [
                e
                async for e in engine.generate(
                    list(range(6000)), SamplingParams(max_tokens=3), stream=False
                )
            ]
        finally:
            await engine.close()
        assert isinstance(events[-1], Finish)
        return events[-1]

    with _WholeAnswers().start() as fake:
        finish = asyncio.run(asyncio.wait_for(run(fake.url), 30))
    rows = finish.arrays["routed_experts"]
    assert rows.values.shape == (6000 + 3 - 1, 48, 8) and rows.values.nbytes > 2 << 20
    assert (rows.values[:, 0, 0] == np.arange(6002) % 128).all()
