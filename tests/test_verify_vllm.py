"""Re-feed verification (``turnstile verify``, ``POST /v1/sessions/{id}/verify``, ``serve
--verify-fraction``) against the test bed's real vLLM (CPU build 0.32, SmolLM2 in bf16).

Truth: vLLM's own recompute of the recorded sequence (``prompt_logprobs``, the raw
distribution, with its top N), turned into what the call's recorded ``--logprobs-mode`` and
sampling should have given (``turnstile.verify.recompute``), against what vLLM returned while
sampling, as Turnstile recorded it. Records are taken from two servers, one per logprobs mode
(raw: vLLM's default; processed), greedy and at temperature 0.7 / top_p 0.9; exact ones must
agree within the bound measured here (bf16 decode vs prefill arithmetic), and the same records
broken three ways (scored by a server with perturbed weights, one token swapped, logprobs
shifted by one position) must part, at the token where they went wrong. A third server holds
the perturbed weights. Each server starts once for the module (a minute or more each here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from conftest import Turnstile
from test_vllm_real import _client, _sampled, start_relay

import turnstile_testbed as testbed
from turnstile.engines.vllm import SAMPLER_WIRE
from turnstile.server.monitor import DEFAULT_THRESHOLD
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch
from turnstile.verify import (
    BF16_TOLERANCE,
    TOP_N,
    Sampling,
    VLLMScorer,
    verify,
    verify_sessions,
)
from turnstile_testbed import vllm as testbed_vllm

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

NO_END = {"0": -100, "2": -100}  # SmolLM2's <|endoftext|>, <|im_end|>: runs to max_tokens
CONTEXT = 2048
TOKENS = 24  # per turn; two turns per session
SAMPLINGS = {"greedy": {"temperature": 0.0}, "t0.7": {"temperature": 0.7, "top_p": 0.9}}
MODES = ("raw_logprobs", "processed_logprobs")
MORE_LOGPROBS = ("--max-logprobs", str(TOP_N))  # the scorer's top N, past vLLM's default 20
NOISE = 0.05  # the perturbed weights: each tensor plus Gaussian noise of 5% of its std
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                "required": ["city"],
            },
        },
    }
]

_PERTURB = """
import shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, out, noise = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.suffix != ".safetensors":
        shutil.copy(f, out / f.name)
g = torch.Generator().manual_seed(0)
for f in src.glob("*.safetensors"):
    ts = load_file(str(f))
    for k, t in ts.items():
        x = t.float()
        x += torch.randn(x.shape, generator=g) * (noise * float(x.std()) if x.numel() > 1 else 0)
        ts[k] = x.to(t.dtype).contiguous()
    save_file(ts, str(out / f.name), metadata={"format": "pt"})
print("perturbed", src, "->", out)
"""


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return testbed_vllm.vllm_model()


@pytest.fixture(scope="module")
def other_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model with perturbed weights (a stale or corrupted weight sync)."""
    out = tmp_path_factory.mktemp("other") / "model"
    python = testbed_vllm.vllm_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(python), "-c", _PERTURB, str(model_dir), str(out), str(NOISE)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _server(model: Path, tmp: pytest.TempPathFactory, name: str, *extra: str) -> Iterator[str]:
    env_url = os.environ.get(f"TURNSTILE_VLLM_{name.upper()}_URL")
    if env_url:  # one already running so, while working on these tests
        yield env_url
        return
    log = tmp.mktemp(f"vllm-{name}") / "vllm.log"
    t = time.monotonic()
    args = ["--max-model-len", str(CONTEXT), *extra]
    with testbed_vllm.vllm_server(model, args, log=log) as url:
        print(f"[vllm {name}] up in {time.monotonic() - t:.0f} s ({log})", file=sys.stderr)
        yield url


@pytest.fixture(scope="module")
def vllm_processed(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(
        model_dir,
        tmp_path_factory,
        "processed",
        "--logprobs-mode",
        "processed_logprobs",
        *MORE_LOGPROBS,
    )


@pytest.fixture(scope="module")
def vllm_raw(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # vLLM's default logprobs mode: raw_logprobs
    yield from _server(model_dir, tmp_path_factory, "raw", *MORE_LOGPROBS)


@pytest.fixture(scope="module")
def vllm_other(other_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # vLLM's default --max-logprobs (20): the scorer falls back to it
    yield from _server(other_dir, tmp_path_factory, "other")


def _turnstile(url: str, model: Path, tmp: Path, *extra: str) -> Turnstile:
    template = testbed.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    args = ("--engine", "vllm", "--chat-template", str(template), *extra)
    return Turnstile(url, model, tmp / "data", tmp / "turnstile.log", args).start()


@pytest.fixture(scope="module")
def servers(
    vllm_processed: str, vllm_raw: str, vllm_other: str, model_dir: Path, tmp_path_factory
) -> Iterator[dict[str, Turnstile]]:
    """One Turnstile per logprobs mode, each verifying every call on its own vLLM, and one on
    the processed vLLM verifying on the perturbed weights."""
    made: dict[str, Turnstile] = {}
    try:
        for name, url, extra in (
            ("processed_logprobs", vllm_processed, ()),
            ("raw_logprobs", vllm_raw, ()),
            ("other", vllm_processed, ("--verify-engine-url", vllm_other)),
        ):
            mode = "raw_logprobs" if name == "raw_logprobs" else "processed_logprobs"
            made[name] = _turnstile(
                url,
                model_dir,
                tmp_path_factory.mktemp(name),
                "--engine-logprobs-mode",
                mode,
                "--verify-fraction",
                "1",
                *extra,
            )
        yield made
    finally:
        for t in made.values():
            t.stop()


def _rollout(ts: Turnstile, sampling: dict, **kw: object) -> str:
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=300)
    msgs: list[dict] = [{"role": "user", "content": "Tell me about Paris."}]
    for turn in range(2):
        r = client.chat.completions.create(
            model="m",
            messages=msgs,
            max_tokens=TOKENS,
            seed=turn + 1,
            logit_bias=NO_END,
            **sampling,
            **kw,
        )
        msgs += [r.choices[0].message.model_dump(exclude_none=True)]
        msgs.append({"role": "user", "content": f"And then {turn}?"})
    return session["id"]


@pytest.fixture(scope="module")
def sessions(servers: dict[str, Turnstile]) -> dict[tuple[str, str], str]:
    """(mode, sampling) → a two-turn session recorded so."""
    return {(m, name): _rollout(servers[m], s) for m in MODES for name, s in SAMPLINGS.items()}


def _url(servers: dict[str, Turnstile], mode: str) -> str:
    return servers[mode].engine_url  # type: ignore[return-value]


def _report(servers, mode: str, sid: str, url: str | None = None):
    store = Store(servers[mode].data)
    [report] = asyncio.run(verify_sessions(store, "vllm", url or _url(servers, mode), [sid]))
    return report


def _figures(label: str, deltas: np.ndarray) -> str:
    return (
        f"VERIFY {label}: {len(deltas)} tokens, max |Δ| {deltas.max():.4f}, "
        f"mean {deltas.mean():.4f}, p99 {np.quantile(deltas, 0.99):.4f}"
    )


async def _deltas(store: Store, sid: str, url: str, traj_edit=None) -> tuple[np.ndarray, list]:
    """|recorded - recomputed| per scored token of the session's one trajectory."""
    calls = store.calls(sid)
    [traj] = stitch(calls)
    if traj_edit:
        traj = traj_edit(traj)
    async with httpx.AsyncClient(timeout=300) as client:
        scorer = VLLMScorer(client, url)
        positions = np.flatnonzero(traj.loss_mask).tolist()
        by_id = {c.id: c for c in calls}
        per = [Sampling.of(by_id[t["call_id"]].info, t["completion_start"]) for t in traj.turns]
        which = [
            next(k for k, t in enumerate(traj.turns) if p < t["completion_end"]) for p in positions
        ]
        got = await scorer.score(traj.token_ids.tolist(), positions, [per[k] for k in which])
    rec = traj.logprobs[positions].astype(float)
    new = np.asarray(got, float)
    ok = ~np.isnan(new)
    return np.abs(rec[ok] - new[ok]), [p for p, k in zip(positions, ok, strict=True) if k]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("mode", MODES)
def test_exact_records_agree_within_the_bound(servers, sessions, mode, sampling):
    """Every sampled token scored (none refused; at most a few left undecided by the top N)
    and within the bf16 bound; the control: read as raw (the sampler ignored), a processed
    record at temperature 0.7 / top_p 0.9 parts."""
    sid = sessions[(mode, sampling)]
    report = _report(servers, mode, sid)
    ex = report.exact
    print(f"\nVERIFY {mode} {sampling}: {json.dumps(dataclasses.asdict(ex))}")
    assert ex.refused == 0 and not report.notes
    assert ex.tokens + ex.undecided == 2 * TOKENS and ex.undecided <= 2, ex
    assert ex.parted_at is None and ex.max_abs <= BF16_TOLERANCE, ex
    assert ex.mean_abs < DEFAULT_THRESHOLD.mean_abs, ex
    if (mode, sampling) == ("processed_logprobs", "t0.7"):
        store = Store(servers[mode].data)
        [traj] = stitch(store.calls(sid))

        async def as_raw():
            async with httpx.AsyncClient(timeout=300) as client:
                return await verify(traj, VLLMScorer(client, _url(servers, mode)), None)

        naive = asyncio.run(as_raw()).exact  # no call records: every logprob taken as raw
        print(f"VERIFY {mode} {sampling} read as raw: {json.dumps(dataclasses.asdict(naive))}")
        assert naive.parted_at is not None and naive.mean_abs > 5 * ex.mean_abs, naive


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("mode", MODES)
def test_broken_records_part_where_they_went_wrong(servers, sessions, vllm_other, mode, sampling):
    sid = sessions[(mode, sampling)]
    store = Store(servers[mode].data)
    url = _url(servers, mode)
    healthy, _ = asyncio.run(_deltas(store, sid, url))
    print("\n" + _figures(f"{mode} {sampling} healthy", healthy))
    # other weights: the same records scored by the perturbed model
    other = _report(servers, mode, sid, vllm_other).exact
    print(f"VERIFY {mode} {sampling} other weights: {json.dumps(dataclasses.asdict(other))}")
    assert other.parted_at is not None and other.mean_abs > DEFAULT_THRESHOLD.mean_abs, other
    assert other.max_abs > DEFAULT_THRESHOLD.max_abs
    [traj] = stitch(store.calls(sid))
    sampled = np.flatnonzero(traj.loss_mask)

    async def score(t):
        async with httpx.AsyncClient(timeout=300) as client:
            by_id = {c.id: c for c in store.calls(sid)}
            return (await verify(t, VLLMScorer(client, url), None, by_id)).exact

    # one sampled token swapped for another (mid second turn): it parts there
    k = int(sampled[TOKENS + 5])
    ids = traj.token_ids.copy()
    ids[k] = (int(ids[k]) + 7919) % 49152
    swapped = asyncio.run(score(dataclasses.replace(traj, token_ids=ids)))
    print(f"VERIFY {mode} {sampling} swapped at {k}: {json.dumps(dataclasses.asdict(swapped))}")
    assert swapped.parted_at == k and swapped.max_abs > DEFAULT_THRESHOLD.max_abs, swapped
    # logprobs shifted by one position: parts at the first token whose neighbour's logprob
    # differs from its own by more than twice the bound (the recorded values are the truth)
    shifted = traj.logprobs.copy()
    shifted[sampled[1:]] = traj.logprobs[sampled[:-1]]
    rec = traj.logprobs[sampled]
    first = next(i for i in range(1, len(sampled)) if abs(rec[i] - rec[i - 1]) > 2 * BF16_TOLERANCE)
    off = asyncio.run(score(dataclasses.replace(traj, logprobs=shifted)))
    print(f"VERIFY {mode} {sampling} shifted: {json.dumps(dataclasses.asdict(off))}")
    assert off.parted_at is not None and int(sampled[1]) <= off.parted_at <= int(sampled[first])
    assert off.mean_abs > DEFAULT_THRESHOLD.mean_abs or off.max_abs > DEFAULT_THRESHOLD.max_abs


def test_the_cli_and_the_route_verify_a_processed_session(servers, sessions):
    mode = "processed_logprobs"
    sid = sessions[(mode, "t0.7")]
    ts = servers[mode]
    cmd = [sys.executable, "-m", "turnstile", "verify", "--data", str(ts.data)]
    cmd += ["--engine", "vllm", "--engine-url", _url(servers, mode), "--session", sid]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *lines, last = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["session_id"] for x in lines] == [sid]
    ex = lines[0]["exact"]
    assert ex["tokens"] + ex["undecided"] == 2 * TOKENS and ex["parted_at"] is None, ex
    assert last["summary"][0]["exact"]["parted"] == 0
    r = ts.http.post(f"{ts.url}/v1/sessions/{sid}/verify", json={}, timeout=300)
    assert r.status_code == 200, r.text
    [report] = r.json()["data"]
    assert report["engine"] == "vllm" and report["exact"]["parted_at"] is None
    assert report["exact"]["max_abs"] <= BF16_TOLERANCE
    assert abs(report["exact"]["max_abs"] - ex["max_abs"]) < 1e-9  # one engine, one answer


def _series(ts: Turnstile) -> dict[tuple[str, tuple], float]:
    return ts.series("turnstile_verify")


def _wait(ts: Turnstile, name: str, labels: tuple, value: float) -> dict:
    return ts.wait_series("turnstile_verify", name, labels, value, timeout=300)


NONE = (("weight_version", "none"),)
CALLS = "turnstile_verify_calls_total"
PARTED = "turnstile_verify_parted_calls_total"
DROPPED = "turnstile_verify_dropped_calls_total"


@pytest.mark.parametrize("mode", MODES)
def test_the_monitor_passes_healthy_calls(servers, sessions, mode):
    """``--verify-fraction 1``: every call of both samplings scored, none parted."""
    assert sessions  # the rollouts ran: two sessions of two calls per mode
    got = _wait(servers[mode], CALLS, NONE, 4)
    assert got[(CALLS, NONE)] == 4 and got.get((PARTED, NONE), 0) == 0, got


def test_the_monitor_parts_on_other_weights_and_refuses_a_grammar(servers):
    """Calls on the processed vLLM, verified on the perturbed one: every call parts; a
    grammar-forced call is refused (dropped, why="refused"), not scored."""
    ts = servers["other"]
    for sampling in SAMPLINGS.values():
        _rollout(ts, sampling)
    got = _wait(ts, PARTED, NONE, 4)
    assert got[(CALLS, NONE)] == 4, got
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0, timeout=300)
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=40,
        temperature=0.7,
    )
    got = _wait(ts, DROPPED, (("why", "refused"),), 1)
    assert got[(CALLS, NONE)] == 4, got
    r = ts.http.post(f"{ts.url}/v1/sessions/{session['id']}/verify", json={}, timeout=300)
    assert r.status_code == 200, r.text
    [report] = r.json()["data"]
    exact = report["exact"]
    assert exact["tokens"] == 0 and exact["refused"] > 0 and exact["undecided"] == 0, exact
    assert any("grammar" in n for n in report["notes"]), report["notes"]


@pytest.fixture(scope="module")
def raw_relay(vllm_raw: str) -> Iterator:
    """A recording relay in front of the raw-mode vLLM: what it received and returned."""
    rel, server = start_relay(vllm_raw)
    yield rel
    server.shutdown()
    server.server_close()


def test_raw_logprobs_under_truncation_are_flagged(raw_relay, model_dir, tmp_path):
    """vLLM on its default ``--logprobs-mode raw_logprobs``: under top_p / top_k the logprobs
    vLLM returns are the model's, not the sampler's (its top lists are not renormalised over
    the kept set and mark nothing cut), and the record says so, with the applied sampling
    still what vLLM received (the relay). (Was its own module: one vLLM start saved.)"""
    ts = _turnstile(raw_relay.url, model_dir, tmp_path, "--engine-logprobs-mode", "raw_logprobs")
    try:
        session = ts.session(test="raw")
        _client(session).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=3,
            temperature=1.0,
            top_p=0.5,
            logprobs=True,
            top_logprobs=3,
            logit_bias=NO_END,
            extra_body={"top_k": 2},
        )
        # (the route probe at start posts an empty body: not a call)
        (ex,) = [e for e in raw_relay.exchanges if e.request.get("prompt")]  # the probe is empty
        (call,) = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
        got = ex.request  # /v1/completions: the sampler is top-level
        applied = call["sampling_applied"]
        assert applied["wire"] == {k: got[k] for k in SAMPLER_WIRE if k in got}
        assert (applied["wire"]["top_p"], applied["wire"]["top_k"]) == (0.5, 2)
        verdict = call["behaviour_logprobs"]
        assert verdict["exact"] is False and verdict["kind"] == "raw_logprobs"
        assert "top_p 0.5" in verdict["why"] and "top_k 2" in verdict["why"]
        # the engine's own answer agrees: raw lists keep every token live, summing below 1
        ids, lps, tops = _sampled(ex)
        assert call["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
        for top in tops:
            live = {tid: lp for tid, lp in top if lp > -9000}
            assert len(live) == len(dict(top))
            assert sum(math.exp(lp) for lp in live.values()) < 1 - 1e-4
    finally:
        ts.stop()
