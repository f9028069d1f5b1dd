"""opencode compacts on a context overflow through Turnstile (issue 45): a prompt past the
model's context gets the dialect's overflow error, worded as the provider words it; opencode
reads it as a ``ContextOverflowError`` (its own list of providers' wordings), compacts the
conversation (a summary request) and goes on; the call after the compaction shares no prefix
with the overflowing conversation, so it starts a new segment with its reason.

The scripted engine (SmolLM2's tokenizer) has a context a few thousand tokens past opencode's
first prompt; its ``read`` tool reads a file longer than what is left, so the next call
overflows. The policy answers a summary request (no tools offered) with a marked summary and,
once the summary is in a prompt, the final answer. opencode 1.18.33 then prints the answer
and still exits 1 (``opencode run`` reports the overflow it recovered from)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Turnstile

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer
from turnstile.testing.scripted import scripted_vllm

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
TASK = "Read the file big.txt in this directory and tell me the last word in it."
SUMMARY = "SUMMARY-OF-THE-RUN: big.txt was read."
CONTEXT = int(os.environ.get("H7_CONTEXT", "9000"))


class Policy:
    def __init__(self, path: str) -> None:
        self.path = path

    def reply(self, prompt: str) -> str:
        if "<tools>" not in prompt:
            return SUMMARY  # the title request's answer too: opencode takes any short text
        if SUMMARY in prompt or "<tool_response>" in prompt:
            return "Done after compaction."
        call = json.dumps({"name": "read", "arguments": {"filePath": self.path}})
        return f"<tool_call>\n{call}\n</tool_call>"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple]:
    smollm2 = testbed.smollm2_gguf()
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    lines = (" ".join(f"word{i}x{j}" for j in range(25)) for i in range(40))
    (work / "big.txt").write_text("\n".join(lines) + "\n")
    policy = Policy(str(work / "big.txt"))
    fake = scripted_vllm(load_tokenizer(str(smollm2)), policy.reply, "<|im_end|>")
    fake.max_model_len = CONTEXT
    with fake:
        extra = ("--engine", "vllm", "--chat-template", str(testbed.templates_dir() / QWEN25))
        ts = Turnstile(fake.url, smollm2, tmp_path / "data", tmp_path / "ts.log", extra)
        ts.start()
        try:
            yield ts, fake, work, home
        finally:
            ts.stop()


def test_opencode_compacts_on_an_overflow_through_turnstile(setup):
    ts, fake, work, home = setup
    session = ts.session(harness="opencode")
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "options": {"baseURL": session["base_url"], "apiKey": "sk-unused"},
        "models": {"smollm2": {}},
    }
    (work / "opencode.json").write_text(json.dumps({"provider": {"turnstile": provider}}))
    node = testbed.node_harnesses()
    env = {k: os.environ[k] for k in ("PATH", "LANG", "TERM", "TMPDIR") if k in os.environ}
    env.update(HOME=str(home), OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1")
    opencode = str(node / "node_modules" / ".bin" / "opencode")
    p = subprocess.run(
        [opencode, "run", "-m", "turnstile/smollm2", TASK],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = p.stdout + p.stderr
    # the overflow, in the Chat dialect's words (OpenAI's), which opencode's list matches
    assert f"maximum context length is {CONTEXT} tokens" in said, said[-3000:]
    # it compacted and went on to the answer (it still exits 1: it reports the overflow)
    assert "Done after compaction." in p.stdout, said[-3000:]
    tok = load_tokenizer(str(testbed.smollm2_gguf()))
    exchanges = fake.model.exchanges
    sid = session["id"]
    calls = ts.get(f"/v1/sessions/{sid}/calls")["data"]
    per_call = ts.get(f"/v1/sessions/{sid}/trajectories?mode=per_call")["data"]
    # every engine call recorded, equal to the wire; the overflowing request reached none
    assert len(calls) == len(exchanges) == len(per_call) == 4, [len(p) for p, _ in exchanges]
    assert all(c["status"] == "ok" for c in calls)
    assert sorted(t["token_ids"] for t in per_call) == sorted(p + s for p, s in exchanges)
    assert all(len(p) + len(s) <= CONTEXT for p, s in exchanges)
    texts = [tok.decode(p) for p, _ in exchanges]
    # the summary request: no tools, the task in it; then the agent with the summary instead
    # of its history (the file's last word gone), and the answer
    untooled = sorted((t for t in texts if "<tools>" not in t), key=len)
    assert len(untooled) == 2  # the title request, then the summary request (the longer)
    summary = untooled[-1]
    assert TASK in summary and "The previous request" not in summary
    [after] = [t for t in texts if SUMMARY in t and "<tools>" in t]
    assert texts.index(summary) < texts.index(after) and "word39x24" not in after
    # the two sequential calls after the overflow: the summary a lineage of its own, the
    # agent's next call a rewrite of its recorded conversation, a new segment with that reason
    reasons = [c["segment_reason"] for c in calls]
    assert sorted(reasons[:2]) == ["first_call", "new_conversation"]  # title, agent
    assert reasons[2:] == ["new_conversation", "history_diverged"], reasons
    assert all(c["parent_id"] is None for c in calls[2:])
