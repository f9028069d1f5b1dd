"""A Chat Completions request, validated once at the door.

Every rejection is a 400 whose message names the field to fix (``messages[2].tool_call_id``),
so a harness author sees the problem rather than a stack trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..store.records import CallRecord
from .errors import APIError

ROLES = {"system", "developer", "user", "assistant", "tool"}



@dataclass
class ChatRequest:
    messages: list[dict]
    model: str | None = None
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # "auto" | "none" | "required" | the name of the one function that must be called
    tool_choice: str = "auto"
    forced_function: str | None = None
    parallel_tool_calls: bool = True  # OpenAI's default; "required" may then make several calls
    # Sampling knobs beyond OpenAI's core set; None = not given (the engine's neutral value).
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    # response_format json_object / json_schema: the JSON Schema the reply must match
    json_schema: dict | None = None
    # Fields OpenAI clients send that change nothing Turnstile renders or samples (``user``,
    # ``metadata``, ``store``, ...): accepted, and kept in the call record's info.
    inert: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)  # the body as received (retention)
    # The wire dialect the harness spoke ("chat", "responses", "messages"): every dialect is
    # turned into this one request, and each call records which one it came in.
    dialect: str = "chat"
    # Set by the gateway once the call is committed: what a dialect's answer needs beyond the
    # Chat Completions shape (the stop string that ended it, the call's ID).
    record: CallRecord | None = field(default=None, repr=False)
    # What a dialect keeps in the call's record to answer later requests (the Responses
    # dialect: the input items this call added to its response chain).
    dialect_state: dict = field(default_factory=dict, repr=False)
    # The call's ID when a dialect names it before the call runs (a streamed response's ID is
    # sent first); None: the gateway draws one.
    call_id: str | None = None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"Invalid '{param}': {message}", param, code="invalid_value")


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(key, f"expected a number, got {type(v).__name__}.")
    if not lo <= v <= hi:
        raise _bad(key, f"{v} is outside [{lo}, {hi}].")
    return float(v)


def _int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, f"expected an integer, got {type(v).__name__}.")
    if v < lo or (hi is not None and v > hi):
        raise _bad(key, f"{v} is outside [{lo}, {hi if hi is not None else 'inf'}].")
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(key, f"expected a boolean, got {type(v).__name__}.")
    return v


def _check_content(m: dict, where: str, role: str) -> None:
    c = m.get("content")
    if c is None:
        if role == "assistant":  # content may be null beside tool calls, or when empty
            return
        raise _bad(f"{where}.content", f"a {role} message needs content.")
    if isinstance(c, str):
        return
    if not isinstance(c, list):
        raise _bad(f"{where}.content", f"expected a string or a list of parts, got "
                                       f"{type(c).__name__}.")
    for j, part in enumerate(c):
        if not isinstance(part, dict) or part.get("type") != "text" or \
                not isinstance(part.get("text"), str):
            raise _bad(f"{where}.content[{j}]", "only text parts ({'type': 'text', 'text': "
                                                "...}) are supported.")


def _check_tool_calls(m: dict, where: str) -> None:
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls", "expected a list.")
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise _bad(w, "expected an object.")
        fn = c.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{w}.function.name", "expected a string.")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise _bad(f"{w}.function.arguments", "expected a JSON string.")
        if isinstance(args, str) and _json_depth(args) > MAX_ARGUMENTS_DEPTH:
            raise _bad(f"{w}.function.arguments", f"JSON nested deeper than "
                                                   f"{MAX_ARGUMENTS_DEPTH} levels.")


# Tool-call arguments arrive as JSON text: they are parsed for matching and rendering, and
# JSON deeper than this is refused (the encoders stop at 255 levels).
MAX_ARGUMENTS_DEPTH = 64


def _json_depth(text: str) -> int:
    """How deep the brackets of JSON text nest (outside strings); cheap for flat text."""
    if text.count("[") + text.count("{") <= MAX_ARGUMENTS_DEPTH:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise APIError(400, "Missing required parameter: 'messages'.", "messages",
                       code="missing_required_parameter")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "expected a non-empty list of messages.")
    for i, m in enumerate(msgs):
        # The history is resent on every call: the common shapes (text content; a tool result
        # with its call id) pass here without building field names; the rest is checked below.
        if type(m) is dict and type(m.get("content")) is str:
            role = m.get("role")
            if role in _PLAIN_ROLES or (role == "tool" and type(m.get("tool_call_id")) is str):
                continue
        _check_message(m, i)
    return msgs


_PLAIN_ROLES = frozenset({"system", "developer", "user"})


def _check_message(m: object, i: int) -> None:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(where, "expected an object.")
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role", f"{role!r} is not one of {sorted(ROLES)}.")
    _check_content(m, where, role)
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise _bad(f"{where}.tool_call_id", "a tool message needs the id of the tool call "
                                            "it answers.")
    if role == "assistant":
        _check_tool_calls(m, where)


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "expected a list.")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or \
                not isinstance(t.get("function"), dict) or \
                not isinstance(t["function"].get("name"), str):
            raise _bad(f"tools[{i}]", "expected {'type': 'function', 'function': {'name': ...}}.")
        params = t["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            raise _bad(f"tools[{i}].function.parameters", "expected a JSON Schema object.")
    return tools or None


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        return stop
    raise _bad("stop", "expected a string or a list of up to 16 strings.")


def _logit_bias(body: dict) -> dict[int, float]:
    lb = body.get("logit_bias")
    if lb is None:
        return {}
    if not isinstance(lb, dict):
        raise _bad("logit_bias", "expected an object mapping token IDs to biases.")
    out = {}
    for k, v in lb.items():
        try:
            tid = int(k)
        except ValueError:
            raise _bad("logit_bias", f"{k!r} is not a token ID.") from None
        if not 0 <= tid < 2**31:
            raise _bad("logit_bias", f"{k!r} is not a token ID (0 <= id < 2^31).")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise _bad("logit_bias", f"the bias for {k} must be a number in [-100, 100].")
        out[tid] = float(v)
    return out


def _tool_choice(body: dict, tools: list[dict] | None) -> tuple[str, str | None]:
    tc = body.get("tool_choice")
    if tc is None:
        return "auto", None
    if tc in ("auto", "none", "required"):
        if tc == "required" and not tools:
            raise _bad("tool_choice", "'required' needs a non-empty 'tools' list.")
        return tc, None
    if isinstance(tc, dict) and tc.get("type") == "function" and \
            isinstance((tc.get("function") or {}).get("name"), str):
        name = tc["function"]["name"]
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise _bad("tool_choice", f"function {name!r} is not among 'tools'.")
        return "function", name
    raise _bad("tool_choice", "expected 'auto', 'none', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}.")


# Every body field is used (passed to the engine or the template, and recorded with the call),
# kept as inert, or refused with a 400 naming it: nothing a harness asks for is dropped silently.
_USED = frozenset({
    "messages", "model", "tools", "tool_choice", "parallel_tool_calls", "stream",
    "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
    "stop", "logprobs", "top_logprobs", "logit_bias", "n", "chat_template_kwargs",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p",
    "response_format", "reasoning_effort"})
# OpenAI platform options that change no token: accepted, recorded in the call's info.
_INERT = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                    "prompt_cache_retention", "safety_identifier"})
_UNSUPPORTED = {
    "functions": "the legacy 'functions' API is not supported; send 'tools'.",
    "function_call": "the legacy 'function_call' is not supported; send 'tool_choice'.",
    "audio": "audio output is not supported.",
    "prediction": "predicted outputs are not supported.",
    "web_search_options": "web search is not supported.",
    "verbosity": "no chat template reads 'verbosity'; leave it out.",
}


def _fields(body: dict) -> dict:
    """Check every top-level field is one Turnstile handles; return the inert ones."""
    inert = {}
    for key, value in body.items():
        if key in _USED or value is None:
            continue
        if key in _INERT:
            inert[key] = value
        elif key == "modalities":
            if value != ["text"]:
                raise _bad("modalities", "only text output (['text']) is supported.")
            inert[key] = value
        elif key in _UNSUPPORTED:
            raise APIError(400, f"Unsupported parameter: '{key}': {_UNSUPPORTED[key]}", key,
                           code="unsupported_parameter")
        else:
            raise APIError(400, f"Unrecognized request argument supplied: {key}", key,
                           code="unrecognized_argument")
    return inert


def _response_format(body: dict) -> dict | None:
    """The JSON Schema a ``response_format`` asks for (None for text)."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise _bad("response_format", "expected an object with a 'type'.")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _bad("response_format.json_schema.schema", "expected a JSON Schema object.")
        return schema
    raise _bad("response_format.type", f"{kind!r} is not one of 'text', 'json_object', "
                                       "'json_schema'.")


# Template variables Turnstile passes itself: a harness cannot override them.
RESERVED_TEMPLATE_KWARGS = {
    "messages": "send 'messages'", "tools": "send 'tools'",
    "documents": "not supported", "add_generation_prompt": "always true for a completion",
    "continue_final_message": "not supported", "conversations": "send 'messages'",
    "chat_template": "start turnstile with --chat-template",
    "system": "send a system message", "assistant": "reserved", "new_messages": "reserved",
    "stop_token_id": "reserved"}


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", None,
                       code="invalid_request_body")
    inert = _fields(body)
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise _bad("n", "only n=1 is supported; send separate requests for more samples.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "expected a string.")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options", "expected an object.")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs", "expected an object.")
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise _bad(f"chat_template_kwargs.{key}", f"{key!r} is set by Turnstile itself "
                       f"({RESERVED_TEMPLATE_KWARGS[key]}).")
    seed = _int(body, "seed", -(2**63))
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _bad("reasoning_effort", "expected a string such as 'low' or 'high'.")
        # As vLLM: a template variable (gpt-oss and others read it); chat_template_kwargs wins.
        kwargs = {"reasoning_effort": effort, **kwargs}
    tools = _tools(body)
    tool_choice, forced = _tool_choice(body, tools)
    if tool_choice == "none":
        tools = None  # as vLLM: the template does not see tools the model may not call
    json_schema = _response_format(body)
    if json_schema is not None and tool_choice in ("required", "function"):
        raise _bad("response_format", "a JSON response format cannot be combined with a "
                                      "forced tool call (tool_choice); send one of them.")
    top_k = _int(body, "top_k", -1)
    return ChatRequest(
        messages=_messages(body),
        model=model,
        tools=tools,
        tool_choice=tool_choice,
        forced_function=forced,
        raw=body,
        stream=_bool(body, "stream"),
        include_usage=bool(opts and opts.get("include_usage")),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0),
        seed=seed,
        stop=_stop(body),
        logprobs=_bool(body, "logprobs"),
        top_logprobs=_int(body, "top_logprobs", 0, 20) or 0,
        logit_bias=_logit_bias(body),
        template_kwargs=kwargs,
        parallel_tool_calls=body.get("parallel_tool_calls") is None or
        _bool(body, "parallel_tool_calls"),
        frequency_penalty=_optional(body, "frequency_penalty", -2.0, 2.0),
        presence_penalty=_optional(body, "presence_penalty", -2.0, 2.0),
        repetition_penalty=_optional(body, "repetition_penalty", 0.01, 2.0),
        top_k=None if top_k in (None, -1, 0) else top_k,
        min_p=_optional(body, "min_p", 0.0, 1.0),
        json_schema=json_schema,
        inert=inert,
    )


def _optional(body: dict, key: str, lo: float, hi: float) -> float | None:
    return None if body.get(key) is None else _number(body, key, lo, hi, 0.0)


def parse_capture_request(body: Any) -> ChatRequest:
    """Capture mode's request (the engine renders it): only what Turnstile itself relies on
    is checked; every other field is the engine's to accept or refuse (its 4xx reaches the
    harness as is)."""
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", None,
                       code="invalid_request_body")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "expected a non-empty list of messages.")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}].role", "expected a message object with a role.")
    for key in ("stream", "logprobs", "return_token_ids"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _bad(key, "expected a boolean.")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise _bad("n", "expected an integer >= 1.")
    opts = body.get("stream_options")
    kwargs = body.get("chat_template_kwargs")
    tools = body.get("tools")
    return ChatRequest(
        messages=msgs, model=body.get("model") if isinstance(body.get("model"), str) else None,
        tools=tools if isinstance(tools, list) else None, stream=bool(body.get("stream")),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        template_kwargs=kwargs if isinstance(kwargs, dict) else {}, raw=body)
