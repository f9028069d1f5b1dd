"""Runs inside the strands venv (tests/harnesses/venv.py), driven by tests/test_harnesses.py:
a Strands ``Agent`` with its ``OpenAIModel`` (given only ``client_args`` base URL and key, a
``model_id`` and ``params``, as Strands' docs show), one tool, a task and a follow-up turn.

The model is forced to call the tool on the first turn (``tool_choice`` in ``params``, taken
out by a hook once the tool ran: Strands itself sends ``tool_choice`` only for structured
output). Argument: a JSON file with base_url, model, system, task, follow_up, params. Prints
``RESULT {json}``: the version, the tool's calls, each model call's outcome (an
``AfterModelCallEvent`` hook: the client has ``max_retries=0``, so one model call is one
request), whether it streamed, the stop reasons and the final text."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Literal

from strands import Agent, tool
from strands.hooks import AfterModelCallEvent, AfterToolCallEvent
from strands.models.openai import OpenAIModel


def main(path: str) -> dict:
    args = json.loads(open(path).read())
    ran: list[str] = []
    answered: list[str | None] = []

    @tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather for a city."""
        ran.append(city)
        return f"18 C in {city}"

    model = OpenAIModel(
        client_args={"base_url": args["base_url"], "api_key": "x", "max_retries": 0},
        model_id=args["model"],
        params={**args["params"], "tool_choice": "required", "parallel_tool_calls": False},
    )
    agent = Agent(
        model=model, tools=[get_weather], system_prompt=args["system"], callback_handler=None
    )

    def unforce(event: AfterToolCallEvent) -> None:
        model.update_config(params=args["params"])

    def seen(event: AfterModelCallEvent) -> None:
        answered.append(None if event.exception is None else repr(event.exception))

    agent.hooks.add_callback(AfterToolCallEvent, unforce)
    agent.hooks.add_callback(AfterModelCallEvent, seen)
    stops = []
    for prompt in (args["task"], args["follow_up"]):
        result = agent(prompt)
        stops.append(result.stop_reason)
    return {
        "version": version("strands-agents"),
        "ran": ran,
        "answered": answered,
        "stream": bool(model.config.get("stream", True)),
        "stop_reasons": stops,
        "final": str(result),
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])))
