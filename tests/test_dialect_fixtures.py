"""Requests shaped like coding-agent traffic, in the Responses and Anthropic Messages dialects:
large tool schemas, parallel tool calls, reasoning/thinking echoed back, a tool result marked as
an error. Each is sent as the first call of a session (a full render) to Turnstile serving the
Qwen3 template (it renders reasoning and tools) in front of llama-server; the prompt llama-server
received (recording relay) must equal the template's own full render — by transformers'
``render_jinja_template``, as vLLM builds it — of the conversation the request means, written
out by hand as Chat messages below."""

from __future__ import annotations

import copy

import httpx
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

import turnstile_testbed as testbed
from turnstile.chat.tokenizer import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QWEN3 = "Qwen-Qwen3-0.6B.jinja"


def _schema(n: int) -> dict:
    """A large tool schema: nested objects, arrays, enums, descriptions."""
    return {
        "type": "object",
        "required": ["path", "edits"],
        "properties": {
            "path": {"type": "string", "description": f"File to change ({n})."},
            "edits": {
                "type": "array",
                "description": "Edits, applied in order.",
                "items": {
                    "type": "object",
                    "required": ["old", "new"],
                    "properties": {
                        "old": {"type": "string", "description": "Exact text to replace."},
                        "new": {"type": "string", "description": "Replacement text."},
                        "occurrence": {"type": "integer", "minimum": 1},
                    },
                },
            },
            "mode": {"type": "string", "enum": ["strict", "fuzzy", "regex"]},
            "options": {
                "type": "object",
                "properties": {
                    f"flag_{i}": {"type": "boolean", "description": f"Option {i} of tool {n}."}
                    for i in range(12)
                },
            },
        },
    }


NAMES = ["apply_patch", "read_file", "run_shell", "search_code", "list_dir", "write_file"]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The agent's {name} tool.",
            "parameters": _schema(i),
        },
    }
    for i, name in enumerate(NAMES)
]
SYSTEM = "You are a coding agent. Work in /repo. Run the tests before you answer."
ARGS_A = {"path": "src/app.py", "edits": [{"old": "x = 1", "new": "x = 2"}], "mode": "strict"}
ARGS_B = {"path": "tests/test_app.py"}
THOUGHT = "The failing test reads x; patch app.py and read the test at the same time."

# The conversation both requests below mean, as Chat messages (arguments as objects, as vLLM
# hands them to the template).
EXPECTED = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Fix the failing test in tests/test_app.py."},
    {"role": "assistant", "content": "I will look at the test first."},
    {"role": "user", "content": "Go ahead."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": THOUGHT,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "apply_patch", "arguments": ARGS_A},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "read_file", "arguments": ARGS_B},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "error: old text not found"},
    {"role": "tool", "tool_call_id": "call_b", "content": "def test_x():\n    assert x == 2\n"},
]


def _responses_body() -> dict:
    import json

    return {
        "model": "t",
        "instructions": SYSTEM,
        "max_output_tokens": 1,
        "tools": [
            {
                "type": "function",
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "parameters": t["function"]["parameters"],
                "strict": False,
            }
            for t in CHAT_TOOLS
        ],
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Fix the failing test in tests/test_app.py."}
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "annotations": [],
                        "text": "I will look at the test first.",
                    }
                ],
            },
            {"role": "user", "content": "Go ahead."},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": THOUGHT}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_a",
                "name": "apply_patch",
                "arguments": json.dumps(ARGS_A),
                "status": "completed",
            },
            {
                "type": "function_call",
                "id": "fc_2",
                "call_id": "call_b",
                "name": "read_file",
                "arguments": json.dumps(ARGS_B),
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": "call_a",
                "output": "error: old text not found",
            },
            {
                "type": "function_call_output",
                "call_id": "call_b",
                "output": "def test_x():\n    assert x == 2\n",
            },
        ],
    }


def _messages_body() -> dict:
    return {
        "model": "t",
        "max_tokens": 1,
        "system": [{"type": "text", "text": SYSTEM}],
        "tools": [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in CHAT_TOOLS
        ],
        "messages": [
            {"role": "user", "content": "Fix the failing test in tests/test_app.py."},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "I will look at the test first."}],
            },
            {"role": "user", "content": [{"type": "text", "text": "Go ahead."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": THOUGHT, "signature": "sig"},
                    {"type": "tool_use", "id": "call_a", "name": "apply_patch", "input": ARGS_A},
                    {"type": "tool_use", "id": "call_b", "name": "read_file", "input": ARGS_B},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_a",
                        "is_error": True,
                        "content": [{"type": "text", "text": "error: old text not found"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_b",
                        "content": "def test_x():\n    assert x == 2\n",
                    },
                ],
            },
        ],
    }


@pytest.fixture
def qwen3_turnstile(relay, tiny_qwen2, turnstile_factory):
    template = testbed.templates_dir() / QWEN3
    return turnstile_factory(relay.url, tiny_qwen2, extra=("--chat-template", str(template)))


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_coding_agent_request_renders_as_the_template_does(
    qwen3_turnstile, relay, tiny_qwen2, dialect
):
    ts = qwen3_turnstile
    session = ts.session()
    if dialect == "responses":
        url, body = session["base_url"] + "/responses", _responses_body()
    else:
        url, body = session["anthropic_base_url"] + "/v1/messages", _messages_body()
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text

    source = (testbed.templates_dir() / QWEN3).read_text()
    expected = copy.deepcopy(EXPECTED)
    if dialect == "messages":
        expected[5]["is_error"] = True  # the flag reaches the template; Qwen3 ignores it
    rendered, _ = render_jinja_template(
        conversations=[expected], tools=CHAT_TOOLS, chat_template=source, add_generation_prompt=True
    )
    tok = load_tokenizer(str(tiny_qwen2))
    want = tok.encode(rendered[0])
    (ex,) = relay.completions()
    assert ex.request["prompt"] == want
    # the reasoning (after the last user turn, where Qwen3 keeps it), both calls and both
    # results reached the prompt
    text = tok.decode(ex.request["prompt"])
    assert THOUGHT in text and "old text not found" in text
    assert all(f'"name": "{n}", "arguments"' in text for n in ("apply_patch", "read_file"))
