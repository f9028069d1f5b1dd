"""End to end on a real llama-server: the records equal what the engine received and sampled.

The truth is the recording relay between Turnstile and llama-server, not Turnstile's own
bookkeeping. The model has random weights on the real Qwen2 vocabulary, so it samples
non-canonical tokenizations: re-tokenizing its text drifts, and these tests show it.
"""

from __future__ import annotations

import openai
import pytest

from turnstile.chat.template import ChatTemplate
from turnstile.chat.tokenizer import load_tokenizer

IM_END = 151645  # <|im_end|> in the Qwen2 vocabulary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _client(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key="unused", max_retries=0)


def _run_conversation(client: openai.OpenAI, no_end: dict, turns: int = 4) -> list[dict]:
    """user/assistant alternating; turn 1 streams, turn 2 is pushed to stop on <|im_end|>, the
    others can sample no end token (``no_end``): they run to max_tokens whatever the CPU."""
    msgs: list[dict] = [{"role": "system", "content": "You are a terse assistant."}]
    users = [
        "Hello there, how are you doing?",
        "Tell me about HAVING fun in Zürich.",
        "Why is that?",
        "Thanks, goodbye!",
    ]
    for i in range(turns):
        msgs.append({"role": "user", "content": users[i]})
        kw = dict(
            model="tiny", messages=msgs, max_tokens=40, temperature=1.0, seed=7 + i, logprobs=True
        )
        # turn 2: <|im_end|> is ~96% likely at each step (no other end token can be sampled)
        kw["logit_bias"] = {**no_end, str(IM_END): 15} if i == 2 else no_end
        if i == 1:
            text = ""
            stream = client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}
            )
            finish = None
            for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            assert finish == "length"
        else:
            r = client.chat.completions.create(**kw)
            text = r.choices[0].message.content
        msgs.append({"role": "assistant", "content": text})
    return msgs


def test_trajectory_is_exactly_what_the_engine_saw_and_sampled(
    turnstile, relay, tiny_qwen2, no_end_bias
):
    session = turnstile.session(task="exact")
    msgs = _run_conversation(_client(session), no_end_bias)

    exchanges = relay.completions()
    assert len(exchanges) == 4
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(trajs) == 1
    traj = trajs[0]

    last = exchanges[-1]
    assert traj["token_ids"] == last.request["prompt"] + last.response["tokens"]

    # Each call's prompt + sample is a prefix of the next prompt: nothing was re-encoded.
    mask = [0] * len(traj["token_ids"])
    for ex in exchanges:
        start = len(ex.request["prompt"])
        sampled = ex.response["tokens"]
        assert ex.response["tokens_predicted"] == len(sampled)  # no sampled token went missing
        assert traj["token_ids"][: start + len(sampled)] == ex.request["prompt"] + sampled
        mask[start : start + len(sampled)] = [1] * len(sampled)
        # Logprobs: the engine's, in order, on the tokens they belong to. llama-server gives
        # none for a token ending mid-UTF-8 character; those are null, never a neighbour's.
        got = traj["logprobs"][start : start + len(sampled)]
        probs = ex.response["completion_probabilities"]
        known = [(traj["token_ids"][start + i], lp) for i, lp in enumerate(got) if lp is not None]
        assert [t for t, _ in known] == [p["id"] for p in probs]
        assert [lp for _, lp in known] == pytest.approx([p["logprob"] for p in probs], abs=1e-5)
    assert traj["loss_mask"] == mask
    assert all(lp == 0.0 for lp, m in zip(traj["logprobs"], mask, strict=True) if m == 0)
    assert [t["call_id"] for t in traj["turns"]] == traj["call_ids"]
    assert traj["segment_reason"] == "first_call"

    # The engine got token IDs with our sampling settings, not llama.cpp's defaults.
    assert all(ex.request["top_k"] == 0 and ex.request["min_p"] == 0.0 for ex in exchanges)
    # Both seams were exercised: turn 2 ended on a sampled <|im_end|>, the others at length.
    ends = [ex.response["tokens"][-1] == IM_END for ex in exchanges]
    assert ends == [False, False, True, False]
    assert [len(ex.response["tokens"]) for i, ex in enumerate(exchanges) if i != 2] == [40] * 3

    # Naive alternative: re-render the conversation text and re-tokenize it.
    tok = load_tokenizer(str(tiny_qwen2))
    naive = tok.encode(ChatTemplate.for_tokenizer(tok).render(msgs, add_generation_prompt=False))
    assert naive != traj["token_ids"]
    drifted = [
        ex
        for ex in exchanges
        if tok.encode(tok.decode([t for t in ex.response["tokens"] if t != IM_END]))
        != [t for t in ex.response["tokens"] if t != IM_END]
    ]
    assert drifted, "a random model should sample at least one non-canonical tokenization"


def test_calls_record_deltas_and_parents(turnstile, relay, no_end_bias):
    session = turnstile.session()
    _run_conversation(_client(session), no_end_bias, turns=3)
    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    exchanges = relay.completions()
    assert [c["parent_id"] for c in calls] == [None, calls[0]["id"], calls[1]["id"]]
    for c, ex in zip(calls, exchanges, strict=True):
        prompt = ex.request["prompt"]
        assert c["reused_prefix_len"] + len(c["prompt_delta_ids"]) == len(prompt)
        assert prompt[c["reused_prefix_len"] :] == c["prompt_delta_ids"]
        assert c["completion_ids"] == ex.response["tokens"]
        assert c["sampling"]["seed"] == ex.request["seed"]
        assert c["status"] == "ok"
    assert calls[1]["reused_prefix_len"] > 0 and calls[2]["reused_prefix_len"] > 0


def test_edited_history_starts_a_new_segment(turnstile, relay, no_end_bias):
    session = turnstile.session()
    client = _client(session)
    msgs = _run_conversation(client, no_end_bias, turns=2)
    edited = [dict(m) for m in msgs]
    edited[1]["content"] = "An edited first question."  # compaction / rewrite
    edited.append({"role": "user", "content": "Go on."})
    client.chat.completions.create(model="tiny", messages=edited, max_tokens=8, seed=1)

    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    last = calls[-1]
    assert last["parent_id"] is None
    assert last["reused_prefix_len"] == 0
    assert last["segment_reason"] == "history_diverged"
    assert "messages[1]" in last["segment_detail"]
    # Its prompt is the template's full render, exactly as sent.
    assert relay.completions()[-1].request["prompt"] == last["prompt_delta_ids"]
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert sorted(t["segment_reason"] for t in trajs) == ["first_call", "history_diverged"]


def test_retry_becomes_a_sibling(turnstile, relay, no_end_bias):
    session = turnstile.session()
    client = _client(session)
    msgs = _run_conversation(client, no_end_bias, turns=1)
    msgs.append({"role": "user", "content": "Again?"})
    for seed in (1, 2):  # the harness retries the same request
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, seed=seed)
    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert len(calls) == 3
    assert calls[1]["parent_id"] == calls[2]["parent_id"] == calls[0]["id"]
    assert calls[1]["prompt_delta_ids"] == calls[2]["prompt_delta_ids"]
    trajs = turnstile.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    assert len(trajs) == 2
    exchanges = relay.completions()
    for traj, ex in zip(trajs, exchanges[1:], strict=True):
        assert traj["token_ids"] == ex.request["prompt"] + ex.response["tokens"]


def test_echoed_assistant_variants_still_extend(turnstile):
    """Harnesses send back null content, re-serialised JSON, or drop fields; still the same turn."""
    session = turnstile.session()
    client = _client(session)
    msgs = [{"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, seed=3)
    echoed = r.choices[0].message.model_dump()  # every field, None included
    echoed["reasoning_content"] = None
    msgs += [echoed, {"role": "user", "content": "More"}]
    client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, seed=4)
    calls = turnstile.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert calls[1]["parent_id"] == calls[0]["id"]


def test_response_logprobs_and_usage_are_the_engines(turnstile, relay, no_end_bias):
    session = turnstile.session()
    r = _client(session).chat.completions.create(  # 16 tokens, none an end token
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=16,
        seed=11,
        logprobs=True,
        top_logprobs=3,
        logit_bias=no_end_bias,
    )
    ex = relay.completions()[-1]
    assert ex.request["n_probs"] == 3
    assert r.usage.prompt_tokens == len(ex.request["prompt"])
    assert r.usage.completion_tokens == len(ex.response["tokens"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    entries = r.choices[0].logprobs.content
    sampled = [t for t in ex.response["tokens"] if t != IM_END]
    assert len(entries) == len(sampled)
    # llama-server's entries are the sampled tokens in order, less those ending mid-UTF-8
    # (it reports none for them; Turnstile gives null there): walk both, in position.
    probs = ex.response["completion_probabilities"]
    compared = unreported = 0
    for e, tid in zip(entries, sampled, strict=True):
        if compared < len(probs) and probs[compared]["id"] == tid and e.logprob is not None:
            p = probs[compared]
            assert e.logprob == pytest.approx(p["logprob"], abs=1e-5)
            assert [t.logprob for t in e.top_logprobs] == pytest.approx(
                [t["logprob"] for t in p["top_logprobs"]][:3], abs=1e-5
            )
            compared += 1
        else:
            assert e.logprob is None, f"a logprob for token {tid}, which the engine gave none"
            unreported += 1
    # every logprob the engine gave was compared; every null is one it did not give
    assert compared == len(probs) and unreported == len(sampled) - len(probs)
    assert compared >= len(sampled) // 2, (compared, len(sampled))
