"""Every converter against recorded multi-turn sessions on a real llama-server.

The truth is the recording relay between Turnstile and llama-server: what the engine was sent
(prompt IDs) and what it sampled (token IDs, logprobs). For each stack the test undoes that
stack's own layout (padding, prompt/response split, one-token shift) and checks that the
tokens are exactly the engine's, the mask is 1 exactly on sampled tokens, each logprob sits on
the token it belongs to, and group/sample ids survive.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

from turnstile import Client
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.converters import areal, openrlhf, prime_rl, skyrl, slime, tinker, trl, verl
from turnstile.converters._common import grpo_advantages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

IM_END = 151645
PAD = 151643  # <|endoftext|>: Qwen2's pad token


def _converse(base_url: str, seed: int, turns: int = 3) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    msgs: list[dict] = [{"role": "system", "content": "Be brief."}]
    users = ["Hi! What is HAVING in SQL?", "And in Zürich?", "Thanks."]
    for i in range(turns):
        msgs.append({"role": "user", "content": users[i]})
        kw = dict(
            model="tiny",
            messages=msgs,
            max_tokens=24,
            temperature=1.0,
            seed=seed * 10 + i,
            logprobs=True,
        )
        if i == 1:
            kw["logit_bias"] = {str(IM_END): 12}  # a sampled stop token: the seam path
        if i == 2 and seed % 2:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(**kw, stream=True)
                if c.choices
            )
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        msgs.append({"role": "assistant", "content": text})


class Truth:
    """One session's engine exchanges (from the relay): the sequence and where it sampled."""

    def __init__(self, exchanges: list) -> None:
        self.exchanges = exchanges
        last = exchanges[-1]
        self.tokens = last.request["prompt"] + last.response["tokens"]
        self.mask = [0] * len(self.tokens)
        self.probs: list[tuple[int, int, float]] = []  # (position, token, logprob)
        for ex in exchanges:
            start = len(ex.request["prompt"])
            sampled = ex.response["tokens"]
            assert self.tokens[: start + len(sampled)] == ex.request["prompt"] + sampled
            self.mask[start : start + len(sampled)] = [1] * len(sampled)
            probs = ex.response["completion_probabilities"]
            # llama-server omits the logprob of a token ending mid-UTF-8 character: match
            # the reported ones to the sampled tokens in order.
            j = 0
            for k, tok in enumerate(sampled):
                if j < len(probs) and probs[j]["id"] == tok:
                    self.probs.append((start + k, tok, probs[j]["logprob"]))
                    j += 1
            assert j == len(probs)

    def check(self, name: str, tokens, mask, logprobs, filled: float | None = 0.0) -> None:
        """``filled``: what a sampled token without a reported logprob holds (the
        converters' default fill), or None for NaN (the canonical record)."""
        tokens, mask = list(map(int, tokens)), list(map(int, mask))
        assert tokens == self.tokens, f"{name}: tokens differ from what the engine saw"
        assert mask == self.mask, f"{name}: mask is not 1 exactly on sampled tokens"
        lp = np.asarray(logprobs, dtype=np.float64)
        assert len(lp) == len(tokens), name
        known = {pos for pos, _, _ in self.probs}
        for pos, tok, value in self.probs:
            assert tokens[pos] == tok
            assert lp[pos] == pytest.approx(value, abs=1e-5), f"{name}: logprob at {pos}"
        for pos in range(len(lp)):
            if pos not in known:
                # Not sampled → 0; sampled but unreported → NaN in the record, the fill value
                # in a converter's output (never a neighbour's value).
                if not self.mask[pos]:
                    assert lp[pos] == 0.0, f"{name}: position {pos}"
                elif filled is None:
                    assert np.isnan(lp[pos]), f"{name}: position {pos}"
                else:
                    assert lp[pos] == filled, f"{name}: position {pos}"

    def unreported(self) -> list[int]:
        known = {pos for pos, _, _ in self.probs}
        return [p for p in range(len(self.tokens)) if self.mask[p] and p not in known]


@pytest.fixture
def recorded(turnstile, relay):
    """A GRPO group of 3 sessions (one streams its last turn) plus rewards, via the client."""
    ts = Client(turnstile.url, token=turnstile.token)
    sessions, truths = [], []
    for i in range(3):
        s = ts.session({"split": "train"}, group_id="grp-7", sample_index=i, task_id="t7")
        before = len(relay.completions())
        _converse(s.base_url, seed=i)
        truths.append(Truth(relay.completions()[before:]))
        s.set_reward(float(i), rewards={"format": 0.5})
        s.close()
        sessions.append(s)
    trajs = ts.group_trajectories("grp-7")
    per_call = [t for s in sessions for t in ts.trajectories(s.id, mode="per_call")]
    return sessions, truths, trajs, per_call


def test_every_converter_gives_back_the_engines_tokens(recorded, tiny_qwen2):
    sessions, truths, trajs, per_call = recorded
    assert [t.sample_index for t in trajs] == [0, 1, 2]
    assert [t.session_id for t in trajs] == [s.id for s in sessions]
    assert all(t.group_id == "grp-7" and t.task_id == "t7" for t in trajs)
    assert [t.reward for t in trajs] == [0.0, 1.0, 2.0]
    assert trajs[0].rewards == {"reward": 0.0, "format": 0.5}
    # Sanity: the sampled stop token (seam) was exercised.
    assert any(ex.response["tokens"][-1:] == [IM_END] for tr in truths for ex in tr.exchanges)

    for t, truth in zip(trajs, truths, strict=True):
        truth.check("canonical", t.token_ids, t.loss_mask, t.logprobs, filled=None)
        assert t.token_ids.dtype == np.int32 and t.logprobs.dtype == np.float32
        assert (t.versions == -1).all()  # llama-server reports no weight version

    _check_verl(trajs, truths)
    _check_trl(trajs, truths)
    _check_skyrl(trajs, truths, per_call)
    _check_slime(trajs, truths, tiny_qwen2)
    _check_areal(trajs, truths, per_call)
    _check_openrlhf(trajs, truths, tiny_qwen2)
    _check_prime(trajs, truths, per_call)
    _check_tinker(trajs, truths)


def _check_verl(trajs, truths) -> None:
    out = verl.to_verl_batch(trajs, pad_token_id=PAD)
    b, nt = out["batch"], out["non_tensor_batch"]
    B = len(trajs)
    P, R = b["prompts"].shape[1], b["responses"].shape[1]
    assert (
        b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (B, P + R)
    )
    for k in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
        assert b[k].shape == (B, R), k
    assert b["rollout_log_probs"].dtype == np.float32 and b["input_ids"].dtype == np.int64
    for i, truth in enumerate(truths):
        attn = b["attention_mask"][i]
        p_real, r_real = int(attn[:P].sum()), int(attn[P:].sum())
        assert (attn[: P - p_real] == 0).all() and (attn[P - p_real : P] == 1).all()  # left pad
        assert (attn[P : P + r_real] == 1).all() and (attn[P + r_real :] == 0).all()  # right pad
        assert (b["prompts"][i, : P - p_real] == PAD).all()
        assert (b["responses"][i, r_real:] == PAD).all()
        assert (b["response_mask"][i, r_real:] == 0).all()
        real = attn.astype(bool)
        assert b["position_ids"][i][real].tolist() == list(range(p_real + r_real))
        tokens = b["input_ids"][i][real]
        mask = np.concatenate([np.zeros(p_real), b["response_mask"][i, :r_real]])
        lps = np.concatenate([np.zeros(p_real), b["rollout_log_probs"][i, :r_real]])
        truth.check("verl batch", tokens, mask, lps)
        assert b["rm_scores"][i, r_real - 1] == trajs[i].reward
        assert b["rm_scores"][i].sum() == trajs[i].reward
        assert nt["group_id"][i] == "grp-7" and nt["sample_index"][i] == i
        assert nt["logprob_filled"][i] == [p - p_real for p in truth.unreported()]
        assert nt["__num_turns__"][i] == 2 * len(truth.exchanges)
    assert "uid" not in nt  # verl's own; DataProto.union asserts it matches
    with_uid = verl.to_verl_batch(trajs, pad_token_id=PAD, with_uid=True)
    assert (with_uid["non_tensor_batch"]["uid"] == "grp-7").all()
    for i, (o, truth) in enumerate(
        zip(verl.to_verl_agent_loop_outputs(trajs), truths, strict=True)
    ):
        n_p = len(o["prompt_ids"])
        truth.check(
            "verl agent loop",
            o["prompt_ids"] + o["response_ids"],
            [0] * n_p + o["response_mask"],
            [0.0] * n_p + o["response_logprobs"],
        )
        assert o["extra_fields"]["key"] == f"grp-7_{i}_0" and "uid" not in o["extra_fields"]
        assert o["reward_score"] == float(i)


def _check_trl(trajs, truths) -> None:
    shuffled = [trajs[2], trajs[0], trajs[1]]
    out = trl.to_trl_rollout(shuffled, num_generations=3)
    assert out["sample_index"] == [0, 1, 2]  # TRL's implicit group order restored
    for i, truth in enumerate(truths):
        p, c = out["prompt_ids"][i], out["completion_ids"][i]
        assert len(out["logprobs"][i]) == len(out["env_mask"][i]) == len(c)
        truth.check(
            "trl", p + c, [0] * len(p) + out["env_mask"][i], [0.0] * len(p) + out["logprobs"][i]
        )
        assert out["group_id"][i] == "grp-7" and out["reward"][i] == float(i)
    with pytest.raises(ValueError, match="num_generations"):
        trl.to_trl_rollout(trajs, num_generations=4)
    # In the order of TRL's prompts, matched on task id; a mismatch is an error.
    keyed = trl.to_trl_rollout(shuffled, prompt_keys=["t7"] * 3)
    assert keyed["session_id"] == [t.session_id for t in trajs]
    with pytest.raises(ValueError, match="prompt_keys"):
        trl.to_trl_rollout(trajs, prompt_keys=["t7", "t7", "t8"])


def _check_skyrl(trajs, truths, per_call) -> None:
    out = skyrl.to_skyrl_generator_output(trajs, per_token_rewards=True)
    for i, truth in enumerate(truths):
        p, r = out["prompt_token_ids"][i], out["response_ids"][i]
        truth.check(
            "skyrl",
            p + r,
            [0] * len(p) + out["loss_masks"][i],
            [0.0] * len(p) + out["rollout_logprobs"][i],
        )
        assert out["trajectory_ids"][i] == skyrl.TrajectoryID("grp-7", i)
        assert out["rewards"][i][-1] == float(i) and sum(out["rewards"][i]) == float(i)
    step = skyrl.to_skyrl_generator_output(list(reversed(per_call)), step_wise=True)
    skyrl.check_step_wise(step)
    exchanges = [ex for tr in truths for ex in tr.exchanges]
    rows = list(
        zip(step["prompt_token_ids"], step["response_ids"], step["loss_masks"], strict=True)
    )
    # Every step is one engine call: prompt exactly as sent, response exactly as sampled.
    sent = sorted((ex.request["prompt"], ex.response["tokens"]) for ex in exchanges)
    assert sorted((p, r) for p, r, _ in rows) == sent
    assert all(m == [1] * len(r) for _, r, m in rows)
    assert sum(step["is_last_step"]) == 3
    # Recorded order within each session, whatever order the calls were given in.
    for k in range(len(rows) - 1):
        if step["trajectory_ids"][k] == step["trajectory_ids"][k + 1]:
            assert step["prompt_token_ids"][k + 1][: len(rows[k][0])] == rows[k][0]
    with pytest.raises(ValueError):
        skyrl.check_step_wise({**step, "rewards": [1.0] * len(rows)})


def _check_slime(trajs, truths, model) -> None:
    tok = load_tokenizer(str(model))
    samples = slime.to_slime_samples(trajs, decode=tok.decode)
    for i, (s, truth) in enumerate(zip(samples, truths, strict=True)):
        n = s["response_length"]
        assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == n
        plen = len(s["tokens"]) - n
        truth.check(
            "slime", s["tokens"], [0] * plen + s["loss_mask"], [0.0] * plen + s["rollout_log_probs"]
        )
        assert s["response"] == tok.decode(truth.tokens[plen:])  # decodes back
        assert (s["group_index"], s["index"], s["rollout_id"]) == (0, i, i)
        assert s["metadata"]["group_id"] == "grp-7" and s["metadata"]["sample_index"] == i
        assert s["reward"] == float(i)
    data = slime.to_slime_train_data(samples)
    assert data["response_lengths"] == [s["response_length"] for s in samples]
    assert data["raw_reward"] == [0.0, 1.0, 2.0]
    assert data["rewards"] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)  # grpo: group-normalised
    assert data["rollout_mask_sums"] == [sum(s["loss_mask"]) for s in samples]


def _check_areal(trajs, truths, per_call) -> None:
    dicts = areal.to_areal_tensor_dicts(trajs)
    for d, truth in zip(dicts, truths, strict=True):
        T = len(truth.tokens)
        assert all(
            d[k].shape == (1, T)
            for k in ("input_ids", "loss_mask", "logprobs", "versions", "attention_mask")
        )
        truth.check("areal", d["input_ids"][0], d["loss_mask"][0], d["logprobs"][0])
        assert (d["versions"][0] == -1).all() and d["input_ids"].dtype == np.int32
    batch = areal.concat_padded(dicts)
    T = max(len(tr.tokens) for tr in truths)
    assert batch["input_ids"].shape == (3, T) and batch["rewards"].tolist() == [0, 1, 2]
    for i, truth in enumerate(truths):
        n = len(truth.tokens)
        assert batch["attention_mask"][i].sum() == n
        assert (batch["versions"][i, n:] == 0).all() and (batch["loss_mask"][i, n:] == 0).all()
    # individual style: one dict per call, each exactly one engine exchange.
    exchanges = [ex for tr in truths for ex in tr.exchanges]
    indiv = areal.to_areal_tensor_dicts(per_call)
    got = sorted(d["input_ids"][0].tolist() for d in indiv)
    assert got == sorted(ex.request["prompt"] + ex.response["tokens"] for ex in exchanges)


def _check_openrlhf(trajs, truths, model) -> None:
    tok = load_tokenizer(str(model))
    for s, truth in zip(
        openrlhf.to_openrlhf_samples(trajs, decode=tok.decode), truths, strict=True
    ):
        mask = np.zeros(len(s["observation_tokens"]), dtype=int)
        for a, b in s["action_ranges"]:
            mask[a:b] = 1
        truth.check("openrlhf", s["observation_tokens"], mask, s["rollout_log_probs"])
        assert all(isinstance(v, float) for v in s["extra_logs"].values())
        assert s["extra_logs"]["logprob_filled"] == len(truth.unreported())
        assert s["prompt"] == tok.decode(s["observation_tokens"][: s["action_ranges"][0][0]])
    exp = openrlhf.to_openrlhf_experience(trajs, pad_token_id=PAD)
    T = exp["sequences"].shape[1]
    assert exp["action_mask"].shape == exp["rollout_log_probs"].shape == (3, T - 1)
    for i, truth in enumerate(truths):
        n = int(exp["attention_mask"][i].sum())
        # Undo the shift: position j predicts token j + 1; token 0 is never an action.
        mask = np.concatenate([[0], exp["action_mask"][i, : n - 1]])
        lps = np.concatenate([[0.0], exp["rollout_log_probs"][i, : n - 1]])
        truth.check("openrlhf experience", exp["sequences"][i, :n], mask, lps)


def _check_prime(trajs, truths, per_call) -> None:
    for i, (s, truth) in enumerate(zip(prime_rl.to_prime_rl_samples(trajs), truths, strict=True)):
        truth.check("prime-rl", s["token_ids"], s["mask"], s["logprobs"])
        assert s["temperatures"] == [1.0] * len(s["token_ids"])
        # reward - group mean (rewards 0, 1, 2) on sampled tokens, 0 elsewhere
        assert s["advantages"] == [float(i - 1) * m for m in s["mask"]]
    sent = sorted(
        (ex.request["prompt"], ex.response["tokens"]) for tr in truths for ex in tr.exchanges
    )
    steps = prime_rl.to_verifiers_steps(per_call)
    assert (
        sorted((st["tokens"]["prompt_ids"], st["tokens"]["completion_ids"]) for st in steps) == sent
    )
    for st in steps:
        tk = st["tokens"]
        assert tk["completion_mask"] == [1] * len(tk["completion_ids"])
        assert tk["prompt_mask"] == [0] * len(tk["prompt_ids"])


def _check_tinker(trajs, truths) -> None:
    assert grpo_advantages(trajs).tolist() == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-3)
    adv = grpo_advantages(trajs, scale=False)  # the cookbook's: mean only
    assert adv.tolist() == [-1.0, 0.0, 1.0]
    for d, a, truth in zip(tinker.to_tinker_datums(trajs, sdk=False), adv, truths, strict=True):
        inp = np.asarray(d["model_input"]["chunks"][0]["tokens"])
        f = {k: np.asarray(v["data"]) for k, v in d["loss_fn_inputs"].items()}
        T = len(truth.tokens)
        assert len(inp) == T - 1 and all(len(v) == T - 1 for v in f.values())
        assert inp[1:].tolist() == f["target_tokens"][:-1].tolist()  # the one-token shift
        tokens = np.concatenate([inp[:1], f["target_tokens"]])
        truth.check(
            "tinker",
            tokens,
            np.concatenate([[0], f["mask"]]),
            np.concatenate([[0.0], f["logprobs"]]),
        )
        assert (f["advantages"][f["mask"] == 0] == 0).all()
        assert np.allclose(f["advantages"][f["mask"] == 1], a)


def test_converters_import_no_trainer_package():
    import subprocess
    import sys

    code = (
        "import sys; import turnstile.converters.verl, turnstile.converters.trl, "
        "turnstile.converters.skyrl, turnstile.converters.slime, turnstile.converters.areal,"
        " turnstile.converters.openrlhf, turnstile.converters.prime_rl, "
        "turnstile.converters.tinker; print([m for m in ('torch', 'verl', 'trl', 'skyrl', "
        "'slime', 'areal', 'openrlhf', 'prime_rl', 'tinker', 'transformers', 'pyarrow') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
