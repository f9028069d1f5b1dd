"""An agent loop as a user writes it with each official Python SDK: one tool (``read_note``,
reading a file in the working directory), the model's calls run and answered until it answers
in text. Run by tests/test_python_sdks.py with the venv's pinned SDKs, and by the release
canary (benchmarks/release_canary.py) with the newest releases in a scratch venv.

    python python_sdks.py KIND   # KIND: openai-chat, openai-responses, anthropic, genai

``BASE_URL`` is the session's base URL (``anthropic_base_url`` for anthropic and genai). It
prints one JSON line: the answer's text and the model calls it took; warnings the SDK raised
(``warnings`` module) go to stderr."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

DESCRIPTION = "Read a file in the working directory"
PARAMS = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "the file's name"}},
    "required": ["path"],
}
TASK = "Read the file note.txt in this directory and tell me the word in it."
MAX_STEPS = 4


def read_note(path: str) -> str:
    return Path(path).read_text()


def openai_chat(base: str) -> tuple[str, int]:
    import openai

    client = openai.OpenAI(base_url=base, api_key="sk-unused", max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {"name": "read_note", "description": DESCRIPTION, "parameters": PARAMS},
        }
    ]
    messages: list = [{"role": "user", "content": TASK}]
    for step in range(1, MAX_STEPS + 1):
        stream = client.chat.completions.create(
            model="smollm2", messages=messages, tools=tools, stream=True
        )
        text, calls = "", {}
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for tc in delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.id or ""
                c["name"] += (tc.function and tc.function.name) or ""
                c["arguments"] += (tc.function and tc.function.arguments) or ""
        if not calls:
            return text, step
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            out = read_note(**json.loads(c["arguments"]))
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    raise SystemExit("no answer")


def openai_responses(base: str) -> tuple[str, int]:
    import openai

    client = openai.OpenAI(base_url=base, api_key="sk-unused", max_retries=0)
    tools = [
        {"type": "function", "name": "read_note", "description": DESCRIPTION, "parameters": PARAMS}
    ]
    items: list = [{"role": "user", "content": TASK}]
    for step in range(1, MAX_STEPS + 1):
        r = client.responses.create(model="smollm2", input=items, tools=tools)
        calls = [i for i in r.output if i.type == "function_call"]
        if not calls:
            return r.output_text, step
        items += r.output
        for c in calls:
            out = read_note(**json.loads(c.arguments))
            items.append({"type": "function_call_output", "call_id": c.call_id, "output": out})
    raise SystemExit("no answer")


def anthropic_messages(base: str) -> tuple[str, int]:
    import anthropic

    client = anthropic.Anthropic(base_url=base, api_key="sk-unused", max_retries=0)
    tools = [{"name": "read_note", "description": DESCRIPTION, "input_schema": PARAMS}]
    messages: list = [{"role": "user", "content": TASK}]
    for step in range(1, MAX_STEPS + 1):
        with client.messages.stream(
            model="smollm2", max_tokens=256, messages=messages, tools=tools
        ) as stream:
            m = stream.get_final_message()
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in m.content if b.type == "text"), step
        messages.append({"role": "assistant", "content": m.content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": read_note(**u.input)}
                    for u in uses
                ],
            }
        )
    raise SystemExit("no answer")


def genai(base: str) -> tuple[str, int]:
    from google import genai as g
    from google.genai import types

    client = g.Client(api_key="unused", http_options=types.HttpOptions(base_url=base))
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(
                name="read_note", description=DESCRIPTION, parameters_json_schema=PARAMS
            )
        ]
    )
    config = types.GenerateContentConfig(
        tools=[tool], automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)
    )
    contents: list = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    for step in range(1, MAX_STEPS + 1):
        r = client.models.generate_content(model="smollm2", contents=contents, config=config)
        calls = r.function_calls or []
        if not calls:
            return r.text or "", step
        contents.append(r.candidates[0].content)
        contents.append(
            types.Content(
                role="user",
                parts=[
                    types.Part.from_function_response(
                        name=c.name, response={"output": read_note(**c.args)}
                    )
                    for c in calls
                ],
            )
        )
    raise SystemExit("no answer")


KINDS = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "anthropic": anthropic_messages,
    "genai": genai,
}

if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text, steps = KINDS[sys.argv[1]](os.environ["BASE_URL"])
    for w in caught:
        print(f"SDK-WARNING {w.category.__name__}: {w.message}", file=sys.stderr)
    print(json.dumps({"text": text, "steps": steps}))
