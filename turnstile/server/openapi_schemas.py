"""The request bodies of Turnstile's routes as JSON Schemas (``openapi.SCHEMAS``), written as the
validators in ``server/requests.py``, ``dialects/`` and the session routes accept them."""

from __future__ import annotations


def _obj(props: dict, required: tuple[str, ...] = (), extra: bool = False) -> dict:
    out: dict = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        out["required"] = list(required)
    return out


STR = {"type": "string"}
_TEXT_PART = _obj({"type": {"const": "text"}, "text": STR}, ("type", "text"))
_TOOL_CALL = _obj(
    {
        "id": STR,
        "type": {"const": "function"},
        "function": _obj({"name": STR, "arguments": STR}, ("name",)),
    },
    ("function",),
    True,
)

SCHEMAS: dict[str, dict] = {
    "Message": _obj(
        {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"oneOf": [STR, {"type": "null"}, {"type": "array", "items": _TEXT_PART}]},
            "name": STR,
            "tool_call_id": STR,
            "tool_calls": {"type": "array", "items": _TOOL_CALL},
            "reasoning_content": STR,
        },
        ("role", "content"),
        True,
    ),
    "Tool": _obj(
        {
            "type": {"const": "function"},
            "function": _obj(
                {
                    "name": STR,
                    "description": STR,
                    "strict": {"type": "boolean"},
                    "parameters": {"type": "object"},
                },
                ("name",),
            ),
        },
        ("type", "function"),
    ),
    "ChatCompletionRequest": _obj(
        {
            "model": STR,
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/components/schemas/Message"},
            },
            "tools": {"type": "array", "items": {"$ref": "#/components/schemas/Tool"}},
            "tool_choice": {
                "oneOf": [
                    {"enum": ["auto", "none", "required"]},
                    _obj(
                        {"type": {"const": "function"}, "function": _obj({"name": STR}, ("name",))},
                        ("type", "function"),
                    ),
                ]
            },
            "parallel_tool_calls": {"type": "boolean"},
            "stream": {"type": "boolean"},
            "stream_options": _obj({"include_usage": {"type": "boolean"}}),
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            "stop": {"oneOf": [STR, {"type": "array", "items": STR, "maxItems": 16}]},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "logit_bias": {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            },
            "n": {"const": 1},
            "chat_template_kwargs": {"type": "object"},
            "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "repetition_penalty": {"type": "number", "minimum": 0.01, "maximum": 2},
            "top_k": {"type": "integer", "minimum": -1},
            "min_p": {"type": "number", "minimum": 0, "maximum": 1},
            "response_format": _obj(
                {
                    "type": {"enum": ["text", "json_object", "json_schema"]},
                    "json_schema": _obj(
                        {"name": STR, "strict": {"type": "boolean"}, "schema": {"type": "object"}},
                        ("schema",),
                    ),
                },
                ("type",),
            ),
            "reasoning_effort": STR,
            "user": STR,
            "metadata": {"type": "object"},
            "store": {"type": "boolean"},
            "service_tier": STR,
            "prompt_cache_key": STR,
            "safety_identifier": STR,
            "modalities": {"type": "array", "items": {"const": "text"}},
        },
        ("messages",),
    ),
    "ResponsesRequest": _obj(
        {
            "model": STR,
            "instructions": STR,
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": _obj(
                            {
                                "role": {"enum": ["system", "developer", "user"]},
                                "content": STR,
                                "type": {"const": "message"},
                            },
                            ("role", "content"),
                        ),
                    },
                ]
            },
            "tools": {
                "type": "array",
                "items": _obj(
                    {
                        "type": {"const": "function"},
                        "name": STR,
                        "description": STR,
                        "strict": {"type": "boolean"},
                        "parameters": {"type": "object"},
                    },
                    ("type", "name"),
                ),
            },
            "tool_choice": {"oneOf": [{"enum": ["auto", "none"]}]},
            "parallel_tool_calls": {"type": "boolean"},
            "stream": {"type": "boolean"},
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            "previous_response_id": STR,
            "store": {"type": "boolean"},
            "user": STR,
            "metadata": {"type": "object"},
        },
        ("input",),
    ),
    "MessagesRequest": _obj(
        {
            "model": STR,
            "max_tokens": {"type": "integer", "minimum": 1},
            "system": STR,
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": _obj(
                    {"role": {"const": "user"}, "content": {"type": "string", "minLength": 1}},
                    ("role", "content"),
                ),
            },
            "tools": {
                "type": "array",
                "items": _obj(
                    {"name": STR, "description": STR, "input_schema": {"type": "object"}},
                    ("name", "input_schema"),
                ),
            },
            "tool_choice": _obj({"type": {"enum": ["auto", "none"]}}, ("type",)),
            "stop_sequences": {"type": "array", "items": STR, "maxItems": 4},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "stream": {"type": "boolean"},
            "metadata": {"type": "object"},
        },
        ("max_tokens", "messages"),
    ),
    "SessionCreate": _obj(
        {
            "metadata": {"type": "object"},
            "id": {"type": "string", "pattern": "^[^/]+$"},
            "group_id": {"type": "string", "minLength": 1},
            "task_id": {"type": "string", "minLength": 1},
            "sample_index": {"type": "integer", "minimum": 0},
        }
    ),
    "Rewards": _obj(
        {
            "reward": {"type": "number"},
            "rewards": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {"type": "number"},
            },
            "call_id": STR,
        }
    ),
    "Close": _obj({"termination_reason": STR}),
    "Pause": _obj(
        {"mode": {"enum": ["drain", "abort"]}, "timeout": {"type": "number", "minimum": 0}}
    ),
    "Resume": _obj({"weight_version": {"oneOf": [STR, {"type": "integer"}]}}),
    "Error": _obj(
        {
            "error": _obj(
                {
                    "message": STR,
                    "type": STR,
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                }
            )
        },
        ("error",),
    ),
}
