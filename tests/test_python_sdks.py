"""The official Python SDKs running an agent loop through Turnstile, as a user writes one
(``tests/agents/python_sdks.py``): openai (Chat Completions streamed, Responses), anthropic
(``messages.stream``) and google-genai (``generate_content``), each with one tool that reads a
file, in front of the scripted engine (a tool call, then the answer). Checked as the coding
agents are (``test_coding_agents._check``: every call recorded and equal to the wire, the loss
mask, streamed as asked, the file's word in a later prompt).

The SDKs are the venv's pins; the release canary (benchmarks/release_canary.py) runs the same
scenario with the newest releases, in a scratch venv named by ``TURNSTILE_SDK_PYTHON``. Any
warning an SDK raised is printed (``SDK-WARNINGS``) and must be none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_coding_agents as agents
from test_coding_agents import _check, _env, _start

from turnstile.testing.scripted import Script

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

# the coding agents' fixtures: the scripted engine and Turnstile in front of it (this module's own)
smollm2, engine, gateway = agents.smollm2, agents.engine, agents.gateway

SCRIPT = Path(__file__).parent / "agents" / "python_sdks.py"
PYTHON = os.environ.get("TURNSTILE_SDK_PYTHON", sys.executable)


@pytest.mark.parametrize(
    "kind, dialect, streamed",
    [
        ("openai-chat", "chat", True),
        ("openai-responses", "responses", False),
        ("anthropic", "messages", True),
        ("genai", "gemini", False),
    ],
)
def test_python_sdk_agent_runs_its_tool_through_turnstile(
    gateway, engine, tmp_path, kind, dialect, streamed
):
    script = Script("read_note", {"path": "note.txt"}, "Done reading.")
    run = _start(gateway, engine, tmp_path, f"python-{kind}", script)
    base = run.session["base_url" if kind.startswith("openai") else "anthropic_base_url"]
    p = subprocess.run(
        [PYTHON, str(SCRIPT), kind],
        cwd=run.work,
        env=_env(run, BASE_URL=base),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    said = sorted({line for line in p.stderr.splitlines() if line.startswith("SDK-WARNING ")})
    print("\nSDK-WARNINGS " + json.dumps(said))
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"text": "Done reading.", "steps": 2}
    t = _check(run, engine, f"Python {kind}", dialect, streamed)
    assert (t["calls"], t["chained"], t["new_segments"]) == (2, 1, {"first_call": 1})
    assert not said, said
