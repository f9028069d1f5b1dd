"""A Gemini ``generateContent`` request, turned into the one internal request (a Chat Completions
body, validated by ``dialects.chat.request``).

``contents`` map onto chat messages turn by turn: a ``model`` turn's thought parts, text parts
and ``functionCall`` parts are one assistant message (reasoning, content, tool calls); a
``user`` turn's ``functionResponse`` parts are tool messages, in order, and its text a user
message after them. Echoing a reply's parts back therefore gives the message its call recorded
(tool-call ids renamed by the harness, as gemini-cli does, are matched by the session's history
whatever they are).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import APIError
from ..chat.fields import Fields
from ..chat.request import function_tool

_USED = frozenset(
    {
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "generationConfig",
        "model",  # the SDKs repeat the path's model in the body of countTokens
        # beyond Google's API, as Turnstile's Chat dialect takes them (reproducible rollouts)
        "chat_template_kwargs",
        "logit_bias",
    }
)
# Accepted and kept in the record: they change nothing the model sees or samples.
_INERT = frozenset({"safetySettings", "labels", "serviceTier", "store"})
_UNSUPPORTED = {
    "cachedContent": "server-side cached contents are not supported: send the contents whole.",
}
FIELDS = Fields(_USED, _INERT, _UNSUPPORTED)

_GENERATION_USED = frozenset(
    {
        "temperature",
        "topP",
        "topK",
        "maxOutputTokens",
        "stopSequences",
        "candidateCount",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "thinkingConfig",
    }
)
_GENERATION_INERT = frozenset({"responseModalities", "mediaResolution", "speechConfig"})
_GENERATION_UNSUPPORTED = {
    "responseLogprobs": "logprobs are recorded by Turnstile for the trainer, not returned.",
    "logprobs": "logprobs are recorded by Turnstile for the trainer, not returned.",
    "enableEnhancedCivicAnswers": "not supported.",
}
GENERATION = Fields(_GENERATION_USED, _GENERATION_INERT, _GENERATION_UNSUPPORTED)


def camel(value: Any) -> Any:
    """One message of the request with its fields named as Google's JSON names them: the API
    parses proto JSON, which takes ``snake_case`` names too, and the Python SDK sends some
    (``parameters_json_schema``, ``thinking_config``). Only the message's own keys: a schema,
    a call's ``args`` or a response's payload keep theirs."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        if "_" in key and key != "chat_template_kwargs" and key != "logit_bias":
            head, *rest = key.split("_")
            key = head + "".join(w[:1].upper() + w[1:] for w in rest)
        out[key] = v
    return out


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param, code="INVALID_ARGUMENT")


def refusal(key: str, why: str | None, where: str = "") -> APIError:
    name = where + key
    return bad(
        name, why or f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.'
    )


# parts that carry media: refused with what to do (the prompt is text and token IDs today)
_MEDIA = ("inlineData", "fileData", "inline_data", "file_data")


def _no_media(part: dict, where: str) -> None:
    for key in _MEDIA:
        if key in part:
            raise bad(
                f"{where}.{key}",
                "media parts (images, audio, files) are not supported yet: send text, or "
                "describe the file's content in a text part.",
            )


def _parts(content: Any, where: str) -> list[dict]:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        raise bad(f"{where}.parts", "expected a list of parts.")
    for j, p in enumerate(parts):
        if not isinstance(p, dict):
            raise bad(f"{where}.parts[{j}]", "expected a part object.")
        _no_media(p, f"{where}.parts[{j}]")
    return [camel(p) for p in parts]


def _text_only(content: Any, where: str) -> str:
    """A system instruction: its text parts, joined with newlines (as Google joins them)."""
    if isinstance(content, str):
        return content
    out = []
    for j, p in enumerate(_parts(content, where)):
        if not isinstance(p.get("text"), str):
            raise bad(f"{where}.parts[{j}]", "only text parts are supported here.")
        out.append(p["text"])
    return "\n".join(out)


def _tool_output(response: Any) -> str:
    """A function response as the tool message's text: its ``output`` (or ``result``) when that
    is all it holds (gemini-cli sends ``{"output": text}``), else the object as JSON."""
    if isinstance(response, dict) and len(response) == 1:
        ((key, value),) = response.items()
        if key in ("output", "result") and isinstance(value, str):
            return value
    return orjson.dumps(response).decode()


def _model_turn(parts: list[dict], where: str, turn: int) -> dict:
    msg: dict = {"role": "assistant", "content": None}
    texts: list[str] = []
    thoughts: list[str] = []
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        if "functionCall" in p:
            fc = camel(p["functionCall"])
            if not isinstance(fc, dict) or not isinstance(fc.get("name"), str):
                raise bad(f"{w}.functionCall", "expected {'name': ..., 'args': {...}}.")
            args = fc.get("args", {})
            if not isinstance(args, dict):
                raise bad(f"{w}.functionCall.args", "expected an object.")
            cid = fc.get("id")
            if cid is not None and not isinstance(cid, str):
                raise bad(f"{w}.functionCall.id", "expected a string.")
            msg.setdefault("tool_calls", []).append(
                {
                    "id": cid or f"call_{turn}_{j}",
                    "type": "function",
                    "function": {"name": fc["name"], "arguments": orjson.dumps(args).decode()},
                }
            )
        elif isinstance(p.get("text"), str):
            (thoughts if p.get("thought") else texts).append(p["text"])
        elif p.get("thought") or set(p) <= {"thoughtSignature", "thought"}:
            continue  # a signature alone: Turnstile's own, or the harness's stamp (ignored)
        else:
            raise bad(w, "only text, thought and functionCall parts are supported in a model turn.")
    if texts:
        msg["content"] = "".join(texts)
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    return msg


def _user_turn(parts: list[dict], where: str, calls: list[tuple[str, str]]) -> list[dict]:
    """Tool messages for the function responses (their ids: the response's own, else the
    pending call of that name), then the text as a user message."""
    out: list[dict] = []
    texts: list[str] = []
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        if "functionResponse" in p:
            fr = camel(p["functionResponse"])
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise bad(f"{w}.functionResponse", "expected {'name': ..., 'response': {...}}.")
            cid = fr.get("id")
            if cid is not None and not isinstance(cid, str):
                raise bad(f"{w}.functionResponse.id", "expected a string.")
            if cid is None:
                cid = next((c for c, n in calls if n == fr["name"]), f"call_{fr['name']}")
            calls[:] = [(c, n) for c, n in calls if c != cid]
            out.append(
                {"role": "tool", "tool_call_id": cid, "content": _tool_output(fr.get("response"))}
            )
        elif isinstance(p.get("text"), str):
            if not p.get("thought"):
                texts.append(p["text"])
        elif set(p) <= {"thoughtSignature"}:
            continue
        else:
            raise bad(w, "only text and functionResponse parts are supported in a user turn.")
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def messages(body: dict) -> list[dict]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise bad("contents", "expected a non-empty list of contents.")
    out: list[dict] = []
    system = camel(body.get("systemInstruction"))
    if system is not None:
        out.append({"role": "system", "content": _text_only(system, "systemInstruction")})
    pending: list[tuple[str, str]] = []  # the last model turn's calls not yet answered
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        content = camel(content)
        parts = _parts(content, where)
        role = content.get("role", "user")
        if role == "model":
            msg = _model_turn(parts, where, i)
            pending = [(c["id"], c["function"]["name"]) for c in msg.get("tool_calls") or ()]
            out.append(msg)
        elif role == "user" or role == "function":
            out += _user_turn(parts, where, pending)
        else:
            raise bad(f"{where}.role", f"{role!r} is not 'user' or 'model'.")
    return out


def _schema(value: Any) -> Any:
    """Google's OpenAPI-subset ``Schema`` as JSON Schema: its upper-case types lower-cased."""
    if isinstance(value, dict):
        return {
            k: (v.lower() if k == "type" and isinstance(v, str) else _schema(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_schema(v) for v in value]
    return value


def _tools(value: Any) -> tuple[list[dict] | None, list[str]]:
    """Chat tools from ``functionDeclarations``, and a note per built-in tool left out (Google
    runs those itself; no engine can, so the model is not shown them)."""
    if value is None:
        return None, []
    if not isinstance(value, list):
        raise bad("tools", "expected a list.")
    out, notes = [], []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise bad(f"tools[{i}]", "expected a tool object.")
        for key, decls in camel(t).items():
            if key != "functionDeclarations":
                notes.append(
                    f"tools[{i}].{key}: the built-in tool was left out of the prompt: only "
                    "function declarations run behind Turnstile"
                )
                continue
            if not isinstance(decls, list):
                raise bad(f"tools[{i}].functionDeclarations", "expected a list.")
            for j, d in enumerate(decls):
                w = f"tools[{i}].functionDeclarations[{j}]"
                d = camel(d)
                if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                    raise bad(f"{w}.name", "expected a string.")
                if d.get("parametersJsonSchema") is not None:
                    schema = d["parametersJsonSchema"]
                elif d.get("parameters") is not None:
                    schema = _schema(d["parameters"])
                else:
                    schema = {"type": "object", "properties": {}}
                if not isinstance(schema, dict):
                    raise bad(f"{w}.parameters", "expected a schema object.")
                desc = d.get("description")
                if desc is not None and not isinstance(desc, str):
                    raise bad(f"{w}.description", "expected a string.")
                out.append(function_tool(d["name"], desc, schema))
    return out or None, notes


_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required", "VALIDATED": "auto"}


def _tool_choice(value: Any, tools: list[dict] | None) -> Any:
    """Chat's tool_choice from ``toolConfig.functionCallingConfig``: ``ANY`` forces a call (one
    allowed name: that function), ``NONE`` none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("toolConfig", "expected an object.")
    config = camel(camel(value).get("functionCallingConfig"))
    if config is None:
        return None
    if not isinstance(config, dict):
        raise bad("toolConfig.functionCallingConfig", "expected an object.")
    mode = config.get("mode", "AUTO")
    if not isinstance(mode, str) or mode not in _MODES:
        raise bad("toolConfig.functionCallingConfig.mode", f"expected one of {sorted(_MODES)}.")
    names = config.get("allowedFunctionNames")
    if names is None or mode != "ANY":
        return _MODES[mode]
    declared = [t["function"]["name"] for t in tools or ()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        raise bad("toolConfig.functionCallingConfig.allowedFunctionNames", "expected names.")
    if len(set(names)) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    if set(declared) <= set(names):
        return "required"
    raise bad(
        "toolConfig.functionCallingConfig.allowedFunctionNames",
        "several names that are not all the declared functions cannot be forced exactly: "
        "name one function, or all of them, or declare only the allowed ones.",
    )


def _thinking(value: Any) -> bool | None:
    """``enable_thinking`` for the template (the variable reasoning templates read): off for a
    zero budget, on otherwise; a template without it renders the same either way."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("generationConfig.thinkingConfig", "expected an object.")
    value = camel(value)
    budget = value.get("thinkingBudget")
    if budget is not None and (type(budget) is not int):
        raise bad("generationConfig.thinkingConfig.thinkingBudget", "expected an integer.")
    return budget != 0


_SAMPLING = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
# Chat's parameter names as this dialect names them (for the 400s of the shared checks)
NAMES = {v: f"generationConfig.{k}" for k, v in _SAMPLING.items()} | {
    "stop": "generationConfig.stopSequences",
    "response_format": "generationConfig.responseSchema",
    "tool_choice": "toolConfig",
    "messages": "contents",
}


def _generation(value: Any, chat: dict) -> dict:
    """``generationConfig`` into the chat body; its inert fields back."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("generationConfig", "expected an object.")
    value = camel(value)
    inert = GENERATION.sort(value, lambda k, why: refusal(k, why, "generationConfig."))
    for key, name in _SAMPLING.items():
        if value.get(key) is not None:
            chat[name] = value[key]
    count = value.get("candidateCount")
    if count is not None and count != 1:
        raise bad(
            "generationConfig.candidateCount",
            "only 1 candidate per call is supported (each call is one recorded sample): "
            "send one request per candidate.",
        )
    if value.get("stopSequences") is not None:
        chat["stop"] = value["stopSequences"]
    schema = value.get("responseJsonSchema", value.get("responseSchema"))
    mime = value.get("responseMimeType")
    if schema is not None:
        if not isinstance(schema, dict):
            raise bad("generationConfig.responseSchema", "expected a schema object.")
        if "responseJsonSchema" not in value:
            schema = _schema(schema)
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    elif mime == "application/json":
        chat["response_format"] = {"type": "json_object"}
    elif mime not in (None, "text/plain"):
        raise bad("generationConfig.responseMimeType", "expected text/plain or application/json.")
    thinking = _thinking(value.get("thinkingConfig"))
    if thinking is not None:
        kwargs = chat.setdefault("chat_template_kwargs", {})
        kwargs.setdefault("enable_thinking", thinking)
    return inert


def chat_body(body: dict, stream: bool) -> tuple[dict, dict, list[str]]:
    """The Chat Completions body of a Gemini request, its inert fields (kept in the record) and
    notes for the call's record (what was left out of the prompt)."""
    body = camel(body)
    inert = FIELDS.sort(body, refusal)
    chat: dict = {"messages": messages(body), "stream": stream}
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad("chat_template_kwargs", "expected an object.")
        chat["chat_template_kwargs"] = dict(kwargs)
    if body.get("logit_bias") is not None:
        chat["logit_bias"] = body["logit_bias"]
    gen = _generation(body.get("generationConfig"), chat)
    if gen:
        inert["generationConfig"] = gen
    chat["tools"], notes = _tools(body.get("tools"))
    chat["tool_choice"] = _tool_choice(body.get("toolConfig"), chat["tools"])
    if chat["tool_choice"] is not None and not chat["tools"]:
        if chat["tool_choice"] in ("auto", "none"):
            chat["tool_choice"] = None
        else:
            raise bad("toolConfig", "a forced function call needs function declarations.")
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return {k: v for k, v in chat.items() if v is not None}, inert, notes
