"""A harness's side requests (a title, a summary, a sub-agent) are new lineages, told apart from
a rewrite of the agent's own history, with the same labels whatever the engine's timing, in
both recording modes (issue 45).

The scenario is what opencode and Claude Code do: a title request with its own system prompt,
then the agent's first call with another one, its next turn, then a compaction (the agent's
system prompt, its history rewritten as a summary). It runs twice against a fake vLLM that
paces its tokens: once with the title call still running while the agent's calls are made
(as against a slow llama-server), once with it done first (a fast engine). Each call is named
by the messages the engine was sent for it (the kept request body), and the labels of the two
runs must be equal, and be what each request's relation to the recorded conversations says.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest

from turnstile.testing.fake_vllm import MODEL, VLLMFake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TITLE = [
    {"role": "system", "content": "Write a five-word title for the user's task."},
    {"role": "user", "content": "fix the failing test"},
]
AGENT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "fix the failing test"},
]
SUMMARY = {"role": "user", "content": "Summary of the work so far: nothing yet."}
NO_END = {"94": -100, "95": -100}  # the toy model's end tokens, never sampled
DELAY = 0.25  # seconds per token while the title call must stay in flight


@pytest.fixture(scope="module")
def fake() -> Iterator[VLLMFake]:
    with VLLMFake("0.32.0") as f:
        yield f


def _ask(client: openai.OpenAI, msgs: list[dict], n: int) -> dict:
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=n, logit_bias=NO_END, seed=1
    )
    return r.choices[0].message.model_dump(exclude_none=True)


def _role(body: dict) -> str:
    msgs = body["messages"]
    if msgs[0]["content"] == TITLE[0]["content"]:
        return "title"
    if msgs[-1] == SUMMARY:
        return "compacted"
    return "agent" if len(msgs) == 2 else "agent turn 2"


def _labels(ts, fake: VLLMFake, title_running: bool) -> dict[str, str | None]:
    """The scenario in a new session: each call's segment reason, by its role."""
    session = ts.session()
    client = openai.OpenAI(base_url=session["base_url"], api_key="x", max_retries=0)
    got: dict = {}
    title = threading.Thread(target=lambda: got.setdefault("title", _ask(client, TITLE, 24)))
    fake.token_delay = DELAY if title_running else 0.0
    try:
        arrived = len(fake.rec.requests)
        title.start()
        if title_running:  # the title request reached the engine; the agent's comes now
            threading.Event().wait(0)  # (yield)
            for _ in range(500):
                if len(fake.rec.requests) > arrived:
                    break
                threading.Event().wait(0.02)
        else:
            title.join(60)
            assert "title" in got
        msgs = [*AGENT]
        msgs.append(_ask(client, msgs, 2))
        msgs.append({"role": "user", "content": "go on"})
        _ask(client, msgs, 2)
        _ask(client, [AGENT[0], SUMMARY], 2)
        if title_running:  # still sampling: every agent call arrived while it ran
            assert title.is_alive() and "title" not in got
    finally:
        fake.token_delay = 0.0
    title.join(60)
    assert "title" in got
    calls = ts.get(f"/v1/sessions/{session['id']}/calls")["data"]
    assert [c["status"] for c in calls] == ["ok"] * 4
    out: dict[str, str | None] = {}
    ids: dict[str, str] = {}
    for c in calls:
        body = ts.get(f"/v1/sessions/{session['id']}/calls/{c['id']}/body")["request"]
        out[_role(body)] = c["segment_reason"]
        ids[_role(body)] = c["id"]
    assert len(out) == 4, out
    # the samples: the agent's conversation and its compaction are one lineage, the main
    # one; the title request is a side lineage (a trainer keeps or drops it by that)
    trajs = ts.get(f"/v1/sessions/{session['id']}/trajectories")["data"]
    got = {t["call_ids"][-1]: (t["lineage"], t["lineage_role"]) for t in trajs}
    assert got == {
        ids["title"]: (ids["title"], "side"),
        ids["agent turn 2"]: (ids["agent"], "main"),
        ids["compacted"]: (ids["agent"], "main"),
    }
    main = ts.client().trajectories(session["id"], lineages="main")
    assert sorted(t.id for t in main) == sorted([ids["agent turn 2"], ids["compacted"]])
    side = ts.get(f"/v1/sessions/{session['id']}/trajectories?lineages=side")["data"]
    assert [t["id"] for t in side] == [ids["title"]]
    bad = ts.http.get(ts.url + f"/v1/sessions/{session['id']}/trajectories?lineages=agent")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lineages"
    return out


@pytest.mark.parametrize("mode", ["token-in", "capture"])
def test_side_requests_are_new_lineages_whatever_the_timing(
    mode, fake, tiny_qwen2, turnstile_factory
):
    extra = ("--engine", "vllm", "--keep-bodies")
    if mode == "capture":
        extra = ("--mode", "passthrough", *extra)
    ts = turnstile_factory(fake.url, tiny_qwen2, extra=extra)
    running = _labels(ts, fake, title_running=True)
    done = _labels(ts, fake, title_running=False)
    assert running == done
    assert running == {
        "title": "first_call",  # it arrived first
        "agent": "new_conversation",  # another system prompt: a lineage of its own
        "agent turn 2": None,  # continues the agent's first call
        "compacted": "history_diverged",  # the agent's own history, rewritten
    }
