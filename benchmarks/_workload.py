"""The workload the benchmarks send: an agent's request (system prompt, issue, three tools, a
pytest tool result) and the engine's reply, a thought and a Hermes tool call of exactly
``n_tokens`` Qwen2 tokens (``reply_spec``), which the fake engine sends back."""

from __future__ import annotations

import json
from pathlib import Path

import orjson

IM_END = 151645  # <|im_end|> in the Qwen2 vocabulary
QWEN25 = "Qwen-Qwen2.5-7B-Instruct"
MODEL_NAME = "bench"


def tiny_qwen2() -> Path:
    """Random weights on the real Qwen2 vocabulary with the real Qwen2.5 template: the
    tokenizer and template Turnstile loads (the fake engine does the 'generating')."""
    import turnstile_testbed as testbed

    return testbed.tiny_model("qwen2", QWEN25)


SYSTEM = (
    "You are a software engineering agent working in a sandboxed Linux container. The "
    "repository under /repo is checked out at the commit where an issue was reported. Your job "
    "is to reproduce the issue, find its cause, fix it with the smallest correct change, and "
    "verify the fix by running the relevant tests. Work step by step: each of your replies "
    "either calls exactly one tool or, when you are done, calls submit. Think briefly before "
    "each tool call and say what you expect to learn from it.\n\n"
    "Rules:\n"
    "1. Never modify tests unless the issue is in the tests themselves.\n"
    "2. Prefer reading code over guessing; open the file around the lines you need.\n"
    "3. Keep commands non-interactive; pipe long output through head or tail.\n"
    "4. When a command fails, read the error before trying something else.\n"
    "5. Do not install packages; everything the project needs is present.\n"
    "6. Stop and submit when the tests that reproduce the issue pass and nothing else broke.\n"
)
USER = (
    "<issue>\nParsing a config file with a trailing comment after a quoted value raises "
    "ValueError('unterminated string') since 2.3.0. Example:\n\n    name = \"x\"  # comment\n\n"
    "Expected: name == 'x'. Traceback points at parser.py:212 in _read_value. The bug was "
    "probably introduced with the escape handling rewrite. Please fix it and add a regression "
    "test if none covers this case.\n</issue>\n\nThe repository is at /repo. Begin by looking "
    "at the code."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the container and return its "
            "combined stdout and stderr (truncated to 10 000 characters). The working directory "
            "persists between calls; environment variables do not.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "description": "The command line to run with bash -lc.",
                    }
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files. `view` "
            "shows a file with line numbers or lists a directory; `create` writes a new file; "
            "`str_replace` replaces one exact, unique occurrence of old_str with new_str; `insert` "
            "adds text after a line.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "enum": ["view", "create", "str_replace", "insert"],
                    },
                    "path": {"type": "string", "description": "Absolute path of the file."},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer"},
                    "view_range": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the task. Call this once the fix is in place and verified.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
TOOL_OUTPUT = (
    "============================= test session starts ==============================\n"
    "collected 14 items\n\ntests/test_parser.py ......F.......                     [100%]\n\n"
    "=================================== FAILURES ===================================\n"
    "___________________________ test_trailing_comment ____________________________\n"
    "    def test_trailing_comment():\n>       assert parse('name = \"x\"  # c')['name'] == 'x'\n"
    "E       ValueError: unterminated string at line 1, column 8\n"
    "src/confparse/parser.py:212: ValueError\n1 failed, 13 passed in 0.21s\n"
)
THOUGHT = "I'll run the parser tests first to reproduce the failure and see the traceback."
MORE = (
    "Then I will open parser.py around line 212 and read _read_value closely to find where "
    "the comment handling after a closing quote goes wrong in the new escape code."
).split()


def reply_text(words: int) -> tuple[str, str, dict]:
    thought = " ".join([THOUGHT, *(MORE[i % len(MORE)] for i in range(words))])
    call = {
        "name": "bash",
        "arguments": {
            "command": "cd /repo && python -m pytest tests/test_parser.py -x -q 2>&1 | tail -n 20"
        },
    }
    return f"{thought}\n<tool_call>\n{json.dumps(call)}\n</tool_call>", thought, call


def reply_spec(n_tokens: int = 64) -> dict:
    """The fake engine's reply: a thought and a Hermes tool call, exactly ``n_tokens`` tokens
    (the last is ``<|im_end|>``), tokenized with the Qwen2 tokenizer Turnstile uses."""
    from turnstile.chat.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_qwen2()))
    for words in range(n_tokens + 1):  # past MORE's end its words come round again
        text, thought, call = reply_text(words)
        ids = tok.encode(text)
        if len(ids) >= n_tokens - 1:
            break
    # Cut the thought at a token boundary so that the reply has exactly n_tokens - 1 tokens.
    head = tok.encode(thought)
    tail = tok.encode(text[len(thought) :])
    head = head[: max(1, n_tokens - 1 - len(tail))]
    thought = tok.decode(head)
    text = thought + text[len(text) - len(tok.decode(tail)) :]
    ids = [*head, *tail][: n_tokens - 1]
    ids = [*ids, IM_END]
    return {
        "token_ids": ids,
        "logprobs": [round(-0.05 - (i % 7) * 0.11, 4) for i in range(len(ids))],
        "text": tok.decode(ids[:-1]),
        "pieces": [tok.decode([t]) for t in ids[:-1]],
        "thought": thought.strip(),
        "tool_call": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
    }


def base_messages(pad_to: int | None = None) -> list[dict]:
    system = SYSTEM
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": USER}]
    if pad_to:
        size = len(orjson.dumps({"messages": msgs, "tools": TOOLS}))
        if size < pad_to:
            extra = (
                "Notes on the repository layout: source code lives in src/, tests in "
                "tests/, documentation in docs/. "
            )
            add = (extra * (1 + (pad_to - size) // len(extra)))[: pad_to - size]
            msgs[0] = {"role": "system", "content": system + "\n" + add}
    return msgs


def tool_result(call_id: str, turn: int) -> dict:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": TOOL_OUTPUT.replace("0.21s", f"0.{21 + turn}s"),
    }


def echo(message: dict) -> dict:
    """The assistant message as a harness appends it to its history."""
    return {
        "role": "assistant",
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls"),
    }
