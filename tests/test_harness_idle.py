"""Idle timers through a long prefill (issue 45): while nothing has been sampled yet, each
dialect's stream sends what the harness's idle timer counts as activity, so a harness waits
out a prefill longer than its timer instead of leaving and sending the call again. Each CLI
on its defaults (``test_coding_agents``), its timer shortened by its own setting, in front of
``turnstile serve --keepalive 1`` and the scripted engine silent before the first request's
first token for longer than that timer (Qwen Code's is in ``test_coding_agents``). Read
from each CLI's shipped code (docs/harnesses/*.md):

- Claude Code 2.1.332: a byte watchdog, ``CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS`` (10 s at the
  least), counts any bytes: Anthropic's ``ping`` events; its event watchdog,
  ``CLAUDE_STREAM_IDLE_TIMEOUT_MS``, cannot be set under 300 s (not run here).
- Codex 0.171.0: ``stream_idle_timeout_ms`` of its model provider (300 s by default) counts
  SSE events, never comments: Turnstile sends OpenAI's own ``keepalive`` event.
- opencode 1.18.33: ``chunkTimeout`` of its provider (300 s by default) aborts a read of the
  body that brings no bytes: any bytes count.
- Pi 0.73.1: no idle timer on a stream (its ``cli.js`` turns undici's body timeout off; its
  SDKs' ``retry.provider.timeoutMs`` runs until the answer's headers only).
- gemini-cli 0.61.0: none of its own nor @google/genai's on a stream; its global undici
  dispatcher's ``headersTimeout`` (60 s; set by its ``GEMINI_EXP`` experiments file) and
  ``bodyTimeout`` (300 s, not settable): the head and a first empty model turn leave at once,
  then Gemini keep-alives (empty model turns, the only thing its SDK's parser takes).

Codex's control (``--keepalive 0``) shows its timer firing: the harness leaves mid-prefill (that
call recorded ``aborted``) and sends the same prompt again."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import test_coding_agents as agents
from conftest import Turnstile
from test_coding_agents import TASK, Run, _check, _env, _read_note, _start
from test_gemini_cli import _gemini_env

import turnstile_testbed as testbed
from turnstile.testing.fake_vllm import VLLMFake
from turnstile.testing.scripted import Script, first_token_delay

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

# the coding agents' fixtures: the scripted engine, Turnstile --keepalive N in front of it
node, smollm2, engine = agents.node, agents.smollm2, agents.engine
keepalive_gateway = agents.keepalive_gateway


@pytest.fixture(scope="module")
def kept(engine: tuple, smollm2, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``turnstile serve --keepalive 1`` in front of the scripted engine, shared by the
    module's runs (each its own session)."""
    fake, _ = engine
    tmp = tmp_path_factory.mktemp("turnstile-idle")
    template = str(testbed.templates_dir() / agents.QWEN25)
    extra = ("--engine", "vllm", "--chat-template", template, "--keepalive", "1", "--keep-bodies")
    ts = Turnstile(fake.url, smollm2, tmp / "data", tmp / "turnstile.log", extra)
    ts.start()
    yield ts
    ts.stop()


@contextmanager
def first_request_delay(fake: VLLMFake, seconds: float) -> Iterator[None]:
    """Silence before the first token of the first request only (a long prefill): a retry
    of it is answered at once, so a control that leaves costs one timer, not many."""
    first: list[str] = []
    plain = fake.pace

    async def pace(rid: str) -> bool:
        if not first:
            first.append(rid)
            await asyncio.sleep(seconds)
        return await plain(rid)

    fake.pace = pace  # type: ignore[method-assign]
    try:
        yield
    finally:
        del fake.pace


def _go(cmd: list[str], run: Run, env: dict[str, str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=run.work, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Done reading." in p.stdout
    return p


def _left_and_resent(run: Run, engine: tuple) -> None:
    """The control: the first call abandoned mid-prefill (recorded ``aborted``), its prompt
    sent again, and the run finished on the resent one."""
    fake, _ = engine
    prompts = [tuple(p) for p, _ in fake.model.exchanges[run.seen :]]
    calls = run.ts.get(f"/v1/sessions/{run.session['id']}/calls")["data"]
    assert calls[0]["status"] == "aborted", [c["status"] for c in calls]
    assert [c["status"] for c in calls[1:]] == ["ok"] * (len(calls) - 1)
    assert len(prompts) == len(calls) and prompts[0] == prompts[1]


def test_claude_code_waits_out_a_long_prefill_on_pings(kept, engine, node, tmp_path):
    """Its byte watchdog at its least, 10 s; 12 s of silence before the first token. (The
    control, ``--keepalive 0``, run by hand and left out of the suite for its 13 s: the
    first call aborted at 10 s, its prompt resent; ``_left_and_resent`` held.)"""
    script = Script("Bash", {"command": "cat note.txt", "description": "Read it"}, "Done reading.")
    run = _start(kept, engine, tmp_path, "claude-code", script)
    env = _env(
        run,
        ANTHROPIC_BASE_URL=run.session["anthropic_base_url"],
        ANTHROPIC_API_KEY="sk-unused",
        CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS="10000",
    )
    fake, _ = engine
    with first_request_delay(fake, 12.0):
        _go([str(node / "node_modules/.bin/claude"), "-p", TASK, "--model", "smollm2"], run, env)
    t = _check(run, engine, "Claude Code (12 s prefill)", "messages", True)
    assert t["chained"] >= 1


def _codex_provider(base: str) -> list[str]:
    """Codex's documented custom provider (``model_providers.<id>``, as for any
    OpenAI-compatible server) with its idle timer at 3 s."""
    provider = {
        "name": '"Turnstile"',
        "base_url": f'"{base}"',
        "env_key": '"OPENAI_API_KEY"',
        "wire_api": '"responses"',
        "stream_idle_timeout_ms": "3000",
    }
    out = ["-c", 'model_provider="turnstile"']
    for k, v in provider.items():
        out += ["-c", f"model_providers.turnstile.{k}={v}"]
    return out


def _codex(ts: Turnstile, engine: tuple, node, tmp_path) -> tuple[Run, str]:
    """Its idle timer at 3 s; 5 s of silence before the first token."""
    script = Script("exec_command", {"cmd": "cat note.txt"}, "Done reading.")
    run = _start(ts, engine, tmp_path, "codex", script)
    codex = [str(node / "node_modules/.bin/codex"), "exec"]
    codex += _codex_provider(run.session["base_url"])
    fake, _ = engine
    with first_request_delay(fake, 5.0):
        p = _go(
            [*codex, "-m", "smollm2", "--skip-git-repo-check", TASK],
            run,
            _env(run, OPENAI_API_KEY="sk-unused"),
        )
    return run, p.stderr


def test_codex_waits_out_a_long_prefill_on_keepalive_events(kept, engine, node, tmp_path):
    """With SSE comments (Turnstile's keep-alive before) it reconnected ("Reconnecting...
    1/5") exactly as the control does."""
    run, said = _codex(kept, engine, node, tmp_path)
    assert "Reconnecting" not in said, said[-2000:]
    t = _check(run, engine, "Codex CLI (5 s prefill)", "responses", True)
    assert t["chained"] >= 1


@pytest.mark.parametrize("keepalive_gateway", [0], indirect=True)
def test_codex_without_keepalives_leaves_and_resends(keepalive_gateway, engine, node, tmp_path):
    run, said = _codex(keepalive_gateway, engine, node, tmp_path)
    assert "Reconnecting" in said
    _left_and_resent(run, engine)


def test_opencode_waits_out_a_long_prefill_on_keepalive_chunks(kept, engine, node, tmp_path):
    """Its ``chunkTimeout`` at 2 s (a provider option in its ``opencode.json``); 3 s of
    silence before every request's first token (its title request runs beside the agent's
    first: the title's is no test, opencode may leave it once it is done). Without
    keep-alives it aborts the agent's read ("SSE read timed out")."""
    path = str(tmp_path / "work" / "note.txt")
    script = Script("read", {"filePath": path}, "Done reading.")
    run = _start(kept, engine, tmp_path, "opencode", script)
    options = {"baseURL": run.session["base_url"], "apiKey": "sk-unused", "chunkTimeout": 2000}
    provider = {"npm": "@ai-sdk/openai-compatible", "options": options, "models": {"smollm2": {}}}
    (run.work / "opencode.json").write_text(json.dumps({"provider": {"turnstile": provider}}))
    env = _env(run, OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1")
    fake, _ = engine
    opencode = str(node / "node_modules/.bin/opencode")
    with first_token_delay(fake, 3.0):
        _go([opencode, "run", "-m", "turnstile/smollm2", TASK], run, env)
    t = _check(run, engine, "opencode (3 s prefill)", "chat", True)
    assert t["chained"] >= 1


def test_pi_waits_out_a_long_prefill(kept, engine, node, tmp_path):
    """No idle timer to feed: its one timer, ``retry.provider.timeoutMs`` (3 s here, in its
    ``settings.json``), ends when the answer's headers come; 5 s of silence after them."""
    script = Script("read", {"path": "note.txt"}, "Done reading.")
    run = _start(kept, engine, tmp_path, "pi", script)
    agents._pi_models(run, "openai-completions", run.session["base_url"])
    settings = run.home / ".pi" / "agent" / "settings.json"
    settings.write_text(json.dumps({"retry": {"provider": {"timeoutMs": 3000}}}))
    pi = [str(node / "node_modules/.bin/pi"), "-p", "--provider", "turnstile", "--model", "smollm2"]
    fake, _ = engine
    with first_request_delay(fake, 5.0):
        _go([*pi, TASK], run, _env(run))
    t = _check(run, engine, "Pi (5 s prefill)", "chat", True)
    assert t["chained"] >= 1


def _gemini_exp(run: Run, seconds: int) -> str:
    """gemini-cli's one shortenable fetch timer: its experiments file (``GEMINI_EXP``, read
    before any Code Assist server) with flag 45773134 (``DEFAULT_REQUEST_TIMEOUT``, seconds)
    makes ``updateGlobalFetchTimeouts`` set undici's ``headersTimeout`` (60 s by default); its
    ``bodyTimeout`` stays undici's 300 s."""
    exp = run.home / "gemini-exp.json"
    exp.write_text(json.dumps({"flags": [{"flagId": 45773134, "intValue": str(seconds)}]}))
    return str(exp)


def test_gemini_cli_waits_out_a_long_prefill_on_empty_model_turns(kept, engine, node, tmp_path):
    """Its headers timer at 2 s (``GEMINI_EXP``); 5 s of silence before the first request's
    first token, five keep-alives (empty model turns) meanwhile. The response head and a first
    empty turn leave at once, before the prefill; the keep-alives add nothing to the recorded
    answer nor to what it prints, and its next request (the tool round's) extends the recorded
    tokens (chained, no ``history_diverged``). (The control, ``--keepalive 0``, run by hand:
    it answered too, one call each, none aborted: no timer of gemini-cli's fires within 300 s
    once the head has come, and undici's 300 s body timer cannot be set.)"""
    run = _start(kept, engine, tmp_path, "gemini-cli", _read_note(tmp_path))
    env = _gemini_env(run, GEMINI_EXP=_gemini_exp(run, 2))
    gemini = [str(node / "node_modules/.bin/gemini"), "-p", TASK, "-m", "smollm2"]
    fake, _ = engine
    with first_request_delay(fake, 5.0):
        p = _go(gemini, run, env)
    assert p.stdout.strip() == "Done reading.", p.stdout[-2000:]
    t = _check(run, engine, "gemini-cli (5 s prefill)", "gemini", True)
    assert t["chained"] >= 1
    assert "history_diverged" not in t["new_segments"], t
    calls = run.ts.get(f"/v1/sessions/{run.session['id']}/calls")["data"]
    prompts = [tuple(p) for p, _ in fake.model.exchanges[run.seen :]]
    assert len(set(prompts)) == len(prompts) == len(calls)  # nothing sent twice
