"""The messages of a Chat Completions request, checked once at the door, and the typed readers
of its scalar fields: each rejection a 400 naming the field (``messages[2].tool_call_id``)."""

from __future__ import annotations

from ...errors import APIError

ROLES = {"system", "developer", "user", "assistant", "tool"}


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"Invalid '{param}': {message}", param, code="invalid_value")


def read_number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(key, f"expected a number, got {type(v).__name__}.")
    if not lo <= v <= hi:
        raise bad(key, f"{v} is outside [{lo}, {hi}].")
    return float(v)


def read_int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(key, f"expected an integer, got {type(v).__name__}.")
    if v < lo or (hi is not None and v > hi):
        raise bad(key, f"{v} is outside [{lo}, {hi if hi is not None else 'inf'}].")
    return v


def read_bool(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(key, f"expected a boolean, got {type(v).__name__}.")
    return v


def _check_content(m: dict, where: str, role: str) -> None:
    c = m.get("content")
    if c is None:
        if role == "assistant":  # content may be null beside tool calls, or when empty
            return
        raise bad(f"{where}.content", f"a {role} message needs content.")
    if isinstance(c, str):
        return
    if not isinstance(c, list):
        raise bad(
            f"{where}.content", f"expected a string or a list of parts, got {type(c).__name__}."
        )
    for j, part in enumerate(c):
        if isinstance(part, dict) and part.get("type") == "image_url" and role != "assistant":
            continue  # read by dialects/images.py (data URLs; anything else a 400 there)
        if (
            not isinstance(part, dict)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise bad(
                f"{where}.content[{j}]",
                "only text and image_url parts ({'type': 'text', 'text': ...}) are supported.",
            )


def _check_tool_calls(m: dict, where: str) -> None:
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls", "expected a list.")
    for j, c in enumerate(calls):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise bad(w, "expected an object.")
        fn = c.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{w}.function.name", "expected a string.")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise bad(f"{w}.function.arguments", "expected a JSON string.")
        if isinstance(args, str) and _json_depth(args) > MAX_ARGUMENTS_DEPTH:
            raise bad(
                f"{w}.function.arguments", f"JSON nested deeper than {MAX_ARGUMENTS_DEPTH} levels."
            )


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


def check_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise APIError(
            400,
            "Missing required parameter: 'messages'.",
            "messages",
            code="missing_required_parameter",
        )
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages.")
    for i, m in enumerate(msgs):
        # The history is resent on every call: the common shapes (text content; a tool result
        # with its call id) pass here without building field names; the rest is checked below.
        if type(m) is dict and type(m.get("content")) is str:
            role = m.get("role")
            if (type(role) is str and role in _PLAIN_ROLES) or (
                role == "tool" and type(m.get("tool_call_id")) is str
            ):
                continue
        _check_message(m, i)
    return msgs


_PLAIN_ROLES = frozenset({"system", "developer", "user"})


def _check_message(m: object, i: int) -> None:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(where, "expected an object.")
    role = m.get("role")
    if type(role) is not str or role not in ROLES:
        raise bad(f"{where}.role", f"{role!r} is not one of {sorted(ROLES)}.")
    _check_content(m, where, role)
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise bad(
            f"{where}.tool_call_id", "a tool message needs the id of the tool call it answers."
        )
    if role == "assistant":
        _check_tool_calls(m, where)
