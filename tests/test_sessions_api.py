"""Trainer-facing session API on a real Turnstile process in front of a real llama-server:
rewards, close, list by group, delete, trajectories per mode; the client (sync and async);
OpenAI-shaped 4xx that name the field; export from the live store."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from turnstile import AsyncClient, Client, TurnstileError
from turnstile.store.export import export

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _chat(base_url: str, turns: int, seed: int) -> list[dict]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    msgs: list[dict] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: why?"})
        r = client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=12, seed=seed + i
        )
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
    return msgs


def _error(r: httpx.Response, status: int, param: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"] and set(err) >= {"message", "type", "param", "code"}
    return err


def test_session_lifecycle_with_the_client(turnstile, relay, tmp_path):
    ts = Client(turnstile.url, data=turnstile.data)  # reads the token the server wrote there
    s = ts.session({"note": "x"}, group_id="g1", sample_index=0, task_id="task-1")
    # The harness's base URL holds the session's capability, not its (listed) id.
    assert "/s/cap_" in s.base_url and s.id not in s.base_url and s.status == "open"
    other = ts.session(group_id="g1", sample_index=1)
    ts.session(group_id="g2", sample_index=0)
    msgs = _chat(s.base_url, turns=2, seed=1)
    assert len(msgs) == 4

    # per_call: one sample per call, each exactly what that engine call got and sampled.
    per_call = s.trajectories(mode="per_call")
    exchanges = relay.completions()
    assert len(per_call) == 2
    for t, ex in zip(per_call, exchanges, strict=True):
        assert t.token_ids.tolist() == ex.request["prompt"] + ex.response["tokens"]
        assert t.prompt_len == len(ex.request["prompt"])
        assert t.loss_mask.tolist() == [0] * t.prompt_len + [1] * len(ex.response["tokens"])
        assert t.mode == "per_call" and t.call_ids == [t.id]
    (merged,) = s.trajectories()
    assert merged.token_ids.tolist() == per_call[-1].token_ids.tolist()
    assert merged.loss_mask.sum() == sum(len(ex.response["tokens"]) for ex in exchanges)
    assert merged.prompt_len == per_call[0].prompt_len

    call_ids = [c["id"] for c in s.calls()]
    s.set_reward(1.0)
    s.set_reward(rewards={"correct": 1.0, "style": 0.25})
    got = s.set_reward(0.5, call_id=call_ids[0])
    assert got.reward == 1.0 and got.rewards == {"reward": 1.0, "correct": 1.0, "style": 0.25}
    assert got.call_rewards[call_ids[0]]["reward"] == 0.5
    (merged,) = s.trajectories()
    assert merged.reward == 1.0 and merged.turns[0]["reward"] == 0.5
    assert merged.turns[1]["reward"] is None
    assert (merged.group_id, merged.sample_index, merged.task_id) == ("g1", 0, "task-1")

    closed = s.close("done")
    assert closed.status == "closed" and closed.termination_reason == "done"
    assert [x.id for x in ts.sessions(group_id="g1")] == [s.id, other.id]
    assert [x.id for x in ts.sessions(group_id="g1", status="closed")] == [s.id]
    assert [t.session_id for t in ts.group_trajectories("g1")] == [s.id]

    # Export from the live store (the server keeps running): same samples as the API.
    result = export(turnstile.data, tmp_path / "out", batch="live", group_ids=["g1"])
    assert result.rows["trajectories"] == 1 and result.rows["calls"] == 2
    import pyarrow.parquet as pq

    row = pq.read_table(tmp_path / "out" / "trajectories").to_pylist()[0]
    assert row["token_ids"] == merged.token_ids.tolist()
    assert row["group_id"] == "g1" and row["reward"] == 1.0

    s.delete()
    with pytest.raises(TurnstileError) as e:
        ts.get_session(s.id)
    assert e.value.status == 404 and e.value.code == "session_not_found"
    with pytest.raises(TurnstileError):
        ts.trajectories(s.id)
    assert [x.id for x in ts.sessions(group_id="g1")] == [other.id]
    # The deleted session's base URL no longer records anything.
    with pytest.raises(openai.NotFoundError):
        _chat(s.base_url, turns=1, seed=5)


def test_bad_requests_name_the_field(turnstile):
    url, http = turnstile.url, turnstile.http
    sid = turnstile.session()["id"]
    post = lambda path, body: http.post(f"{url}/v1/sessions/{sid}{path}", json=body)  # noqa: E731
    _error(post("/rewards", {"reward": "high"}), 400, "reward")
    _error(post("/rewards", {"reward": True}), 400, "reward")
    _error(post("/rewards", {"rewards": {"ok": None}}), 400, "rewards.ok")
    _error(post("/rewards", {"rewards": []}), 400, "rewards")
    _error(post("/rewards", {"rewrd": 1}), 400, "rewrd")
    _error(post("/rewards", {}), 400, "reward")
    _error(post("/rewards", {"reward": 1, "call_id": 7}), 400, "call_id")
    err = _error(post("/rewards", {"reward": 1, "call_id": "call_nope"}), 404, "call_id")
    assert err["code"] == "call_not_found"
    _error(post("/close", {"termination_reason": 3}), 400, "termination_reason")
    _error(post("/close", {"status": "x"}), 400, "status")
    r = http.get(f"{url}/v1/sessions/{sid}/trajectories", params={"mode": "tree"})
    _error(r, 400, "mode")
    _error(http.get(f"{url}/v1/sessions", params={"status": "done"}), 400, "status")
    _error(http.get(f"{url}/v1/sessions", params={"limit": "0"}), 400, "limit")
    _error(http.get(f"{url}/v1/sessions", params={"grop": "g"}), 400, "grop")
    _error(http.post(f"{url}/v1/sessions", json={"sample_index": -1}), 400, "sample_index")
    _error(http.post(f"{url}/v1/sessions", json={"group_id": 5}), 400, "group_id")
    _error(http.delete(f"{url}/v1/sessions/nope"), 404, "session_id")
    _error(http.post(f"{url}/v1/sessions/nope/rewards", json={"reward": 1}), 404, "session_id")
    _error(http.get(f"{url}/v1/sessions/{sid}/calls/call_x/body"), 404, "call_id")
    # NUL cannot be kept by every store (PostgreSQL's text): refused in what is stored as
    # text, and nothing found by it
    _error(http.post(f"{url}/v1/sessions", json={"group_id": "g\x00"}), 400, "group_id")
    _error(http.post(f"{url}/v1/sessions", json={"id": "s\x00"}), 400, "id")
    _error(post("/rewards", {"rewards": {"a\x00": 1}}), 400, "rewards")
    _error(post("/close", {"termination_reason": "x\x00"}), 400, "termination_reason")
    _error(http.get(f"{url}/v1/sessions/a%00b"), 404, "session_id")
    assert http.get(f"{url}/v1/sessions", params={"group": "\x00"}).json()["data"] == []
    # Nothing above changed the session.
    s = http.get(f"{url}/v1/sessions/{sid}").json()
    assert s["rewards"] == {} and s["status"] == "open"


def test_async_client_runs_a_group_concurrently(turnstile, relay):
    async def main() -> list:
        async with AsyncClient(turnstile.url, token=turnstile.token) as ts:
            sessions = await asyncio.gather(
                *(ts.session(group_id="ga", sample_index=i, metadata={"k": i}) for i in range(4))
            )

            async def rollout(s) -> None:
                await asyncio.to_thread(_chat, s.base_url, 2, 10 * s.sample_index)
                await s.set_reward(float(s.sample_index))
                await s.close()

            await asyncio.gather(*(rollout(s) for s in sessions))
            trajs = await ts.group_trajectories("ga")
            per_call = await sessions[0].trajectories("per_call")
            await sessions[3].delete()
            left = await ts.sessions(group_id="ga")
            return trajs, per_call, left

    trajs, per_call, left = asyncio.run(main())
    assert [t.sample_index for t in trajs] == [0, 1, 2, 3]
    assert [t.reward for t in trajs] == [0.0, 1.0, 2.0, 3.0]
    assert all(t.status == "closed" and t.num_turns == 2 for t in trajs)
    assert len(per_call) == 2 and len(left) == 3
    # Each sample is one of the engine's recorded sequences.
    sent = [ex.request["prompt"] + ex.response["tokens"] for ex in relay.completions()]
    assert all(t.token_ids.tolist() in sent for t in trajs)
