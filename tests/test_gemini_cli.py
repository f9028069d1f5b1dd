"""gemini-cli (``gemini -p``, the Gemini dialect, streamed with ``alt=sse``) on its defaults
through Turnstile: pinned (``turnstile_testbed.NODE_HARNESSES``), given a base URL, a key and a
model name the way its docs tell a user (``GOOGLE_GEMINI_BASE_URL``, ``GEMINI_API_KEY``,
``-m``), its API-key auth chosen in its settings and the workspace trusted for a headless run
(``GEMINI_CLI_TRUST_WORKSPACE``). The scripted engine (SmolLM2's tokenizer, a Hermes tool call
then an answer) makes it read a file with its own ``read_file`` tool; checked as the other coding
agents are (``test_coding_agents._check``: every call recorded and equal to the wire, the loss
mask, streamed as asked, the file's word in a later prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_coding_agents as agents
from test_coding_agents import TASK, _bodies, _check, _env, _read_note, _run, _start

from turnstile.testing.scripted import first_token_delay

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

# the coding agents' fixtures: the scripted engine and Turnstile in front of it (this module's own)
node, smollm2, engine = agents.node, agents.smollm2, agents.engine
gateway, keepalive_gateway = agents.gateway, agents.keepalive_gateway


def _gemini_env(run, **extra: str) -> dict[str, str]:
    """Its documented headless setup: the key, the base URL (the session's, without ``/v1``:
    the SDK adds the API version), the API-key auth chosen in ``~/.gemini/settings.json`` (with
    only ``GOOGLE_GEMINI_BASE_URL`` set, 0.61.0 picks its ``gateway`` auth and exits "Invalid
    auth method selected."), the workspace trusted."""
    settings = run.home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    return _env(
        run,
        GEMINI_API_KEY="unused",
        GOOGLE_GEMINI_BASE_URL=run.session["anthropic_base_url"],
        GEMINI_CLI_TRUST_WORKSPACE="true",
        **extra,
    )


def test_gemini_cli_reads_a_file_through_turnstile(gateway, engine, node, tmp_path: Path):
    run = _start(gateway, engine, tmp_path, "gemini-cli", _read_note(tmp_path))
    gemini = str(node / "node_modules" / ".bin" / "gemini")
    out = _run([gemini, "-p", TASK, "-m", "smollm2"], run, _gemini_env(run))
    assert "Done reading." in out
    t = _check(run, engine, "gemini-cli", "gemini", True)
    assert t["chained"] >= 1
    main = [b for b in _bodies(run) if b.get("tools")]
    assert main
    # its defaults, accepted as what they are: JSON-schema tools, thinking on
    decls = [d for b in main for tool in b["tools"] for d in tool.get("functionDeclarations", ())]
    assert any("parametersJsonSchema" in d for d in decls)


@pytest.mark.parametrize("keepalive_gateway", [1], indirect=True)
def test_gemini_cli_reads_through_keepalives_during_a_long_prefill(
    keepalive_gateway, engine, node, tmp_path: Path
):
    """3 s of silence before each first token, keep-alives every second: the stream's parser
    (@google/genai's, which reads only events that start with ``data:``) takes each keep-alive
    as an empty model turn and goes on; an SSE comment there would stall it for good."""
    run = _start(keepalive_gateway, engine, tmp_path, "gemini-cli", _read_note(tmp_path))
    fake, _ = engine
    gemini = str(node / "node_modules" / ".bin" / "gemini")
    with first_token_delay(fake, 3.0):
        out = _run([gemini, "-p", TASK, "-m", "smollm2"], run, _gemini_env(run), timeout=120)
    assert "Done reading." in out
    t = _check(run, engine, "gemini-cli (3 s prefill)", "gemini", True)
    assert t["chained"] >= 1
