"""A Chat Completions request, validated once at the door.

Every rejection is a 400 whose message names the field to fix (``messages[2].tool_call_id``),
so a harness author sees the problem rather than a stack trace.
"""

from __future__ import annotations

from typing import Any

from ...errors import APIError
from ...request import ChatRequest
from ..images import chat_images
from .fields import Fields
from .messages import bad, check_messages, read_bool, read_int, read_number


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", "expected a list.")
    for i, t in enumerate(tools):
        if (
            not isinstance(t, dict)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), dict)
            or not isinstance(t["function"].get("name"), str)
        ):
            raise bad(f"tools[{i}]", "expected {'type': 'function', 'function': {'name': ...}}.")
        params = t["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters", "expected a JSON Schema object.")
    return tools or None


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        return stop
    raise bad("stop", "expected a string or a list of up to 16 strings.")


def _logit_bias(body: dict) -> dict[int, float]:
    lb = body.get("logit_bias")
    if lb is None:
        return {}
    if not isinstance(lb, dict):
        raise bad("logit_bias", "expected an object mapping token IDs to biases.")
    out = {}
    for k, v in lb.items():
        try:
            tid = int(k)
        except ValueError:
            raise bad("logit_bias", f"{k!r} is not a token ID.") from None
        if not 0 <= tid < 2**31:
            raise bad("logit_bias", f"{k!r} is not a token ID (0 <= id < 2^31).")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad("logit_bias", f"the bias for {k} must be a number in [-100, 100].")
        out[tid] = float(v)
    return out


def _tool_choice(body: dict, tools: list[dict] | None) -> tuple[str, str | None]:
    tc = body.get("tool_choice")
    if tc is None:
        return "auto", None
    if tc in ("auto", "none", "required"):
        if tc == "required" and not tools:
            raise bad("tool_choice", "'required' needs a non-empty 'tools' list.")
        return tc, None
    fn = tc.get("function") if isinstance(tc, dict) else None
    if (
        isinstance(tc, dict)
        and tc.get("type") == "function"
        and isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
    ):
        name = fn["name"]
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise bad("tool_choice", f"function {name!r} is not among 'tools'.")
        return "function", name
    raise bad(
        "tool_choice",
        "expected 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}.",
    )


FIELDS = Fields(
    used=frozenset(
        {
            "messages",
            "model",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "logprobs",
            "top_logprobs",
            "logit_bias",
            "n",
            "chat_template_kwargs",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "top_k",
            "min_p",
            "response_format",
            "reasoning_effort",
            "modalities",
        }
    ),
    # OpenAI platform options that change no token: accepted, recorded in the call's info.
    inert=frozenset(
        {
            "user",
            "metadata",
            "store",
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
        }
    ),
    unsupported={
        "functions": "the legacy 'functions' API is not supported; send 'tools'.",
        "function_call": "the legacy 'function_call' is not supported; send 'tool_choice'.",
        "audio": "audio output is not supported.",
        "prediction": "predicted outputs are not supported.",
        "web_search_options": "web search is not supported.",
        "verbosity": "no chat template reads 'verbosity'; leave it out.",
    },
)


def _fields(body: dict) -> dict:
    """Check every top-level field is one Turnstile handles; return the inert ones."""
    inert = FIELDS.sort(body)
    modalities = body.get("modalities")
    if modalities is not None:
        if modalities != ["text"]:
            raise bad("modalities", "only text output (['text']) is supported.")
        inert["modalities"] = modalities
    return inert


def _response_format(body: dict) -> dict | None:
    """The JSON Schema a ``response_format`` asks for (None for text)."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad("response_format", "expected an object with a 'type'.")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "expected a JSON Schema object.")
        return schema
    raise bad(
        "response_format.type", f"{kind!r} is not one of 'text', 'json_object', 'json_schema'."
    )


# Template variables Turnstile passes itself: a harness cannot override them.
RESERVED_TEMPLATE_KWARGS = {
    "messages": "send 'messages'",
    "tools": "send 'tools'",
    "documents": "not supported",
    "add_generation_prompt": "always true for a completion",
    "continue_final_message": "not supported",
    "conversations": "send 'messages'",
    "chat_template": "start turnstile with --chat-template",
    "system": "send a system message",
    "assistant": "reserved",
    "new_messages": "reserved",
    "stop_token_id": "reserved",
}


def function_tool(name: str, description: str | None, parameters: dict) -> dict:
    """A Chat tool, keys in Chat's order: templates print tools as JSON, so the order is in the
    prompt (the other dialects build theirs with this)."""
    fn: dict = {"name": name}
    if description is not None:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise APIError(
            400, "The request body must be a JSON object.", None, code="invalid_request_body"
        )
    inert = _fields(body)
    n = read_int(body, "n", 1)
    if n not in (None, 1):
        raise bad("n", "only n=1 is supported; send separate requests for more samples.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "expected a string.")
    max_tokens = read_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = read_int(body, "max_tokens", 1)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options", "expected an object.")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs", "expected an object.")
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise bad(
                f"chat_template_kwargs.{key}",
                f"{key!r} is set by Turnstile itself ({RESERVED_TEMPLATE_KWARGS[key]}).",
            )
    seed = read_int(body, "seed", -(2**63))
    effort = body.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise bad("reasoning_effort", "expected a string such as 'low' or 'high'.")
        # As vLLM: a template variable (gpt-oss and others read it); chat_template_kwargs wins.
        kwargs = {"reasoning_effort": effort, **kwargs}
    tools = _tools(body)
    tool_choice, forced = _tool_choice(body, tools)
    if tool_choice == "none":
        tools = None  # as vLLM: the template does not see tools the model may not call
    json_schema = _response_format(body)
    if json_schema is not None and tool_choice in ("required", "function"):
        raise bad(
            "response_format",
            "a JSON response format cannot be combined with a "
            "forced tool call (tool_choice); send one of them.",
        )
    top_k = read_int(body, "top_k", -1)
    messages, images = chat_images(check_messages(body))
    return ChatRequest(
        messages=messages,
        images=images,
        model=model,
        tools=tools,
        tool_choice=tool_choice,
        forced_function=forced,
        raw=body,
        stream=read_bool(body, "stream"),
        include_usage=bool(opts and opts.get("include_usage")),
        max_tokens=max_tokens,
        temperature=read_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=read_number(body, "top_p", 0.0, 1.0, 1.0),
        seed=seed,
        stop=_stop(body),
        logprobs=read_bool(body, "logprobs"),
        top_logprobs=read_int(body, "top_logprobs", 0, 20) or 0,
        logit_bias=_logit_bias(body),
        template_kwargs=kwargs,
        parallel_tool_calls=body.get("parallel_tool_calls") is None
        or read_bool(body, "parallel_tool_calls"),
        frequency_penalty=_optional(body, "frequency_penalty", -2.0, 2.0),
        presence_penalty=_optional(body, "presence_penalty", -2.0, 2.0),
        repetition_penalty=_optional(body, "repetition_penalty", 0.01, 2.0),
        top_k=None if top_k in (None, -1, 0) else top_k,
        min_p=_optional(body, "min_p", 0.0, 1.0),
        json_schema=json_schema,
        inert=inert,
    )


def _optional(body: dict, key: str, lo: float, hi: float) -> float | None:
    return None if body.get(key) is None else read_number(body, key, lo, hi, 0.0)


def parse_capture_request(body: Any) -> ChatRequest:
    """Capture mode's request (the engine renders it): only what Turnstile itself relies on
    is checked; every other field is the engine's to accept or refuse (its 4xx reaches the
    harness as is)."""
    if not isinstance(body, dict):
        raise APIError(
            400, "The request body must be a JSON object.", None, code="invalid_request_body"
        )
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages.")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}].role", "expected a message object with a role.")
    for key in ("stream", "logprobs", "return_token_ids"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise bad(key, "expected a boolean.")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise bad("n", "expected an integer >= 1.")
    opts = body.get("stream_options")
    kwargs = body.get("chat_template_kwargs")
    tools = body.get("tools")
    return ChatRequest(
        messages=msgs,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        tools=tools if isinstance(tools, list) else None,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        template_kwargs=kwargs if isinstance(kwargs, dict) else {},
        raw=body,
    )
