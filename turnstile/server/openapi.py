"""The OpenAPI 3.1 document of Turnstile's routes (served at ``GET /openapi.json`` to the trainer,
and what the fuzzer in tests/test_fuzz.py and benchmarks/fuzz.py generates requests from).

One entry per route in :data:`ROUTES`; app.py's route table must match it (checked by
tests/test_fuzz.py). Bodies are described as the validators in app.py and requests.py accept
them, so schema-conforming requests are meant to succeed and the rest to get a 400 naming the
field."""

from __future__ import annotations

from dataclasses import dataclass, field

TRAINER, HARNESS, OPEN = "trainer", "harness", "open"


def _obj(props: dict, required: tuple[str, ...] = (), extra: bool = False) -> dict:
    out: dict = {"type": "object", "properties": props, "additionalProperties": extra}
    if required:
        out["required"] = list(required)
    return out


_STR = {"type": "string"}
_TEXT_PART = _obj({"type": {"const": "text"}, "text": _STR}, ("type", "text"))
_TOOL_CALL = _obj({
    "id": _STR, "type": {"const": "function"},
    "function": _obj({"name": _STR, "arguments": _STR}, ("name",))}, ("function",), True)

SCHEMAS: dict[str, dict] = {
    "Message": _obj({
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [_STR, {"type": "null"},
                              {"type": "array", "items": _TEXT_PART}]},
        "name": _STR, "tool_call_id": _STR,
        "tool_calls": {"type": "array", "items": _TOOL_CALL},
        "reasoning_content": _STR}, ("role", "content"), True),
    "Tool": _obj({"type": {"const": "function"}, "function": _obj({
        "name": _STR, "description": _STR, "strict": {"type": "boolean"},
        "parameters": {"type": "object"}}, ("name",))}, ("type", "function")),
    "ChatCompletionRequest": _obj({
        "model": _STR,
        "messages": {"type": "array", "minItems": 1,
                     "items": {"$ref": "#/components/schemas/Message"}},
        "tools": {"type": "array", "items": {"$ref": "#/components/schemas/Tool"}},
        "tool_choice": {"oneOf": [
            {"enum": ["auto", "none", "required"]},
            _obj({"type": {"const": "function"},
                  "function": _obj({"name": _STR}, ("name",))}, ("type", "function"))]},
        "parallel_tool_calls": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "stream_options": _obj({"include_usage": {"type": "boolean"}}),
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
        "stop": {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}]},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                       "additionalProperties": {"type": "number", "minimum": -100,
                                                "maximum": 100}},
        "n": {"const": 1},
        "chat_template_kwargs": {"type": "object"},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "repetition_penalty": {"type": "number", "minimum": 0.01, "maximum": 2},
        "top_k": {"type": "integer", "minimum": -1},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": _obj({
            "type": {"enum": ["text", "json_object", "json_schema"]},
            "json_schema": _obj({"name": _STR, "strict": {"type": "boolean"},
                                 "schema": {"type": "object"}}, ("schema",))}, ("type",)),
        "reasoning_effort": _STR,
        "user": _STR, "metadata": {"type": "object"}, "store": {"type": "boolean"},
        "service_tier": _STR, "prompt_cache_key": _STR, "safety_identifier": _STR,
        "modalities": {"type": "array", "items": {"const": "text"}}}, ("messages",)),
    "SessionCreate": _obj({
        "metadata": {"type": "object"},
        "id": {"type": "string", "pattern": "^[^/]+$"},
        "group_id": {"type": "string", "minLength": 1},
        "task_id": {"type": "string", "minLength": 1},
        "sample_index": {"type": "integer", "minimum": 0}}),
    "Rewards": _obj({
        "reward": {"type": "number"},
        "rewards": {"type": "object", "minProperties": 1,
                    "additionalProperties": {"type": "number"}},
        "call_id": _STR}),
    "Close": _obj({"termination_reason": _STR}),
    "Pause": _obj({"mode": {"enum": ["drain", "abort"]},
                   "timeout": {"type": "number", "minimum": 0}}),
    "Resume": _obj({"weight_version": {"oneOf": [_STR, {"type": "integer"}]}}),
    "Error": _obj({"error": _obj({"message": _STR, "type": _STR,
                                  "param": {"type": ["string", "null"]},
                                  "code": {"type": ["string", "null"]}})}, ("error",)),
}


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    access: str
    summary: str
    body: str | None = None          # a SCHEMAS name
    body_required: bool = True
    query: dict[str, dict] = field(default_factory=dict)  # name -> schema
    streams: bool = False
    media: str = "application/json"  # of the 200 answer


_LIST_Q: dict[str, dict] = {"group": _STR, "group_id": _STR, "status": {"enum": ["open", "closed"]},
           "limit": {"type": "integer", "minimum": 1, "maximum": 1000}, "after": _STR,
           "exported": {"enum": ["true", "false"]}}

ROUTES: list[Op] = [
    Op("POST", "/s/{capability}/v1/chat/completions", HARNESS,
       "Chat Completions for the session this base URL belongs to", "ChatCompletionRequest",
       streams=True),
    Op("GET", "/s/{capability}/v1/models", HARNESS, "The model list, for a session"),
    Op("POST", "/v1/chat/completions", HARNESS,
       "Chat Completions: the session is the bearer capability's, or (trainer token) the one "
       "X-Session-Id names, created on first use", "ChatCompletionRequest", streams=True),
    Op("GET", "/v1/models", HARNESS, "The model list (capability or trainer token)"),
    Op("POST", "/v1/sessions", TRAINER, "Open a session; returns its id and base_url",
       "SessionCreate", body_required=False),
    Op("GET", "/v1/sessions", TRAINER, "List sessions in creation order", query=_LIST_Q),
    Op("GET", "/v1/sessions/{sid}", TRAINER, "A session with its rewards"),
    Op("DELETE", "/v1/sessions/{sid}", TRAINER, "Delete a session with its calls"),
    Op("POST", "/v1/sessions/{sid}/rewards", TRAINER, "Attach rewards", "Rewards"),
    Op("POST", "/v1/sessions/{sid}/close", TRAINER, "Close a session (later calls get 409)",
       "Close", body_required=False),
    Op("GET", "/v1/sessions/{sid}/calls", TRAINER, "One record per engine call"),
    Op("GET", "/v1/sessions/{sid}/calls/{cid}/body", TRAINER,
       "A call's raw request/response (serve --keep-bodies)"),
    Op("GET", "/v1/sessions/{sid}/trajectories", TRAINER, "Stitched trajectories",
       query={"mode": {"enum": ["merged", "per_call"]}}),
    Op("GET", "/health", OPEN, "Engine reachable (200) or not (503)"),
    Op("POST", "/admin/pause", TRAINER, "Pause new calls (drain or abort running ones)",
       "Pause", body_required=False),
    Op("POST", "/admin/resume", TRAINER, "Resume, optionally under a new weight version",
       "Resume", body_required=False),
    Op("GET", "/admin/status", TRAINER, "Paused?, calls in flight, weight version, replicas"),
    Op("GET", "/openapi.json", TRAINER, "This document"),
    Op("GET", "/metrics", TRAINER, "Prometheus metrics of this gateway (text format)",
       media="text/plain"),
]

_ERRORS = {"400": "a field is invalid (param names it)", "401": "no or unknown credential",
           "403": "this credential does not allow the route",
           "404": "no such session/call (or route)", "409": "the session is closed",
           "413": "body over --max-body-mb", "415": "Content-Type is not application/json",
           "502": "engine failure", "503": "engine unavailable, or paused with abort"}


def _operation(op: Op) -> dict:
    params = [{"name": name, "in": "path", "required": True, "schema": _STR}
              for name in ("capability", "sid", "cid") if "{" + name + "}" in op.path]
    params += [{"name": k, "in": "query", "required": False, "schema": v}
               for k, v in op.query.items()]
    if op.path == "/v1/chat/completions":
        params.append({"name": "X-Session-Id", "in": "header", "required": False,
                       "schema": _STR})
    out: dict = {
        "summary": op.summary,
        "operationId": (op.method.lower() + op.path.replace("/", "_").replace("{", "")
                        .replace("}", "").replace(".", "_")),
        "security": {TRAINER: [{"trainer": []}], OPEN: [],
                     HARNESS: [{"capability": []}, {"trainer": []}]}[op.access],
        "responses": {"200": {"description": "OK", "content": {
            op.media: {"schema": {"type": "object"} if op.media == "application/json"
                       else _STR},
            **({"text/event-stream": {"schema": _STR}} if op.streams else {})}},
            **{code: {"description": what, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Error"}}}}
               for code, what in _ERRORS.items()}},
    }
    if op.method == "POST" and op.path == "/v1/sessions":
        out["responses"]["201"] = out["responses"].pop("200")
    if params:
        out["parameters"] = params
    if op.body:
        out["requestBody"] = {"required": op.body_required, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{op.body}"}}}}
    return out


def document(version: str, server_url: str | None = None) -> dict:
    paths: dict[str, dict] = {}
    for op in ROUTES:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    doc: dict[str, object] = {
        "openapi": "3.1.0",
        "info": {"title": "Turnstile", "version": version, "description": (
            "OpenAI-compatible gateway that records the exact tokens a policy saw and "
            "sampled. Harnesses hold a session's base URL (/s/<capability>/v1); every "
            "other route needs the trainer's token.")},
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": {
            "trainer": {"type": "http", "scheme": "bearer",
                        "description": "The trainer's token (DATA/turnstile.token, --token, "
                                       "or $TURNSTILE_TOKEN)."},
            "capability": {"type": "http", "scheme": "bearer",
                           "description": "A session's capability: in its base URL "
                                          "(/s/<capability>/v1) or as the API key."}}},
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
