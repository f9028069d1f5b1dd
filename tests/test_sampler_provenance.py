"""The sampler's provenance on a real llama-server: the record's ``sampling_applied`` is what the
engine got (the recording relay's copy of each request) and what it says it applied (its own
``generation_settings``), nothing is left to llama-server's defaults (top_k 40, top_p 0.95,
min_p 0.05), and ``behaviour_logprobs`` says when the recorded logprobs are not the sampling
distribution's."""

from __future__ import annotations

import math

import openai
import pytest

from turnstile.engines.llamacpp import SAMPLER_WIRE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# llama-server's own defaults for the samplers it runs unless told otherwise
LLAMA_DEFAULTS = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}


def _call(turnstile, no_end: dict, **kw: object) -> dict:
    session = turnstile.session(task="provenance")
    client = openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)
    client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=4,
        logit_bias=no_end,
        logprobs=True,
        **kw,
    )
    (call,) = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    return call  # the record JSON holds info at its top level


def _same(a: object, b: object) -> bool:
    """llama-server keeps its floats as float32: 0.9 comes back 0.8999999761581421."""
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-7)
    return a == b


def _check_against_engine(info: dict, wire_request: dict) -> dict:
    applied = info["sampling_applied"]
    sent = applied["wire"]
    # the record is the wire: every sampler field the relay saw, with its value, and no other
    seen = {k: v for k, v in wire_request.items() if k in SAMPLER_WIRE}
    assert sent == seen
    # complete: every sampler of llama-server's chain has a value on the wire
    chain = {"temperature", "top_k", "top_p", "min_p", "typical_p", "xtc_probability"}
    chain |= {"top_n_sigma", "mirostat", "dry_multiplier", "dynatemp_range", "repeat_penalty"}
    chain |= {"n_predict", "frequency_penalty", "presence_penalty"}
    assert chain <= sent.keys()
    # what the engine says it applied equals what was sent
    echo = applied["engine_echo"]
    assert chain - {"n_predict"} <= echo.keys(), sorted(echo)
    for k in echo.keys() & sent.keys():
        got = echo[k]
        if k == "logit_bias":  # echoed as [{"token", "bias"}], sent as [[token, bias]]
            got = [[b["token"], b["bias"]] for b in got]
        assert _same(got, sent[k]), (k, echo[k], sent[k])
    return applied


def test_omitted_fields_are_sent_neutral_and_the_engine_applied_them(turnstile, relay, no_end_bias):
    info = _call(turnstile, no_end_bias)
    (ex,) = relay.completions()
    applied = _check_against_engine(info, ex.request)
    for k, default in LLAMA_DEFAULTS.items():
        assert not _same(applied["engine_echo"][k], default), k
    assert applied["wire"]["top_k"] == 0 and applied["wire"]["min_p"] == 0.0
    assert applied["wire"]["top_p"] == 1.0
    assert applied["from"]["top_k"] == "neutral" and applied["from"]["min_p"] == "neutral"
    assert applied["from"]["n_predict"] == "request"
    assert applied["from"]["typical_p"] == "turnstile"
    # llama-server's logprobs are raw: at temperature 1 with no cut they are the sampler's
    # own, except that logit_bias moved the distribution sampled from
    assert info["behaviour_logprobs"]["kind"] == "raw_logprobs"
    assert info["behaviour_logprobs"]["exact"] is False
    assert "logit_bias" in info["behaviour_logprobs"]["why"]


def test_asked_truncation_is_recorded_as_sent_and_flagged_inexact(turnstile, relay, no_end_bias):
    info = _call(
        turnstile,
        no_end_bias,
        temperature=0.7,
        top_p=0.9,
        frequency_penalty=0.25,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1},
    )
    (ex,) = relay.completions()
    applied = _check_against_engine(info, ex.request)
    assert applied["wire"]["top_k"] == 5 and _same(applied["engine_echo"]["top_k"], 5)
    assert _same(applied["engine_echo"]["top_p"], 0.9)
    assert _same(applied["engine_echo"]["min_p"], 0.1)
    assert _same(applied["engine_echo"]["repeat_penalty"], 1.1)
    for k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "frequency_penalty"):
        assert applied["from"][k] == "request", k
    assert applied["from"]["presence_penalty"] == "neutral"
    why = info["behaviour_logprobs"]["why"]
    assert info["behaviour_logprobs"]["exact"] is False
    assert all(w in why for w in ("temperature 0.7", "top_p 0.9", "top_k 5", "min_p 0.1"))


def test_the_export_hands_the_trainer_the_behaviour_verdict(turnstile, relay, tmp_path):
    """A plain call (temperature 1, nothing cutting or moving the distribution): llama-server's
    raw logprobs are the sampler's, and the trajectory, its behaviour mask and the Parquet
    export say so; a truncated call in another session says the opposite."""
    import pyarrow.parquet as pq

    from turnstile.store.export import export
    from turnstile.store.store import Store
    from turnstile.store.trajectories import stitch

    plain = _call(turnstile, {})
    assert plain["behaviour_logprobs"] == {"exact": True, "kind": "raw_logprobs", "why": None}
    cut = _call(turnstile, {}, top_p=0.5)
    assert cut["behaviour_logprobs"]["exact"] is False
    verdict = {}
    for info in (plain, cut):
        (traj,) = turnstile.get(f"/v1/sessions/{info['session_id']}/trajectories")["data"]
        (turn,) = traj["turns"]
        assert turn["logprob_kind"] == "raw_logprobs"
        assert turn["behaviour_exact"] is info["behaviour_logprobs"]["exact"]
        verdict[traj["id"]] = turn["behaviour_exact"]
    st = Store(turnstile.data)
    for sid in (plain["session_id"], cut["session_id"]):
        (t,) = stitch(st.calls(sid))
        want = t.loss_mask if verdict[t.id] else 0 * t.loss_mask
        assert t.behaviour_mask().tolist() == want.tolist() and t.loss_mask.sum() > 0
    st.close()
    export(turnstile.data, tmp_path / "out", batch="b", mark_exported=False)
    rows = pq.read_table(tmp_path / "out" / "trajectories").to_pylist()
    got = {r["id"]: [(u["logprob_kind"], u["behaviour_exact"]) for u in r["turns"]] for r in rows}
    assert got == {k: [("raw_logprobs", v)] for k, v in verdict.items()}
