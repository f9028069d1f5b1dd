"""Llama 3.x tool calls: a JSON call as the whole message, or ``<|python_tag|>``.

- Custom tools (Llama-3.1/3.2/3.3 templates): the message is ``{"name": NAME, "parameters":
  {…}}`` (``"arguments"`` accepted); Llama-3.2 may chain several with ``;``. Only a message
  that *starts* with such an object is a call; a JSON answer that is not a call stays content.
- ``<|python_tag|>``: a built-in tool call ``NAME.call(key="value", …)`` (brave_search,
  wolfram_alpha), a JSON call object, or code for the code interpreter, reported as a call to
  ``python`` with ``{"code": …}`` as llama.cpp and vLLM do.
"""

from __future__ import annotations

import ast
import json

from ..families.specs import LLAMA3_ENDS, PYTHON_TAG
from .base import Region, RegionParser, literal_node, malformed, parse_expression
from .jsonlist import JsonCallList, ListSpec
from .types import ArgsDelta, CallEnd, CallStart, Event

ENDS = LLAMA3_ENDS
JSON_SPEC = ListSpec(
    bare=True, seps=";", args_keys=("parameters", "arguments"), strict=False, lenient=True
)


class LeadingJson(Region):
    """At the start of the message: a JSON call run if the text begins with ``{``."""

    def __init__(self) -> None:
        self._inner: Region | None = None

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._inner is None:
            stripped = buf.lstrip()
            if not stripped:
                return (len(buf), True) if final else (0, False)
            if stripped[0] != "{":
                return 0, True
            self._inner = JsonCallList("", JSON_SPEC)
        return self._inner.advance(buf, final, out)


def builtin_call(code: str) -> tuple[str, dict] | None:
    """(name, arguments) of ``NAME.call(k=v, …)``, the built-in tool syntax, or None."""
    node = parse_expression(code)
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
        and not node.args
    ):
        return None
    try:
        args = {kw.arg: literal_node(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    return node.func.value.id, args


class PythonTag(Region):
    """After ``<|python_tag|>``: a JSON call, a built-in ``.call(...)``, or code."""

    def __init__(self, opener: str) -> None:
        self._opener = opener
        self._inner: Region | None = None

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._inner is not None:
            return self._inner.advance(buf, final, out)
        stripped = buf.lstrip()
        if stripped.startswith("{"):
            self._inner = JsonCallList("", JSON_SPEC)
            return self._inner.advance(buf, final, out)
        at, marker = self.find(buf, ENDS)
        if at < 0 and not final:
            return 0, False
        body = buf if at < 0 else buf[:at]
        used = len(buf) if at < 0 else at + len(marker)
        if not body.strip():
            malformed(out, self._opener + body)
            return used, True
        found = builtin_call(body)
        name, args = found if found is not None else ("python", {"code": body})
        out += [CallStart(name), ArgsDelta(json.dumps(args, ensure_ascii=False)), CallEnd()]
        return used, True


class Llama3ToolParser(RegionParser):
    """Llama 3.x JSON tool calls and ``<|python_tag|>``."""

    openers = (PYTHON_TAG,)
    drops = ENDS  # end-of-turn tokens, should the stop token reach the parser
    markers = (PYTHON_TAG, *ENDS)

    def initial_region(self) -> Region | None:
        return LeadingJson()

    def open_region(self, marker: str) -> Region:
        return PythonTag(marker)
