"""An OpenAI Responses request, turned into the one internal request (a Chat Completions body,
validated by ``dialects.chat.request``) plus what the response chain needs.

Input items map onto chat messages the way the Responses API itself pairs them: a ``reasoning``
item, an assistant ``message`` and the ``function_call`` items after it are one assistant turn;
a ``function_call_output`` is a tool message. Sending back the output items of a response (or
naming it in ``previous_response_id``) therefore gives exactly the messages the call's record
holds, and the conversation extends its recorded tokens as a Chat harness's would.
"""

from __future__ import annotations

from typing import Any

from ...errors import APIError
from ..chat.fields import Fields
from ..chat.request import function_tool
from ..images import Taker

# Sampling fields beyond the Responses API that vLLM accepts there too: what an RL harness needs
# to make a rollout reproducible or bounded (a seed, a logit bias); passed on as Chat's.
_EXTENSIONS = (
    "seed",
    "logit_bias",
    "stop",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "chat_template_kwargs",
)
# Fields that shape the prompt or the sampling, and become the internal request's.
_USED = frozenset(
    {
        "input",
        "instructions",
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "stream_options",
        "previous_response_id",
        "reasoning",
        "text",
        "top_logprobs",
        "include",
        "truncation",
        *_EXTENSIONS,
    }
)
# Accepted, kept in the call record's info; they change no token.
_INERT = frozenset(
    {
        "store",
        "metadata",
        "user",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "client_metadata",  # Codex: its thread and turn ids
    }
)
_UNSUPPORTED = {
    "background": "background responses are not supported; send the request and wait.",
    "conversation": "server-side conversations are not supported; send "
    "'previous_response_id' or the whole input.",
    "prompt": "stored prompt templates are not supported; send 'input'.",
    "max_tool_calls": "'max_tool_calls' is not supported.",
}
FIELDS = Fields(_USED, _INERT, _UNSUPPORTED)
_INCLUDE = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})


def bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"Invalid '{param}': {message}", param, code=code)


def _text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A message's content (a string or text parts) as one string."""
    got = _parts(content, where, kinds, None)
    assert isinstance(got, str)
    return got


def _parts(content: Any, where: str, kinds: tuple[str, ...], taker: Taker | None) -> str | list:
    """A message's content as one string, or, when it holds ``input_image`` parts (only where
    ``taker`` is given: user turns and function outputs), as Chat Completions parts: text, and
    each image as an ``image_url`` part with its data URL, decoded here (within the limits;
    the chat reader's decode of the same URL is then a cache hit) so a bad image is a 400
    naming the Responses part. ``file_id`` images are refused by name: there are no files."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, "expected a string or a list of content parts.")
    out: list[dict] = []
    images = False
    for j, part in enumerate(content):
        w = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and taker is not None:
            assert isinstance(part, dict)
            if part.get("file_id") is not None:
                raise bad(
                    f"{w}.file_id",
                    "file_id images are not supported (Turnstile keeps no files); send the "
                    "image as a data: URL in image_url (docs/images.md).",
                    code="unsupported_value",
                )
            url = part.get("image_url")
            if url is None:
                raise bad(w, "an input_image part needs image_url (a data: URL).")
            taker.chat_url(f"{w}.image_url", url)
            out.append({"type": "image_url", "image_url": {"url": url}})
            images = True
            continue
        if kind in ("input_image", "input_file"):
            raise bad(
                w,
                f"{kind} parts are not supported here; images go in user messages and "
                "function_call_output items as input_image parts with a data: URL "
                "(docs/images.md).",
            )
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise bad(w, f"only text parts ({' / '.join(kinds)}) are supported.")
        assert isinstance(part, dict)
        out.append({"type": "text", "text": part["text"]})
    if not images:
        return "".join(p["text"] for p in out)
    return out


class _Turns:
    """Builds chat messages from input items, keeping one assistant turn open while its
    reasoning, message and function calls arrive."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.open: dict | None = None  # the assistant turn being assembled
        self.images = Taker()  # this input's images, decoded and counted once

    def _assistant(self, starts_new: bool) -> dict:
        if self.open is None or starts_new:
            self.open = {"role": "assistant", "content": None}
            self.messages.append(self.open)
        return self.open

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise bad(where, "expected an input item object.")
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise bad(f"{where}.{key}", "expected a string.")
            ns = item.get("namespace")
            if ns is not None and not isinstance(ns, str):
                raise bad(f"{where}.namespace", "expected a string.")
            name = flat_name(ns, item["name"]) if ns else item["name"]
            turn = self._assistant(False)
            turn.setdefault("tool_calls", []).append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": name, "arguments": item["arguments"]},
                }
            )
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad(f"{where}.call_id", "expected the call_id of the function call.")
            output = _parts(
                item.get("output"), f"{where}.output", ("input_text", "output_text"), self.images
            )
            self.open = None
            self.messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": output}
            )
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            kinds = ("reasoning_text", "summary_text")
            text = _text(parts, f"{where}.content", kinds) if parts else ""
            o = self.open
            turn = self._assistant(
                o is None
                or bool(o.get("content") or o.get("tool_calls") or "reasoning_content" in o)
            )
            turn["reasoning_content"] = text
        else:
            raise bad(
                f"{where}.type",
                f"{kind!r} items are not supported (message, "
                "function_call, function_call_output, reasoning are).",
                code="unsupported_value",
            )

    def _message(self, item: dict, where: str) -> None:
        role = item.get("role")
        if role == "assistant":
            text = _text(item.get("content"), f"{where}.content", ("output_text", "input_text"))
            o = self.open
            turn = self._assistant(o is None or bool(o.get("content") or o.get("tool_calls")))
            turn["content"] = text
            return
        if role not in ("user", "system", "developer"):
            raise bad(
                f"{where}.role",
                f"{role!r} is not one of 'user', 'assistant', 'system', 'developer'.",
            )
        self.open = None
        taker = self.images if role == "user" else None
        content = _parts(item.get("content"), f"{where}.content", ("input_text",), taker)
        self.messages.append({"role": role, "content": content})


def input_messages(value: Any) -> list[dict]:
    """``input`` (a string or items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("input", "expected a string or a non-empty list of input items.")
    turns = _Turns()
    for i, item in enumerate(value):
        turns.add(item, f"input[{i}]")
    return turns.messages


# Tools the Responses API runs itself: no engine behind Turnstile can, so the model is not
# shown them (the call's record says so).
_HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
        "tool_search",
    }
)


def flat_name(namespace: str, name: str) -> str:
    """A namespaced tool's name as one function name, as Codex flattens them where a wire has
    no namespaces (``multi_agent_v1`` + ``spawn_agent`` → ``multi_agent_v1__spawn_agent``)."""
    return namespace.rstrip("_") + "__" + name.lstrip("_")


def namespaces(tools: Any) -> dict[str, tuple[str, str]]:
    """The flat name of each namespaced function tool → (namespace, name)."""
    out: dict[str, tuple[str, str]] = {}
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str):
            for inner in t.get("tools") or ():
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    out[flat_name(t["name"], inner["name"])] = (t["name"], inner["name"])
    return out


def _function(t: dict, where: str, name: str) -> dict:
    params = t.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise bad(f"{where}.parameters", "expected a JSON Schema object.")
    return function_tool(name, t.get("description"), params)


def _tools(value: Any) -> tuple[list[dict] | None, list[str]]:
    """Chat tools (a namespace's functions flattened), and a note per hosted tool left out."""
    if value is None:
        return None, []
    if not isinstance(value, list):
        raise bad("tools", "expected a list.")
    out, notes = [], []
    for i, t in enumerate(value):
        kind = t.get("type") if isinstance(t, dict) else None
        where = f"tools[{i}]"
        if type(kind) is str and kind in _HOSTED:
            notes.append(
                f"{where}: the hosted tool {kind!r} was left out of the prompt: "
                "no engine behind Turnstile runs it"
            )
            continue
        if not isinstance(t, dict) or kind not in ("function", "namespace"):
            raise bad(
                f"{where}.type",
                f"only function and namespace tools are supported, not {kind!r}.",
                code="unsupported_value",
            )
        if not isinstance(t.get("name"), str):
            raise bad(f"{where}.name", "expected a string.")
        if kind == "function":
            out.append(_function(t, where, t["name"]))
            continue
        inner = t.get("tools")
        if not isinstance(inner, list):
            raise bad(f"{where}.tools", "expected a list of function tools.")
        for j, f in enumerate(inner):
            w = f"{where}.tools[{j}]"
            if not isinstance(f, dict) or f.get("type", "function") != "function":
                raise bad(f"{w}.type", "a namespace holds function tools only.")
            if not isinstance(f.get("name"), str):
                raise bad(f"{w}.name", "expected a string.")
            out.append(_function(f, w, flat_name(t["name"], f["name"])))
    return out or None, notes


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("name"), str)
    ):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad(
        "tool_choice", "expected 'auto', 'none', 'required' or {'type': 'function', 'name': ...}."
    )


def _format(text: Any) -> dict | None:
    """``text.format`` as a Chat ``response_format``."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("text", "expected an object.")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name", "reply"), "schema": fmt.get("schema")},
        }
    raise bad("text.format", "expected {'type': 'text' | 'json_object' | 'json_schema'}.")


def check_fields(body: dict) -> dict:
    """Every field is used, inert (returned) or refused with a 400 naming it."""
    inert = FIELDS.sort(body)
    include = body.get("include") or []
    if not isinstance(include, list) or any(
        type(x) is not str or x not in _INCLUDE for x in include
    ):
        raise bad("include", f"supported values are {sorted(_INCLUDE)}.")
    if body.get("truncation") not in (None, "disabled"):
        raise bad(
            "truncation",
            "only 'disabled' is supported: Turnstile never drops "
            "context silently (the tokens would not be what was recorded).",
        )
    return inert


def chat_body(body: dict, history: list[dict]) -> tuple[dict, list[str]]:
    """The Chat Completions body of a Responses request whose earlier turns (from
    ``previous_response_id``) are ``history``, and notes for the call's record."""
    messages = list(history)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions", "expected a string.")
        # As the Responses API: instructions are this request's only, never carried over.
        messages.insert(0, {"role": "system", "content": instructions})
    if "input" not in body:
        raise APIError(
            400, "Missing required parameter: 'input'.", "input", code="missing_required_parameter"
        )
    messages += input_messages(body["input"])
    chat: dict = {"messages": messages}
    for src, dst in (
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("max_output_tokens", "max_completion_tokens"),
        ("stream", "stream"),
        *((k, k) for k in _EXTENSIONS),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    chat["tools"], notes = _tools(body.get("tools"))
    chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    chat["response_format"] = _format(body.get("text"))
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise bad("reasoning", "expected an object such as {'effort': 'low'}.")
        chat["reasoning_effort"] = reasoning.get("effort")
    if "message.output_text.logprobs" in (body.get("include") or []) or body.get("top_logprobs"):
        chat["logprobs"] = True
        chat["top_logprobs"] = body.get("top_logprobs") or 0
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return {k: v for k, v in chat.items() if v is not None}, notes
