"""Context overflow through Turnstile, per coding CLI (issue 45).

Each CLI runs on its defaults (as ``tests/test_coding_agents.py`` runs it) in front of the
scripted engine with a small context: its first prompt fits, its tool then reads a file
longer than what is left, so its next request is past the model's context. Turnstile answers
it in the CLI's provider's shape and words (``Dialect.error``: Anthropic's "prompt is too
long: N tokens > M maximum", the Responses API's ``context_length_exceeded`` on ``input``,
OpenAI Chat's "maximum context length", Google's "The input token count (N) exceeds the
maximum number of tokens allowed (M).") before the engine sees it. What the CLI then does is
its own (read from its shipped JS, docs/harnesses/*.md):

- Claude Code (``claude -p``) and Qwen Code (``qwen -p``) compact reactively on that error:
  a summary request, then the agent's request rebuilt on the summary, a rewrite of the
  recorded conversation (its history replaced by the summary): a new segment,
  ``history_diverged``. Each goes through a recording relay (``Front``): the 400 it was told.
- Codex (``codex exec``) and gemini-cli (``gemini -p``) compact only before a request, on
  their own token count against the model's window (unknown for ``smollm2``: Codex has none,
  gemini-cli assumes 1,048,576), never on the API's error: they report the overflow in their
  own words ("Codex ran out of room in the model's context window", gemini-cli's API error)
  and end the run; checked here that they read Turnstile's answer as their provider's.

The policy is scripted (``Overflow``): tool calls that read the files in turn, a marked
summary for a request that asks for one (or has no tools), and the answer once the summary
(or every file) is in the prompt. ~28 s for the four runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Turnstile

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.testing.relay import Exchange, start_relay
from turnstile.testing.scripted import scripted_vllm

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
TASK = "Read the file big.txt in this directory and tell me the last word in it."
SUMMARY = "SUMMARY-OF-THE-RUN: big.txt was read."
# what each CLI's compaction request asks (its own words): Claude Code's, Qwen Code's
ASKS_SUMMARY = ("create a detailed summary of", "produce the <state_snapshot> XML")
ANSWER = "Done after compaction."


@dataclass
class Overflow:
    """Reads the files in ``reads`` in turn, each with ``tool`` and its arguments (each file's
    text starts with its own name: the policy knows what it has read); summarises when asked
    (the last user turn asks for a summary, or no tools are offered: a title or summary
    request); answers once a summary, or every file, is in the prompt."""

    tool: str
    reads: list[tuple[str, dict]]  # (file name, the tool's arguments)

    def reply(self, prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "<tools>" not in prompt or any(a in last_user for a in ASKS_SUMMARY):
            # in the tags each CLI's parser looks for (Qwen Code drops a summary without
            # a closed <state_snapshot>)
            return f"<summary><state_snapshot>{SUMMARY}</state_snapshot></summary>"
        if SUMMARY in prompt:
            return ANSWER
        for name, arguments in self.reads:
            if _head(name) not in prompt:
                call = json.dumps({"name": self.tool, "arguments": arguments})
                return f"<tool_call>\n{call}\n</tool_call>"
        return ANSWER


def _head(name: str) -> str:
    return name.replace(".", "-") + "-begins"


class Front:
    """The suite's recording relay (``turnstile.testing.relay``) between the CLI and Turnstile:
    forwards each request as it came and each answer as Turnstile sent it (streams line by
    line), keeping every answer's status and body: what the CLI was told, not Turnstile's
    account of it."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.relay, self.server = start_relay(upstream)
        self.url = self.relay.url

    @property
    def answers(self) -> list[Exchange]:
        return self.relay.exchanges

    def base(self, url: str) -> str:
        """A session URL of Turnstile's, through the relay."""
        return url.replace(self.upstream, self.url)

    def errors(self) -> list[Exchange]:
        return [a for a in self.answers if a.status >= 400]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Bed:
    ts: Turnstile
    fake: object
    session: dict
    work: Path
    home: Path
    context: int
    front: Front


@pytest.fixture(scope="module")
def node() -> Path:
    return testbed.node_harnesses()


@pytest.fixture
def bed(tmp_path: Path) -> Iterator:
    """A factory: the scripted engine with ``context`` tokens and Turnstile in front of it
    (one per test: Turnstile reads the engine's context when it starts), and the files the
    policy reads (``files``: name to lines of 25 words; ``@name`` in the tool's arguments is
    that file's absolute path)."""
    started: list = []

    def make(harness: str, context: int, tool: str, reads: list, files: dict) -> Bed:
        smollm2 = testbed.smollm2_gguf()
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        for name, n in files.items():
            stem = name.split(".")[0]
            lines = (" ".join(f"{stem}{i}x{j}" for j in range(25)) for i in range(n))
            (work / name).write_text(_head(name) + "\n" + "\n".join(lines) + "\n")
        paths = {f"@{name}": str(work / name) for name in files}
        planned = [
            (name, {k: paths.get(v, v) for k, v in arguments.items()}) for name, arguments in reads
        ]
        policy = Overflow(tool, planned)
        fake = scripted_vllm(load_tokenizer(str(smollm2)), policy.reply, "<|im_end|>")
        fake.max_model_len = context
        fake.__enter__()
        started.append(fake)
        extra = ("--engine", "vllm", "--chat-template", str(testbed.templates_dir() / QWEN25))
        ts = Turnstile(fake.url, smollm2, tmp_path / "data", tmp_path / "ts.log", extra)
        ts.start()
        started.append(ts)
        front = Front(ts.url)
        started.append(front)
        session = {
            k: front.base(v) if isinstance(v, str) else v
            for k, v in ts.session(harness=harness).items()
        }
        return Bed(ts, fake, session, work, home, context, front)

    yield make
    for thing in reversed(started):
        if isinstance(thing, Turnstile):
            thing.stop()
        elif isinstance(thing, Front):
            thing.close()
        else:
            thing.__exit__(None, None, None)


def _env(bed: Bed, **extra: str) -> dict[str, str]:
    keep = ("PATH", "LANG", "TERM", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "HOME": str(bed.home), **extra}


def _run(cmd: list[str], bed: Bed, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=bed.work, env=env, capture_output=True, text=True, timeout=240)


def _records(bed: Bed) -> tuple[list[dict], list[str]]:
    """Every engine call recorded, ok, equal to the wire token for token and inside the
    context (the overflowing requests reached no engine); the prompts' text, in order."""
    sid = bed.session["id"]
    calls = bed.ts.get(f"/v1/sessions/{sid}/calls")["data"]
    per_call = bed.ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
    exchanges = bed.fake.model.exchanges
    assert len(calls) == len(exchanges) == len(per_call), (len(calls), len(exchanges))
    assert all(c["status"] == "ok" for c in calls), [c.get("error") for c in calls]
    assert sorted(t["token_ids"] for t in per_call) == sorted(p + s for p, s in exchanges)
    assert all(len(p) + len(s) <= bed.context for p, s in exchanges)
    tok = load_tokenizer(str(testbed.smollm2_gguf()))
    return calls, [tok.decode(p) for p, _ in exchanges]


def _overflows(bed: Bed, path: str) -> list[dict]:
    """The error answers the CLI got (through the relay): each one an overflow on ``path``."""
    errors = [e for e in bed.front.errors() if e.method == "POST"]  # not Codex's WebSocket try
    assert errors and all(e.status == 400 and e.path.endswith(path) for e in errors), [
        (e.method, e.path, e.status, e.response) for e in bed.front.answers
    ]
    return [e.response for e in errors]


def _compacted(calls: list[dict], texts: list[str], asks: str, gone: str) -> None:
    """The CLI's compaction request (its own words in the last user turn) reached the engine
    and was recorded; the agent's next request holds the summary instead of the history (the
    file ``gone`` read in it) and starts a new segment: a rewrite of the recorded conversation."""
    [summary] = [i for i, t in enumerate(texts) if asks in t.rsplit("<|im_start|>user", 1)[-1]]
    [after] = [i for i, t in enumerate(texts) if SUMMARY in t]
    assert summary < after == len(texts) - 1
    assert "<tools>" in texts[after] and _head(gone) in texts[summary]
    assert _head(gone) not in texts[after]
    assert calls[after]["parent_id"] is None
    assert calls[after]["segment_reason"] == "history_diverged", calls[after]
    assert calls[0]["segment_reason"] == "first_call"


def test_claude_code_compacts_on_an_overflow(bed, node):
    """Claude Code 2.1.332 compacts reactively on Anthropic's "prompt is too long: N tokens >
    M maximum" (its ``nyo``/``g7e`` test the words; ``Iho`` runs the compaction), in ``-p``
    too, once the conversation holds two rounds (``Pho``: fewer "cannot be compacted"). Two
    ``cat``s of ~7k tokens each through its ``Bash`` tool: the second overflows."""
    files = ("a.txt", "b.txt")
    reads = [(f, {"command": f"cat {f}", "description": "Read it"}) for f in files]
    b = bed("claude-code", 25000, "Bash", reads, {f: 50 for f in files})
    env = _env(b, ANTHROPIC_BASE_URL=b.session["anthropic_base_url"], ANTHROPIC_API_KEY="sk-unused")
    p = _run(
        [str(node / "node_modules" / ".bin" / "claude"), "-p", TASK, "--model", "smollm2"], b, env
    )
    assert p.returncode == 0 and ANSWER in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    [error] = _overflows(b, "/v1/messages?beta=true")
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    said = re.fullmatch(
        r"prompt is too long: (\d+) tokens > (\d+) maximum", error["error"]["message"]
    )
    assert said and int(said[1]) > int(said[2]) == b.context, error
    calls, texts = _records(b)
    _compacted(calls, texts, "create a detailed summary of", "a.txt")


def test_qwen_code_compacts_on_an_overflow(bed, node):
    """Qwen Code 0.24.4 compacts reactively on an error its ``CONTEXT_LENGTH_PATTERNS`` match
    (OpenAI's "maximum context length", ``context_length_exceeded``), in ``-p`` too
    (``reactiveCompressionAttempted`` in its chat loop), then re-sends on its summary (the
    read file listed, not restored: over its 5,000-token restore cap)."""
    b = bed(
        "qwen-code", 26000, "read_file", [("big.txt", {"file_path": "@big.txt"})], {"big.txt": 160}
    )
    env = _env(
        b, OPENAI_BASE_URL=b.session["base_url"], OPENAI_API_KEY="sk-unused", OPENAI_MODEL="smollm2"
    )
    p = _run([str(node / "node_modules" / ".bin" / "qwen"), "-p", TASK], b, env)
    assert p.returncode == 0 and ANSWER in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    for error in _overflows(b, "/v1/chat/completions"):
        body = error["error"]
        assert (body["code"], body["param"], body["type"]) == (
            "context_length_exceeded",
            "messages",
            "invalid_request_error",
        )
        assert body["message"].startswith(
            f"This model's maximum context length is {b.context} tokens."
        )
    calls, texts = _records(b)
    _compacted(calls, texts, "produce the <state_snapshot> XML", "big.txt")


def test_codex_reports_an_overflow(bed, node):
    """Codex 0.171.0 compacts before a turn on its own count against the model's window
    (none known for ``smollm2``), never on the API's error: ``context_length_exceeded`` is
    its ``ContextWindowExceeded``, which ends ``codex exec`` with "Codex ran out of room in
    the model's context window" and no further request."""
    b = bed("codex", 12000, "exec_command", [("big.txt", {"cmd": "cat big.txt"})], {"big.txt": 60})
    env = _env(b, OPENAI_API_KEY="sk-unused")
    codex = str(node / "node_modules" / ".bin" / "codex")
    cmd = [codex, "exec", "-c", f"openai_base_url={b.session['base_url']}", "-m", "smollm2"]
    p = _run([*cmd, "--skip-git-repo-check", TASK], b, env)
    assert p.returncode != 0
    assert "Codex ran out of room in the model's context window" in p.stderr, p.stderr[-2000:]
    [error] = _overflows(b, "/v1/responses")
    assert (error["error"]["code"], error["error"]["param"]) == ("context_length_exceeded", "input")
    assert b.front.answers[-1].status == 400  # nothing sent after it
    calls, texts = _records(b)
    assert len(calls) == 1 and calls[0]["segment_reason"] == "first_call"


def test_gemini_cli_reports_an_overflow(bed, node):
    """gemini-cli 0.61.0 compresses only before a turn, on its own count against
    ``tokenLimit(model)`` (1,048,576 for a model it does not know) and never on the API's
    error: Google's 400 ``INVALID_ARGUMENT`` "The input token count (N) exceeds the maximum
    number of tokens allowed (M)." ends ``gemini -p`` with that error, nothing sent after it."""
    b = bed(
        "gemini-cli", 12000, "read_file", [("big.txt", {"file_path": "@big.txt"})], {"big.txt": 60}
    )
    settings = b.home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    env = _env(
        b,
        GEMINI_API_KEY="unused",
        GOOGLE_GEMINI_BASE_URL=b.session["anthropic_base_url"],
        GEMINI_CLI_TRUST_WORKSPACE="true",
    )
    p = _run([str(node / "node_modules" / ".bin" / "gemini"), "-p", TASK, "-m", "smollm2"], b, env)
    assert p.returncode != 0
    [error] = _overflows(b, "/v1beta/models/smollm2:streamGenerateContent?alt=sse")
    body = error["error"]
    assert (body["code"], body["status"]) == (400, "INVALID_ARGUMENT")
    said = re.fullmatch(
        r"The input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)\.",
        body["message"],
    )
    assert said and int(said[1]) > int(said[2]) == b.context, body
    assert body["message"] in p.stderr
    assert b.front.answers[-1].status == 400
    calls, texts = _records(b)
    assert len(calls) == 1 and calls[0]["segment_reason"] == "first_call"
