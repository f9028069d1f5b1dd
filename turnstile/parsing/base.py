"""Shared machinery for marker-delimited tool-call formats.

Most formats are plain text with *regions* opened by a marker (``<tool_call>``,
``[TOOL_CALLS]``, ``<｜tool▁call▁begin｜>``...). ``RegionParser`` streams the text outside
regions as content (holding back only a suffix that may still become a marker) and hands each
region to a ``Region`` object that consumes it from the same buffer. A family module then only
says which markers open which kind of region, usually by configuring one of the generic regions
(``tagged.TaggedJsonCall``, ``jsonlist.JsonCallList``, ``xmlcalls.XmlCalls``).

Why a shared buffer and "consume a prefix" steps: every decision is taken on text that is
present (a marker found, a JSON value closed) and never on text that is merely absent, except at
``finish``. That keeps the events independent of how the completion was chunked, which is the
contract of ``ToolCallParser``.
"""

from __future__ import annotations

import ast
import json
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from .markers import split_safe
from .types import STATUS_MALFORMED_TOOL_CALL, Event, Issue, Text, ToolCallParser, ToolSchemas


def find_first(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str]:
    """(index, marker) of the leftmost marker in ``text`` (longest on a tie), or (-1, "")."""
    best, found = -1, ""
    for marker in markers:
        if not marker:
            continue
        i = text.find(marker, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
            best, found = i, marker
    return best, found


def may_extend(text: str, at: int, marker: str, markers: Iterable[str]) -> bool:
    """True if the marker found at ``at`` may still turn out to be a longer marker."""
    rest = text[at:]
    return any(
        len(m) > len(marker) and m.startswith(marker) and m.startswith(rest) for m in markers
    )


class Region(ABC):
    """The parser for one region of a completion, started by an opening marker."""

    @abstractmethod
    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        """Consume a prefix of ``buf``; return (characters consumed, region finished).

        Must make progress or report finished when ``final`` (the completion has ended).
        (0, False) means either "wait for more text" (then calling again changes nothing) or
        "moved to another state without consuming" (then the next call goes on); ``drive``
        repeats the call to cover both.
        """

    def drive(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        """``advance`` until it consumes text or finishes, or a few steps did neither.

        A step may change state without consuming (announce a call, pick a form); the next
        step then goes on. A waiting step changes nothing, so repeating it is harmless; no
        region chains more than ``MAX_MOVES`` such moves (at the end, regions must finish, so
        the bound is only a guard).
        """
        for _ in range(MAX_MOVES if not final else 16 * MAX_MOVES):
            n, done = self.advance(buf, final, out)
            if n or done:
                return n, done
        return 0, False

    def advance(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        """One ``step``; forgets the search memos once text is consumed (see ``find``).

        Regions that delegate to an inner region call this, not ``drive``, so that waiting
        costs one inner step per outer step.
        """
        n, done = self.step(buf, final, out)
        if n or done:
            self.__dict__.pop("_memos", None)
        return n, done

    def find(self, buf: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
        """``find_first`` for a region waiting on a buffer that only grows between calls.

        Remembers how far a fruitless search got, so waiting for the close tag of a long value
        (a file written as an argument) stays linear instead of quadratic. Valid because the
        buffer keeps its start until a step consumes, and ``advance`` then forgets the memos.
        """
        memos: dict[tuple[tuple[str, ...], int], int] = self.__dict__.setdefault("_memos", {})
        key = (markers, start)
        at, marker = find_first(buf, markers, memos.get(key, start))
        if at < 0:
            span = max((len(m) for m in markers), default=1)
            memos[key] = max(start, len(buf) - span + 1)
        return at, marker


#: Upper bound on consecutive steps that consume nothing (see ``Region.drive``).
MAX_MOVES = 4


class RegionParser(ToolCallParser):
    """Content text with regions opened by markers; see the module docstring.

    Subclasses set ``openers`` (markers that start a region, passed to ``open_region``) and
    ``drops`` (markers removed from content wherever they appear: section wrappers, response
    tags), and may start inside a region (``initial_region``).
    """

    openers: tuple[str, ...] = ()
    drops: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._buf = ""
        self._region: Region | None = self.initial_region()

    def initial_region(self) -> Region | None:
        """A region the generation prompt already opened (Functionary v3.2's ``>>>``)."""
        return None

    @abstractmethod
    def open_region(self, marker: str) -> Region:
        """The region started by ``marker`` (one of ``openers``)."""

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            if self._region is not None:
                n, done = self._region.drive(self._buf, final, out)
                self._buf = self._buf[n:]
                if done:
                    self._region = None
                    continue
                if n == 0:
                    if final:  # defensive: a region must finish at the end
                        self._region = None
                        continue
                    break
                continue
            if not self._text_step(out, final):
                break
        return out

    def _text_step(self, out: list[Event], final: bool) -> bool:
        markers = self.openers + self.drops
        at, marker = find_first(self._buf, markers)
        if at >= 0 and (final or not may_extend(self._buf, at, marker, markers)):
            if at:
                out.append(Text(self._buf[:at]))
            self._buf = self._buf[at + len(marker) :]
            if marker in self.openers:
                self._region = self.open_region(marker)
            return True
        if at >= 0:  # a marker that may still grow into a longer one: release what precedes
            if at:
                out.append(Text(self._buf[:at]))
                self._buf = self._buf[at:]
            return False
        safe, held = (self._buf, "") if final else split_safe(self._buf, markers)
        if safe:
            out.append(Text(safe))
        self._buf = held
        return False


def malformed(out: list[Event], raw: str) -> None:
    """Report an unparsable call: its raw text goes back to content, with the status."""
    if raw:
        out.append(Text(raw))
    out.append(Issue(STATUS_MALFORMED_TOOL_CALL))


def is_json_object(text: str) -> bool:
    """Whether ``text`` is one JSON object (what OpenAI ``arguments`` must hold)."""
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


# --- Typed values for formats that write arguments as text ------------------------------------


class _LiteralError(ValueError):
    pass


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def python_literal(text: str) -> Any:
    """Evaluate a Python/JSON literal (``{'a': True}``, ``[1, null]``), or raise ValueError.

    Why: templates that render non-string arguments with Jinja's ``{{ value }}`` write Python
    reprs (Seed-OSS, MiniCPM5); Python-call formats (LFM2) mix both spellings.
    """
    node = parse_expression(text)
    if node is None:
        raise _LiteralError(text)
    return literal_node(node)


def parse_expression(text: str) -> ast.expr | None:
    """Python's parse of one expression, or None; quiet about odd escapes like ``"\\ "``
    (templates write strings raw between quotes, so a backslash may start no real escape)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def literal_node(node: ast.AST) -> Any:
    """The value of an AST literal node; names true/false/null count as JSON literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = literal_node(node.operand)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [literal_node(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            k = literal_node(key) if key is not None else None
            if not isinstance(k, str):
                raise _LiteralError("non-string key")
            out[k] = literal_node(value)
        return out
    raise _LiteralError(ast.dump(node))


def _finite(value: Any) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))


def convert_value(raw: str, types: frozenset[str] | None = None, hint: str | None = None) -> Any:
    """A parameter written as text (XML-style formats) as a JSON value.

    ``hint``: what the format itself says (``"string"`` for DeepSeek's ``string="true"`` or
    Kimi-K3's ``type="string"``, ``"json"`` for the opposite). ``types``: the parameter's
    schema types when the request's tools are known. Without either, text that parses as JSON
    (or as a Python literal container) is taken as such, anything else is a string: the same
    guess every engine makes, exact whenever the schema is given.
    """
    if hint == "string":
        return raw
    if hint != "json" and types is not None and types <= {"string"}:
        return raw
    try:
        value = json.loads(raw)
        if _finite(value):
            if types is not None and "string" in types and isinstance(value, str | int | float):
                # "007" or "1e3" for a string|number parameter: keep what the model wrote
                # unless the value is a JSON string literal or a type the schema prefers.
                if not isinstance(value, str) and not types & _json_kinds(value):
                    return raw
            return value
    except ValueError:
        pass
    stripped = raw.strip()
    if stripped[:1] in "{[" or stripped in _NAMES or (types and "string" not in types):
        try:
            return python_literal(stripped)
        except ValueError:
            pass
    return raw


def _json_kinds(value: Any) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    return set()


def schema_types(tools: ToolSchemas | None, function: str, param: str) -> frozenset[str] | None:
    """Schema types of one parameter, or None without tools."""
    return tools.types(function, param) if tools is not None else None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class ArgsWriter:
    """Builds an ``arguments`` JSON object one parameter at a time, as stream fragments.

    XML-style formats know a parameter's value only once its close tag arrives; each
    parameter then becomes one fragment (``{"city": "Paris"`` then ``, "days": 3`` then
    ``}``), so a streaming client sees arguments grow as the model writes them.
    """

    def __init__(self) -> None:
        self.count = 0

    def member(self, key: str, value: Any) -> str:
        return self.open(key) + _dumps(value)

    def open(self, key: str) -> str:
        """The text before a member's value: ``{"key": `` or ``, "key": ``."""
        sep = "{" if self.count == 0 else ", "
        self.count += 1
        return f"{sep}{_dumps(key)}: "

    def close(self) -> str:
        return "}" if self.count else "{}"
