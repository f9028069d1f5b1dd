"""The behaviour logprob in the trainers' fields (issue 42): every converter that hands logprobs
to a trainer's rollout field warns (one ``InexactLogprobsWarning``, the default) or refuses
(``inexact="refuse"``: ValueError naming the sample and call) when a trained call's record says
its logprobs are not the sampler's (``info.behaviour_logprobs.exact`` False), says nothing when
all are, and where the stack has a free-form metadata channel (slime ``metadata``, prime-rl
``extras``, verl ``extra_fields``) says whether the sample's rollout logprobs are exact. The
rollout field itself holds the recorded (sampler's) logprob of each sampled token.

The field names are those the trainers' classes take (``tests/test_trainer_contracts.py``
builds them in the trainers' venv); here the records say exact or not, and the checks are on
what each converter does with that."""

from __future__ import annotations

import warnings
from array import array

import numpy as np
import pytest

from turnstile.converters import areal, openrlhf, prime_rl, skyrl, slime, tinker, trl, verl
from turnstile.converters._common import InexactLogprobsWarning, behaviour_exact
from turnstile.store.records import CallRecord
from turnstile.store.trajectories import Trajectory, stitch

pytestmark = pytest.mark.unit

PAD = 0


def _rec(cid: str, parent: CallRecord | None, exact: bool | None, lps: list[float]) -> CallRecord:
    prefix = 0 if parent is None else parent.reused_prefix_len + len(parent.prompt_delta)
    prefix += 0 if parent is None else len(parent.completion_ids)
    completion = [50 + int(cid[1:]) * 3 + i for i in range(len(lps))]
    info: dict = {"logprob_kind": "processed_logprobs" if exact else "scaled_logprobs"}
    if exact is not None:
        why = None if exact else "recorded logprobs are scaled_logprobs, taken before top_p 0.9"
        info["behaviour_logprobs"] = {"exact": exact, "kind": info["logprob_kind"], "why": why}
    return CallRecord(
        id=cid,
        session_id="s" + cid,
        seq=int(cid[1:]),
        parent_id=parent.id if parent else None,
        segment_reason=None if parent else "first_call",
        reused_prefix_len=prefix,
        prompt_delta=array("i", [1, 2, 3] if parent is None else [7, 8]),
        completion_ids=array("i", completion),
        completion_logprobs=array("f", lps),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        message={"role": "assistant", "content": "x"},
        info=info,
        arrays={},
    )


def _sample(name: str, exact: tuple[bool | None, bool | None]) -> Trajectory:
    a = _rec("c1", None, exact[0], [-0.25, -0.5])
    b = _rec("c2", a, exact[1], [-1.0, -0.125, -2.0])
    (t,) = stitch([a, b])
    t.id, t.session_id, t.group_id, t.sample_index = name, name, "g", int(name[-1])
    t.rewards = {"reward": 1.0}
    t.reward = 1.0
    return t


# each converter that hands logprobs to a trainer, with what it needs besides the samples
CONVERTERS = {
    "areal": lambda ts, **kw: areal.to_areal_batch(ts, **kw),
    "openrlhf samples": lambda ts, **kw: openrlhf.to_openrlhf_samples(ts, decode=str, **kw),
    "openrlhf experience": lambda ts, **kw: openrlhf.to_openrlhf_experience(ts, PAD, **kw),
    "prime-rl": lambda ts, **kw: prime_rl.to_prime_rl_samples(ts, advantages=[0.0] * len(ts), **kw),
    "verifiers": lambda ts, **kw: prime_rl.to_verifiers_steps(ts, **kw),
    "skyrl": lambda ts, **kw: skyrl.to_skyrl_generator_output(ts, **kw),
    "slime": lambda ts, **kw: slime.to_slime_samples(ts, **kw),
    "tinker": lambda ts, **kw: tinker.to_tinker_datums(
        ts, advantages=[0.0] * len(ts), sdk=False, **kw
    ),
    "trl": lambda ts, **kw: trl.to_trl_rollout(ts, **kw),
    "verl batch": lambda ts, **kw: verl.to_verl_batch(ts, PAD, **kw),
    "verl agent loop": lambda ts, **kw: verl.to_verl_agent_loop_outputs(ts, **kw),
}


@pytest.mark.parametrize("name", sorted(CONVERTERS))
def test_inexact_logprobs_warn_once_or_are_refused(name) -> None:
    convert = CONVERTERS[name]
    good, bad = _sample("s1", (True, True)), _sample("s2", (True, False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all exact: not a word
        convert([good, _sample("s3", (True, True))])
        convert([good], inexact="refuse")
    with pytest.warns(InexactLogprobsWarning) as caught:
        convert([good, bad])
    assert len([w for w in caught if w.category is InexactLogprobsWarning]) == 1
    msg = str(caught[0].message)
    assert "1 of 2 sample(s)" in msg and "sample s2, call c2" in msg and "scaled_logprobs" in msg
    with pytest.raises(ValueError, match="sample s2, call c2"):
        convert([good, bad], inexact="refuse")
    with pytest.raises(ValueError, match="inexact must be one of"):
        convert([good], inexact="ignore")


def test_an_inexact_call_outside_the_loss_does_not_count() -> None:
    t = _sample("s1", (False, True))
    t.loss_mask[:] = 0  # nothing of the sample is trained on
    t.loss_mask[t.turns[1]["completion_start"] : t.turns[1]["completion_end"]] = 1
    assert behaviour_exact(t) is True
    verl.to_verl_batch([t], PAD, inexact="refuse")  # the inexact call is not trained
    assert behaviour_exact(_sample("s2", (True, None))) is None  # an older record: unknown


def test_the_metadata_channels_say_whether_the_logprobs_are_exact() -> None:
    ts = [_sample("s1", (True, True)), _sample("s2", (True, False))]
    with pytest.warns(InexactLogprobsWarning):
        slime_out = slime.to_slime_samples(ts)
        prime = prime_rl.to_verifiers_steps(ts)
        loops = verl.to_verl_agent_loop_outputs(ts)
    by_index = {s["metadata"]["trajectory_id"]: s["metadata"] for s in slime_out}
    assert by_index["s1"]["behaviour_exact"] is True and by_index["s2"]["behaviour_exact"] is False
    assert [p["extras"]["behaviour_exact"] for p in prime] == [True, False]
    assert [o["extra_fields"]["behaviour_exact"] for o in loops] == [True, False]


def test_the_rollout_field_holds_each_sampled_tokens_recorded_logprob() -> None:
    t = _sample("s1", (True, True))
    (s,) = slime.to_slime_samples([t])
    sampled = np.asarray(s["rollout_log_probs"])[np.asarray(s["loss_mask"]) == 1]
    assert sampled.tolist() == [-0.25, -0.5, -1.0, -0.125, -2.0]
    out = verl.to_verl_batch([t], PAD)
    lp, mask = out["batch"]["rollout_log_probs"][0], out["batch"]["response_mask"][0]
    assert lp[mask == 1].tolist() == [-0.25, -0.5, -1.0, -0.125, -2.0]
