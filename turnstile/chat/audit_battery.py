"""The conversations the template audit plays: every kind of append the gateway extends."""

from __future__ import annotations

from dataclasses import dataclass, field

from .policy import append_kind

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]


def tool_call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def assistant(
    content: str | None, calls: list[dict] | None = None, reasoning: str | None = None
) -> dict:
    m: dict = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = calls
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def tool_result(cid: str, content: str, name: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "What's the weather in Paris?"}
USER2 = {"role": "user", "content": "And should I take an umbrella?"}
SYSTEM_MID = {"role": "system", "content": "Answer in one short sentence."}
DEVELOPER = {"role": "developer", "content": "Be brief."}


@dataclass
class Conversation:
    """Messages plus which assistant turns are 'sampled' and how (stop or length). Each step
    is judged under the append kind the gateway gives its new messages (``append_kind``)."""

    name: str
    messages: list[dict]
    truncated: set[int] = field(default_factory=set)  # assistant indices cut by length


def battery(reasoning: bool) -> list[Conversation]:
    """Every append kind the gateway extends must be played here: what is not played starts
    a new segment at run time. Kinds after a second tool round are played too (templates that
    count rounds or track state across messages differ only there)."""
    r = (lambda text: text) if reasoning else (lambda text: None)
    a_call = assistant(
        "",
        [tool_call("call00001", "get_weather", '{"city": "Paris"}')],
        r("I should call the weather tool."),
    )
    a_call2 = assistant(
        None, [tool_call("call00003", "get_time", '{"city": "Paris"}')], r("Now the time.")
    )  # null content, as parsed replies carry it
    a_par = assistant(
        "",
        [
            tool_call("call00001", "get_weather", '{"city": "Paris"}'),
            tool_call("call00002", "get_time", '{"city": "Paris"}'),
        ],
        r("Two tools at once."),
    )
    a_final = assistant("It is 18 C and sunny in Paris.", None, r("The tool says 18 C."))
    a_final2 = assistant("No umbrella needed today.", None, r("Sunny means no rain."))
    a_long = assistant(
        "Paris is the capital of France and its weather today is mild and",
        None,
        r("Let me describe Paris."),
    )
    t1 = tool_result("call00001", '{"temp_c": 18}', "get_weather")
    t2 = tool_result("call00002", '{"time": "14:05"}', "get_time")
    t3 = tool_result("call00003", '{"time": "14:05"}', "get_time")
    return [
        Conversation("tool-then-user", [SYSTEM, USER1, a_call, t1, a_final, USER2, a_final2]),
        Conversation("tool-chain", [SYSTEM, USER1, a_call, t1, a_call2, t3, a_final]),
        Conversation("parallel-batch", [SYSTEM, USER1, a_par, t1, t2, a_final]),
        Conversation("length-then-user", [SYSTEM, USER1, a_long, USER2, a_final2], truncated={2}),
        Conversation("no-system", [USER1, a_call, t1, a_final, USER2, a_final2]),
        # mixed appends, after one and after two tool rounds
        Conversation("tool+user", [SYSTEM, USER1, a_call, t1, {**USER2}, a_final2]),
        Conversation("round2-tool+user", [SYSTEM, USER1, a_call, t1, a_call2, t3, USER2, a_final2]),
        Conversation("tool+system", [SYSTEM, USER1, a_call, t1, SYSTEM_MID, a_final]),
        Conversation(
            "round2-tool+system", [SYSTEM, USER1, a_call, t1, a_call2, t3, SYSTEM_MID, a_final]
        ),
        # system / developer messages in the middle of the conversation
        Conversation("system-mid", [SYSTEM, USER1, a_final, SYSTEM_MID, USER2, a_final2]),
        Conversation("system-only", [SYSTEM, USER1, a_final, SYSTEM_MID, a_final2]),
        Conversation("developer-mid", [SYSTEM, USER1, a_final, DEVELOPER, USER2, a_final2]),
        Conversation(
            "user-after-round2", [USER1, a_call, t1, a_call2, t3, a_final, USER2, a_final2]
        ),
    ]


def assistant_indices(msgs: list[dict]) -> list[int]:
    return [i for i, m in enumerate(msgs) if m["role"] == "assistant"]


def battery_kinds() -> list[str]:
    """The append kinds the battery plays, in order of first appearance."""
    seen: dict[str, None] = {}
    for conv in battery(False):
        asst = assistant_indices(conv.messages)
        for a, b in zip(asst, asst[1:], strict=False):
            seen.setdefault(append_kind(conv.messages[a + 1 : b]))
    return list(seen)
