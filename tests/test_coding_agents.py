"""Coding agents and agent SDKs on their defaults through Turnstile: Claude Code (``claude -p``,
Anthropic Messages, streamed), Codex CLI (``codex exec``, Responses, streamed), Qwen Code
(``qwen -p``, Chat Completions, streamed; its idle timer through a long prefill) and the AI SDK
(``openai.chat``, ``openai.responses`` with its default ``store``, ``@ai-sdk/anthropic``), each
pinned (``turnstile_testbed.NODE_HARNESSES``), given only a base URL, a key and a model name.

The policy is scripted (``turnstile/testing/scripted.py``): the engine decodes each prompt with
SmolLM2's real tokenizer and samples, in that vocabulary, a tool call in the Qwen2.5 template's
syntax, then a final answer. So each harness really runs its tool in a scratch directory (a
``cat`` of a file holding a fresh random word) and sends the result back. Each test checks
against what the engine received and sampled: every call recorded, each recorded prompt and
completion equal to the wire token for token, the tool's output (the random word) in the
prompt of the call after it, how many calls chained and which started new segments with what
reason. Each prints a ``HARNESS`` line for the README's table (``-s``)."""

from __future__ import annotations

import collections
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import Turnstile

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.testing.scripted import Script, first_token_delay, scripted_vllm

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
TASK = "Read the file note.txt in this directory and tell me the word in it."


@dataclass
class Policy:
    """The script the engine follows now (each test sets its own)."""

    script: Script = field(default_factory=lambda: Script("none", {}, "Done."))

    def reply(self, prompt: str) -> str:
        return self.script.reply(prompt)


@pytest.fixture(scope="module")
def node() -> Path:
    return testbed.node_harnesses()


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return testbed.smollm2_gguf()


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[tuple]:
    policy = Policy()
    fake = scripted_vllm(load_tokenizer(str(smollm2)), policy.reply, "<|im_end|>")
    with fake:
        yield fake, policy


@pytest.fixture(scope="module")
def gateway(engine: tuple, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``turnstile serve`` in front of the scripted engine, with the Qwen2.5 template (it
    renders tools) and the bodies kept (to check what each harness sent)."""
    fake, _ = engine
    tmp = tmp_path_factory.mktemp("turnstile-agents")
    extra = ("--engine", "vllm", "--chat-template", str(testbed.templates_dir() / QWEN25))
    ts = Turnstile(
        fake.url, smollm2, tmp / "data", tmp / "turnstile.log", (*extra, "--keep-bodies")
    )
    ts.start()
    yield ts
    ts.stop()


@dataclass
class Run:
    """One harness run: its session, scratch directory, and the word only its tool can read."""

    ts: Turnstile
    session: dict
    home: Path
    work: Path
    word: str
    seen: int  # engine exchanges before the run
    requests: int  # requests the engine had received before the run


def _start(ts: Turnstile, engine: tuple, tmp_path: Path, harness: str, script: Script) -> Run:
    fake, policy = engine
    policy.script = script
    session = ts.session(harness=harness)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    word = "w" + secrets.token_hex(6)
    (work / "note.txt").write_text(word + "\n")
    return Run(ts, session, home, work, word, len(fake.model.exchanges), len(fake.rec.requests))


def _env(run: Run, **extra: str) -> dict[str, str]:
    """A clean user environment: a fresh home, nothing of this machine's credentials."""
    keep = ("PATH", "LANG", "TERM", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "HOME": str(run.home), **extra}


def _check(run: Run, engine: tuple, harness: str, dialect: str, streamed: bool) -> dict:
    """Every engine call recorded and equal to the wire; the tool's output seen by the policy;
    the chaining tallied (one ``HARNESS`` line)."""
    fake, _ = engine
    exchanges = fake.model.exchanges[run.seen :]
    sid = run.session["id"]
    calls = run.ts.get(f"/v1/sessions/{sid}/calls")["data"]
    per_call = run.ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
    assert len(calls) == len(exchanges) == len(per_call), (len(calls), len(exchanges))
    assert all(c["status"] == "ok" for c in calls), [c.get("error") for c in calls]
    assert {c["dialect"] for c in calls} == {dialect}
    # the wire, token for token: each call's prompt and completion as the engine had them
    wire = sorted(p + s for p, s in exchanges)
    assert sorted(t["token_ids"] for t in per_call) == wire
    # the loss mask: 0 on exactly the prompt the engine received, 1 on exactly what it sampled
    split = {tuple(p + s): (len(p), len(s)) for p, s in exchanges}
    for t in per_call:
        prompt, sampled = split[tuple(t["token_ids"])]
        assert prompt and sampled, (prompt, sampled)
        assert t["loss_mask"] == [0] * prompt + [1] * sampled, (t["id"], prompt, sampled)
    # streamed or not, as the harness chose it: in the request bodies Turnstile kept, and in
    # what the engine received (Turnstile streams from it exactly when its harness streams)
    if dialect != "gemini":  # Gemini's stream choice is its path (:streamGenerateContent)
        assert {bool(b.get("stream")) for b in _bodies(run)} == {streamed}
    engine_calls = [
        r.body for r in fake.rec.requests[run.requests :] if r.path == "/inference/v1/generate"
    ]
    assert len(engine_calls) == len(exchanges)
    assert {bool(b.get("stream")) for b in engine_calls} == {streamed}
    # the harness ran the tool: its output is in a later prompt, which the script cannot know
    tok = load_tokenizer(str(testbed.smollm2_gguf()))
    assert any(run.word in tok.decode(p) for p, _ in exchanges), "no tool result reached it"
    chained = [c for c in calls if c["parent_id"] is not None]
    new = [c for c in calls if c["parent_id"] is None]
    assert all(c["segment_reason"] for c in new)
    out = {
        "harness": harness,
        "dialect": dialect,
        "calls": len(calls),
        "chained": len(chained),
        "new_segments": dict(collections.Counter(c["segment_reason"] for c in new)),
        "details": [c["segment_detail"] for c in new if c["segment_reason"] != "first_call"],
        "warnings": sorted({w for c in calls for w in c.get("warnings", [])}),
        "streamed": streamed,
    }
    print("\nHARNESS " + json.dumps(out))
    return out


def _bodies(run: Run) -> list[dict]:
    """The request bodies the harness sent, in the order they were recorded."""
    sid = run.session["id"]
    calls = run.ts.get(f"/v1/sessions/{sid}/calls")["data"]
    return [run.ts.get(f"/v1/sessions/{sid}/calls/{c['id']}/body")["request"] for c in calls]


def _run(cmd: list[str], run: Run, env: dict[str, str], timeout: float = 300) -> str:
    p = subprocess.run(
        cmd, cwd=run.work, env=env, capture_output=True, text=True, timeout=timeout, stdin=None
    )
    assert p.returncode == 0, (
        f"{cmd[0]} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    )
    return p.stdout


# ---- Claude Code -------------------------------------------------------------------------


def test_claude_code_runs_bash_through_turnstile(gateway, engine, node, tmp_path):
    script = Script(
        "Bash", {"command": "cat note.txt", "description": "Read the note"}, "Done reading."
    )
    run = _start(gateway, engine, tmp_path, "claude-code", script)
    env = _env(
        run,
        ANTHROPIC_BASE_URL=run.session["anthropic_base_url"],
        ANTHROPIC_API_KEY="sk-unused",
    )
    claude = str(node / "node_modules" / ".bin" / "claude")
    out = _run([claude, "-p", TASK, "--model", "smollm2"], run, env)
    assert "Done reading." in out
    t = _check(run, engine, "Claude Code", "messages", True)
    assert t["chained"] >= 1
    # its defaults, accepted as what they are: an edit that keeps everything, effort, thinking
    main = [b for b in _bodies(run) if b.get("tools")]
    assert main and all(b["context_management"]["edits"] for b in main)
    assert {b["thinking"]["type"] for b in main} == {"adaptive"}


# ---- Codex CLI ---------------------------------------------------------------------------


def test_codex_exec_runs_a_command_through_turnstile(gateway, engine, node, tmp_path):
    script = Script("exec_command", {"cmd": "cat note.txt"}, "Done reading.")
    run = _start(gateway, engine, tmp_path, "codex", script)
    env = _env(run, OPENAI_API_KEY="sk-unused")
    codex = str(node / "node_modules" / ".bin" / "codex")
    base = run.session["base_url"]
    cmd = [codex, "exec", "-c", f"openai_base_url={base}", "-m", "smollm2"]
    out = _run([*cmd, "--skip-git-repo-check", TASK], run, env)
    assert "Done reading." in out
    t = _check(run, engine, "Codex CLI", "responses", True)
    assert t["chained"] >= 1
    bodies = _bodies(run)
    assert all("client_metadata" in b for b in bodies)
    kinds = {t["type"] for b in bodies for t in b["tools"]}
    assert {"namespace", "web_search"} <= kinds  # flattened; left out with a warning
    assert any("'web_search' was left out" in w for w in t["warnings"])
    # its instructions are a developer message, which the Qwen2.5 template has no role for:
    # the policy saw them as a system message
    fake, _ = engine
    tok = load_tokenizer(str(testbed.smollm2_gguf()))
    first = tok.decode(fake.model.exchanges[run.seen][0])
    assert "<|im_start|>system\nYou are a coding agent running in the Codex CLI" in first


# ---- Qwen Code ---------------------------------------------------------------------------


def _qwen_env(run: Run, **extra: str) -> dict[str, str]:
    """What Qwen Code's docs (``configuration/auth.md``) tell a user to export for an
    OpenAI-compatible endpoint: a base URL, a key and a model name."""
    return _env(
        run,
        OPENAI_BASE_URL=run.session["base_url"],
        OPENAI_API_KEY="sk-unused",
        OPENAI_MODEL="smollm2",
        **extra,
    )


def _read_note(tmp_path: Path) -> Script:
    """Its read-only ``read_file`` (allowed without asking in ``-p`` mode), which takes an
    absolute path only: the note in the run's scratch directory (``_start`` makes it)."""
    path = str(tmp_path / "work" / "note.txt")
    return Script("read_file", {"file_path": path}, "Done reading.")


def test_qwen_code_reads_a_file_through_turnstile(gateway, engine, node, tmp_path):
    run = _start(gateway, engine, tmp_path, "qwen-code", _read_note(tmp_path))
    out = _run([str(node / "node_modules" / ".bin" / "qwen"), "-p", TASK], run, _qwen_env(run))
    assert "Done reading." in out
    t = _check(run, engine, "Qwen Code", "chat", True)
    assert t["chained"] >= 1


@pytest.fixture
def keepalive_gateway(engine: tuple, smollm2: Path, tmp_path: Path, request) -> Iterator:
    """``turnstile serve --keepalive N`` in front of the same scripted engine."""
    fake, _ = engine
    extra = ("--engine", "vllm", "--chat-template", str(testbed.templates_dir() / QWEN25))
    keepalive = ("--keepalive", str(request.param))
    ts = Turnstile(
        fake.url,
        smollm2,
        tmp_path / "data",
        tmp_path / "turnstile.log",
        (*extra, *keepalive, "--keep-bodies"),
    )
    ts.start()
    yield ts
    ts.stop()


@pytest.mark.parametrize("keepalive_gateway", [1, 0], indirect=True)
def test_qwen_code_waits_out_a_long_prefill_on_keepalive_chunks(
    keepalive_gateway, engine, node, tmp_path, request
):
    """Qwen Code ends a stream silent for ``QWEN_STREAM_IDLE_TIMEOUT_MS`` (240 s by default,
    3 s here) and sends the call again; a prefill longer than that (5 s of silence before each
    first token) is waited out on Turnstile's keep-alive chunks (``--keepalive 1``): one engine
    exchange per call, none aborted. The control, ``--keepalive 0``: it leaves, resends the
    same prompt, and gives up."""
    run = _start(keepalive_gateway, engine, tmp_path, "qwen-code", _read_note(tmp_path))
    fake, _ = engine
    qwen = str(node / "node_modules" / ".bin" / "qwen")
    env = _qwen_env(run, QWEN_STREAM_IDLE_TIMEOUT_MS="3000")
    with first_token_delay(fake, 5.0):
        p = subprocess.run(
            [qwen, "-p", TASK], cwd=run.work, env=env, capture_output=True, text=True, timeout=300
        )
    if request.node.callspec.params["keepalive_gateway"]:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "Done reading." in p.stdout
        t = _check(run, engine, "Qwen Code (5 s prefill)", "chat", True)
        assert t["chained"] >= 1
        return
    assert p.returncode != 0 and "No stream activity for 3000ms" in p.stdout + p.stderr
    # each try reached the engine with the same prompt, and each was abandoned mid-prefill
    prompts = [prompt for prompt, _ in fake.model.exchanges[run.seen :]]
    assert len(prompts) >= 2 and len(set(map(tuple, prompts))) == 1, len(prompts)
    calls = run.ts.get(f"/v1/sessions/{run.session['id']}/calls")["data"]
    assert [c["status"] for c in calls] == ["aborted"] * len(prompts)


# ---- the AI SDK --------------------------------------------------------------------------

AI_SDK = Path(__file__).parent / "agents" / "ai_sdk.mjs"


@pytest.mark.parametrize(
    "kind, mode, dialect",
    [
        ("chat", "generate", "chat"),
        ("responses", "generate", "responses"),  # default store: item_reference on turn 2
        ("anthropic", "stream", "messages"),
    ],
)
def test_ai_sdk_agent_runs_its_tool_through_turnstile(
    gateway, engine, node, tmp_path, kind, mode, dialect
):
    script = Script("read_note", {"path": "note.txt"}, "Done reading.")
    run = _start(gateway, engine, tmp_path, f"ai-sdk-{kind}", script)
    (run.work / "node_modules").symlink_to(node / "node_modules")
    (run.work / "run.mjs").write_text(AI_SDK.read_text())
    base = (
        run.session["anthropic_base_url"] + "/v1"
        if kind == "anthropic"
        else run.session["base_url"]
    )
    out = _run(["node", "run.mjs", kind, mode], run, _env(run, BASE_URL=base))
    answer = json.loads(out.strip().splitlines()[-1])
    assert answer == [{"text": "Done reading.", "steps": 2}, {"text": "Done reading.", "steps": 1}]
    label = {
        "chat": "openai.chat",
        "responses": "openai.responses",
        "anthropic": "@ai-sdk/anthropic",
    }
    t = _check(run, engine, f"AI SDK {label[kind]}", dialect, mode == "stream")
    assert (t["calls"], t["chained"], t["new_segments"]) == (3, 2, {"first_call": 1})
    if kind == "responses":  # the default store: turn 2 names turn 1's items by reference
        kinds = [i.get("type") for i in _bodies(run)[2]["input"]]
        assert "item_reference" in kinds, kinds


def test_a_websocket_upgrade_is_refused_with_426(gateway):
    """Codex asks for the Responses API over a WebSocket first: a 426 sends it to HTTP at once
    (a close or a 404 costs it five retries with backoff, ~6 s of every run)."""
    headers = {
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    r = httpx.get(gateway.url + "/s/anything/v1/responses", headers=headers, timeout=10)
    assert r.status_code == 426 and r.json()["error"]["code"] == "websocket_not_supported"


# ---- Pi ----------------------------------------------------------------------------------


def _pi_models(run: Run, api: str, base: str) -> None:
    """What Pi's docs (``docs/models.md``) tell a user to write for a self-hosted model: a
    provider in ``~/.pi/agent/models.json`` with its base URL, API and key, and the model's id."""
    agent = run.home / ".pi" / "agent"
    agent.mkdir(parents=True)
    provider = {"baseUrl": base, "api": api, "apiKey": "sk-unused", "models": [{"id": "smollm2"}]}
    (agent / "models.json").write_text(json.dumps({"providers": {"turnstile": provider}}))


@pytest.mark.parametrize(
    "api, dialect", [("openai-completions", "chat"), ("anthropic-messages", "messages")]
)
def test_pi_reads_a_file_through_turnstile(gateway, engine, node, tmp_path, api, dialect):
    """Pi (``pi -p``) with its ``read`` tool, through each API its custom providers speak."""
    script = Script("read", {"path": "note.txt"}, "Done reading.")
    run = _start(gateway, engine, tmp_path, f"pi-{api}", script)
    base = run.session["base_url" if dialect == "chat" else "anthropic_base_url"]
    _pi_models(run, api, base)
    pi = str(node / "node_modules" / ".bin" / "pi")
    out = _run([pi, "-p", "--provider", "turnstile", "--model", "smollm2", TASK], run, _env(run))
    assert "Done reading." in out
    t = _check(run, engine, f"Pi ({api})", dialect, True)
    assert t["chained"] >= 1


# ---- opencode ----------------------------------------------------------------------------


def _opencode_config(run: Run, npm: str, base: str) -> None:
    """What opencode's docs (providers, "Custom provider") tell a user to write: a provider in
    the project's ``opencode.json`` naming its AI SDK package, base URL and key, and the model."""
    provider = {
        "npm": npm,
        "name": "Turnstile",
        "options": {"baseURL": base, "apiKey": "sk-unused"},
        "models": {"smollm2": {"name": "SmolLM2"}},
    }
    config = {"$schema": "https://opencode.ai/config.json", "provider": {"turnstile": provider}}
    (run.work / "opencode.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "npm, dialect", [("@ai-sdk/openai-compatible", "chat"), ("@ai-sdk/anthropic", "messages")]
)
def test_opencode_reads_a_file_through_turnstile(gateway, engine, node, tmp_path, npm, dialect):
    """opencode (``opencode run``) with its ``read`` tool (an absolute path); its title
    request (its own system prompt, no tools) is a call of the session too."""
    path = str(tmp_path / "work" / "note.txt")
    script = Script("read", {"filePath": path}, "Done reading.")
    run = _start(gateway, engine, tmp_path, f"opencode-{dialect}", script)
    base = run.session["base_url"] if dialect == "chat" else run.session["anthropic_base_url"]
    _opencode_config(run, npm, base if dialect == "chat" else base + "/v1")
    opencode = str(node / "node_modules" / ".bin" / "opencode")
    # no models.dev catalogue fetch (no network in the suite); nothing else is changed
    env = _env(run, OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1")
    out = _run([opencode, "run", "-m", "turnstile/smollm2", TASK], run, env)
    assert "Done reading." in out
    t = _check(run, engine, f"opencode ({npm})", dialect, True)
    assert t["chained"] >= 1
