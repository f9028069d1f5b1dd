"""``./run demo`` (``python -m turnstile_testbed demo``) as a user runs it (real llama-server,
SmolLM2, the openai client): its template renders tools, and its table shows the tool round:
a forced call, its result sent back, and the answer chained onto the call's recorded tokens.
What the model writes is not asserted, only what the forced call and the record guarantee on
any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from turnstile.store.store import Store
from turnstile.store.trajectories import trajectories

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]

COLUMNS = [
    "session",
    "mode",
    "calls",
    "chained",
    "tool calls",
    "tokens",
    "sampled",
    "reused",
    "segments",
]


def _rows(out: str) -> dict[str, dict[str, str]]:
    """The table's rows by mode (the columns before 'drifted turns')."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("session ")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        cells = line.split()[: len(COLUMNS)]
        row = dict(zip(COLUMNS, cells, strict=True))
        rows[row["mode"]] = row
    return rows


def test_the_demo_shows_a_tool_round(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "turnstile_testbed", "demo", "--sessions", "1", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=800,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "does not render 'tools'" not in out
    rows = _rows(out)
    assert set(rows) == {"plain", "tools"}, out
    tools = rows["tools"]
    assert (tools["calls"], tools["chained"], tools["tool calls"], tools["segments"]) == (
        "2",
        "1",
        "1",
        "1",
    ), out
    assert "The tool round" in out and "forced get_weather" in out
    # it ends on what was recorded: one trajectory's runs of tokens with their mask, and the
    # viewer on the demo's own data
    picture = out[out.index("One trajectory as the trainer gets it") :]
    assert picture.count(" sampled, mean logprob ") == 2  # the forced call and the answer
    assert f"turnstile view --data {data}" in out

    # The record behind the row: the call forced under a grammar, the answer extending it.
    store = Store(data)
    try:
        calls = store.calls(tools["session"])
    finally:
        store.close()
    forced, answer = calls
    (call,) = forced.message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert "grammar" in forced.info["sampling"]
    assert answer.parent_id == forced.id and answer.segment_reason is None
    assert not answer.message.get("tool_calls")
    (traj,) = trajectories(calls)
    prompt = traj["token_ids"][: answer.reused_prefix_len]
    assert answer.reused_prefix_len == len(forced.prompt_delta) + len(forced.completion_ids)
    assert prompt[len(forced.prompt_delta) :] == forced.completion_ids.tolist()
