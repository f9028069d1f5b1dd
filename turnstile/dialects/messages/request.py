"""An Anthropic Messages request, turned into the one internal request (a Chat Completions body,
validated by ``dialects.chat.request``).

Content blocks map onto chat messages as Anthropic pairs them: an assistant turn's ``thinking``,
``text`` and ``tool_use`` blocks are one assistant message (reasoning, content, tool calls); a
user turn's ``tool_result`` blocks are tool messages, in order, and its text a user message
after them. Echoing a reply's blocks back therefore gives exactly the message its call recorded.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import APIError
from ..chat.fields import Fields
from ..chat.request import function_tool

_USED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "context_management",
        # beyond Anthropic's API, as Turnstile's Chat dialect takes them (reproducible rollouts)
        "seed",
        "logit_bias",
        "chat_template_kwargs",
    }
)
_INERT = frozenset({"metadata", "service_tier"})
_UNSUPPORTED = {
    "container": "code-execution containers are not supported.",
    "mcp_servers": "MCP servers are not supported; give the tools as 'tools'.",
}
# Context edits that remove nothing the model would see: accepted (kept in the record's
# request options). Any other edit would make the prompt differ from the conversation the
# harness holds; it is refused with how to turn it off.
_KEEPING_EDITS = {"clear_thinking_20251015": ("keep", "all")}
_EDIT_REFUSED = (
    "would remove earlier context server-side, and the recorded tokens would no longer be the "
    "conversation the harness holds; Turnstile applies no context edits. Turn them off in the "
    "harness (Claude Code: CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1), or leave only edits "
    "that keep everything, such as {'type': 'clear_thinking_20251015', 'keep': 'all'}."
)
_EFFORTS = frozenset({"low", "medium", "high", "max", "xhigh"})

FIELDS = Fields(_USED, _INERT, _UNSUPPORTED)


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param, code="invalid_request_error")


def _text(blocks: Any, where: str, system: bool = False) -> str:
    """A string, or text blocks joined (a system prompt's with newlines, a tool result's as
    they are)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad(where, "expected a string or a list of text blocks.")
    out = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise bad(f"{where}.{j}", "only text blocks are supported here.")
        out.append(b["text"])
    return "\n".join(out) if where.endswith("system") or system else "".join(out)


def _assistant(content: Any, where: str) -> dict:
    msg: dict = {"role": "assistant", "content": None}
    if isinstance(content, str):
        msg["content"] = content
        return msg
    if not isinstance(content, list):
        raise bad(f"{where}.content", "expected a string or a list of content blocks.")
    texts: list[str] = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        w = f"{where}.content.{j}"
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            msg["reasoning_content"] = b["thinking"]
        elif kind == "tool_use":
            if (
                not isinstance(b.get("id"), str)
                or not isinstance(b.get("name"), str)
                or not isinstance(b.get("input"), dict)
            ):
                raise bad(w, "a tool_use block needs 'id', 'name' and an 'input' object.")
            msg.setdefault("tool_calls", []).append(
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()},
                }
            )
        else:
            raise bad(
                f"{w}.type",
                f"{kind!r} blocks are not supported in an assistant turn "
                "(text, thinking, tool_use are).",
            )
    if texts:
        msg["content"] = "".join(texts)
    return msg


def _image(b: dict, where: str) -> dict:
    """An ``image`` block as a Chat ``image_url`` part (a base64 source as a data URL; a
    URL source stays a URL, which the Chat reader refuses: Turnstile does not fetch)."""
    src = b.get("source")
    if isinstance(src, dict) and src.get("type") == "base64":
        mime, data = src.get("media_type"), src.get("data")
        if not isinstance(mime, str) or not isinstance(data, str):
            raise bad(f"{where}.source", "a base64 image needs media_type and data strings.")
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    if isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise bad(f"{where}.source", "expected a base64 image source.")


def _with_images(blocks: list, where: str) -> list[dict]:
    """Text and image blocks as Chat parts, in order (a turn or a tool result that holds an
    image; dialects/images.py reads the images)."""
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "image":
            parts.append(_image(b, f"{where}.{j}"))
        elif kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        else:
            raise bad(f"{where}.{j}", "only text and image blocks are supported here.")
    return parts


def _has_image(blocks: object) -> bool:
    return isinstance(blocks, list) and any(
        isinstance(b, dict) and b.get("type") == "image" for b in blocks
    )


def _user(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list) or not content:
        raise bad(f"{where}.content", "expected a string or a non-empty list of blocks.")
    out: list[dict] = []
    texts: list[str] = []
    images = _has_image(content)  # then the turn's text and images go as parts, in order
    parts: list[dict] = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        w = f"{where}.content.{j}"
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image(b, w))
        elif kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise bad(f"{w}.tool_use_id", "expected the id of the tool_use it answers.")
            result = b.get("content", "")
            msg = {
                "role": "tool",
                "tool_call_id": b["tool_use_id"],
                "content": (
                    _with_images(result, f"{w}.content")
                    if _has_image(result)
                    else _text(result, f"{w}.content")
                ),
            }
            if b.get("is_error"):
                # the template is given the flag; the text is the tool's own
                msg["is_error"] = True
            out.append(msg)
        else:
            raise bad(
                f"{w}.type",
                f"{kind!r} blocks are not supported in a user turn (text, image, tool_result are).",
            )
    if images and parts:
        out.append({"role": "user", "content": parts})
    elif texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages.")
    out: list[dict] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out += _user(m.get("content"), where)
        elif role == "assistant":
            out.append(_assistant(m.get("content"), where))
        elif role == "system":
            # a system message mid-conversation (Claude Code sends them; beta
            # mid-conversation-system): rendered where it stands, as the template renders one
            out.append(
                {"role": "system", "content": _text(m.get("content"), f"{where}.content", True)}
            )
        else:
            raise bad(f"{where}.role", f"{role!r} is not 'user', 'assistant' or 'system'.")
    return out


def _tools(value: Any) -> tuple[list[dict] | None, list[str]]:
    """Chat tools, and a note per server tool left out (Anthropic runs those itself; no
    engine can, so the model is not shown them)."""
    if value is None:
        return None, []
    if not isinstance(value, list):
        raise bad("tools", "expected a list.")
    out, notes = [], []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise bad(f"tools.{i}", "expected a tool object.")
        kind = t.get("type")
        if kind not in (None, "custom"):
            notes.append(
                f"tools.{i}: the server tool {kind!r} ({t.get('name')!r}) was left out of the "
                "prompt: only client tools run behind Turnstile"
            )
            continue
        if not isinstance(t.get("name"), str):
            raise bad(f"tools.{i}.name", "expected a string.")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise bad(f"tools.{i}.input_schema", "expected a JSON Schema object.")
        out.append(function_tool(t["name"], t.get("description"), schema))
    return out or None, notes


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """Chat's tool_choice, and parallel_tool_calls (from disable_parallel_tool_use)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    parallel = (
        None
        if not isinstance(value, dict) or "disable_parallel_tool_use" not in value
        else not value["disable_parallel_tool_use"]
    )
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}, parallel
    raise bad(
        "tool_choice",
        "expected {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}.",
    )


def check_fields(body: dict) -> dict:
    inert = FIELDS.sort(body, lambda key, why: bad(key, why or "Extra inputs are not permitted"))
    edits = _context_edits(body.get("context_management"))
    if edits is not None:
        inert["context_management"] = edits
    return inert


def _context_edits(value: Any) -> dict | None:
    """``context_management`` if every edit in it keeps the context whole (400 otherwise)."""
    if value is None:
        return None
    edits = value.get("edits") if isinstance(value, dict) else None
    if not isinstance(edits, list) or set(value) - {"edits"}:
        raise bad("context_management", "expected {'edits': [...]}.")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        keeping = _KEEPING_EDITS.get(kind) if isinstance(kind, str) else None
        if keeping is None or edit.get(keeping[0]) != keeping[1]:
            raise bad(f"context_management.edits.{i}", f"the edit {kind!r} {_EDIT_REFUSED}")
    return value


def _thinking(value: Any) -> bool | None:
    """``enable_thinking`` for the template: the variable reasoning templates read (Qwen3
    and others); a template without it renders the same either way."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad(
            "thinking",
            "expected {'type': 'enabled', 'budget_tokens': N}, {'type': 'adaptive'} or "
            "{'type': 'disabled'}.",
        )
    return kind != "disabled"


def _output_config(value: Any, chat: dict) -> None:
    """``output_config``: ``effort`` is the template's ``reasoning_effort`` (as Chat's
    ``reasoning_effort``), ``format`` a JSON Schema the reply must match."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise bad("output_config", "expected an object.")
    for key in set(value) - {"effort", "format"}:
        raise bad(f"output_config.{key}", "Extra inputs are not permitted")
    effort = value.get("effort")
    if effort is not None:
        if type(effort) is not str or effort not in _EFFORTS:
            raise bad("output_config.effort", f"expected one of {sorted(_EFFORTS)}.")
        chat["reasoning_effort"] = effort
    fmt = value.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise bad("output_config.format", "expected {'type': 'json_schema', 'schema': {...}}.")
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.get("schema")},
        }


def chat_body(body: dict) -> tuple[dict, list[str]]:
    """The Chat Completions body of a Messages request, and notes for the call's record
    (what was left out of the prompt)."""
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "Field required")
    chat: dict = {"messages": messages(body), "max_tokens": body["max_tokens"]}
    for key in ("model", "temperature", "top_p", "top_k", "stream", "seed", "logit_bias"):
        if body.get(key) is not None:
            chat[key] = body[key]
    stops = body.get("stop_sequences")
    if stops is not None:
        chat["stop"] = stops
    chat["tools"], notes = _tools(body.get("tools"))
    chat["tool_choice"], chat["parallel_tool_calls"] = _tool_choice(body.get("tool_choice"))
    _output_config(body.get("output_config"), chat)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    thinking = _thinking(body.get("thinking"))
    if thinking is not None:
        kwargs.setdefault("enable_thinking", thinking)
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return {k: v for k, v in chat.items() if v is not None}, notes
