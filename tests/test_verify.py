"""Re-feed verification (``turnstile.verify``) against llama-server: records Turnstile made of a
random-weight model are scored again by the engine, token by token. Truth: the engine's own
recompute. An exact record agrees within the engine's numerical noise; the same record made
wrong the two ways text pipelines make it wrong (a token re-encoded, logprobs off by one
position) parts at the token where it went wrong; the naive version of each trajectory (its
text encoded again, the logprobs laid on by position) is shown beside it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys

import httpx
import numpy as np
import openai
import pytest

from turnstile.chat.tokenizer import load_tokenizer
from turnstile.store.store import Store
from turnstile.store.trajectories import stitch
from turnstile.verify import TOLERANCE, LlamaCppScorer, summary, verify, verify_sessions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _rollout(turnstile, no_end_bias) -> str:
    session = turnstile.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "Tell me about Paris."}]
    for turn, seed in enumerate((1, 2)):
        r = client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=24, seed=seed, logit_bias=no_end_bias
        )
        msgs += [r.choices[0].message.model_dump(exclude_none=True)]
        msgs.append({"role": "user", "content": f"And then {turn}?"})
    return session["id"]


def test_exact_records_agree_and_broken_ones_part(turnstile, llama_tiny, tiny_qwen2, no_end_bias):
    sid = _rollout(turnstile, no_end_bias)
    store = Store(turnstile.data)
    tok = load_tokenizer(str(tiny_qwen2))
    [report] = asyncio.run(verify_sessions(store, "llama-cpp", llama_tiny, [sid], tok))
    exact = report.exact
    assert exact.tokens == 48  # every sampled token had a logprob and was scored
    assert exact.parted_at is None and exact.max_abs <= TOLERANCE, exact
    # the naive version: a random model samples tokenizations its tokenizer never makes
    assert report.naive_tokens_differ and report.naive is not None
    assert report.naive.parted_at is not None and report.naive.max_abs > 1.0, report.naive
    [row] = summary([report])
    print("\nVERIFY " + json.dumps(row))
    assert row["exact"]["parted"] == 0 and row["naive"]["parted"] == 1

    [traj] = stitch(store.calls(sid))
    sampled = np.flatnonzero(traj.loss_mask)

    async def score(t):
        async with httpx.AsyncClient(timeout=120) as client:
            return await verify(t, LlamaCppScorer(client, llama_tiny), None)

    # logprobs off by one position (what a pipeline that drops one token does)
    shifted = traj.logprobs.copy()
    shifted[sampled[1:]] = traj.logprobs[sampled[:-1]]
    off = asyncio.run(score(dataclasses.replace(traj, logprobs=shifted))).exact
    assert off.parted_at == int(sampled[1]) and off.max_abs > 0.1
    # one sampled token replaced by another: the tokens after it part
    ids = traj.token_ids.copy()
    k = int(sampled[5])
    ids[k] = (ids[k] + 1) % 1000
    swapped = asyncio.run(score(dataclasses.replace(traj, token_ids=ids))).exact
    assert swapped.parted_at is not None and swapped.parted_at <= k + 1


def test_the_cli_reports_each_trajectory_and_a_summary(
    turnstile, llama_tiny, tiny_qwen2, no_end_bias
):
    sid = _rollout(turnstile, no_end_bias)
    cmd = [sys.executable, "-m", "turnstile", "verify", "--data", str(turnstile.data)]
    cmd += ["--engine", "llama-cpp", "--engine-url", llama_tiny, "--model", str(tiny_qwen2)]
    out = subprocess.run([*cmd, "--session", sid, "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    *lines, last = [json.loads(x) for x in out.stdout.splitlines()]
    assert [x["session_id"] for x in lines] == [sid]
    assert lines[0]["exact"]["tokens"] == 48 and lines[0]["exact"]["parted_at"] is None
    assert last["summary"][0]["exact"]["parted"] == 0
    table = subprocess.run([*cmd, "--session", sid], capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1].split()[0] == lines[0]["trajectory_id"]
    assert (
        "0 parted, 0 tokens undecided, 0 refused; naive: 1 re-tokenize differently" in table.stderr
    )
    # an engine that cannot be reached: a clear exit, not a traceback
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnstile.app.cli",
            "verify",
            "--data",
            str(turnstile.data),
            "--engine",
            "vllm",
            "--engine-url",
            "http://127.0.0.1:9",
            "--session",
            sid,
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr
    assert "did not answer" in bad.stderr


def test_the_trainer_route_verifies_a_session_on_its_engine(turnstile, no_end_bias):
    sid = _rollout(turnstile, no_end_bias)
    r = turnstile.http.post(f"{turnstile.url}/v1/sessions/{sid}/verify", json={}, timeout=120)
    assert r.status_code == 200, r.text
    [report] = r.json()["data"]
    assert report["engine"] == "llama-cpp" and report["exact"]["tokens"] == 48
    assert report["exact"]["parted_at"] is None and report["naive_tokens_differ"]
    assert r.json()["summary"][0]["exact"]["parted"] == 0
    # the trainer's route only: a harness's capability does not open it
    harness = httpx.post(
        f"{turnstile.url}/v1/sessions/{sid}/verify",
        headers={"authorization": "Bearer " + turnstile.session()["base_url"].split("/s/")[1][:-3]},
        json={},
        timeout=30,
    )
    assert harness.status_code in (401, 403)
    assert (
        turnstile.http.post(f"{turnstile.url}/v1/sessions/nope/verify", json={}).status_code == 404
    )
