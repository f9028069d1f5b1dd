"""MiniMax-M3 tool calls (M1 and M2 are rows of ``families``).

Every tag is preceded by the separator ``]<]minimax[>[`` and argument values are
nested tags, objects as child elements and lists as ``<item>`` elements:
``…<tool_call>\\n…<invoke name="NAME">…<city>Paris…</city>…<days>…<item>1…</item>…</days>…
</invoke>\\n…</tool_call>``. Reasoning is ``<mm:think>…</mm:think>`` (see ``families``).
"""

from __future__ import annotations

import re
from typing import Any

from .base import ArgsWriter, Region, RegionParser, convert_value, malformed
from .types import (
    STATUS_MALFORMED_TOOL_CALL,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Issue,
    schema_types,
)

NS = "]<]minimax[>["
M3_OPEN = NS + "<tool_call>"
M3_CLOSE = NS + "</tool_call>"
M3_INVOKE = NS + '<invoke name="'
M3_INVOKE_END = NS + "</invoke>"
_TAG = re.compile(r"<(/?)([^<>/]+)>(.*)", re.S)


class _M3Calls(Region):
    """A ``<tool_call>`` section: each ``<invoke>`` is announced at its name, parsed at its end."""

    def __init__(self, opener: str, parser: MiniMaxM3ToolParser) -> None:
        self._opener = opener
        self._parser = parser
        self._name: str | None = None
        self._calls = 0

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._name is None:
            i = len(buf) - len(buf.lstrip())
            rest = buf[i:]
            for marker in (M3_CLOSE, M3_INVOKE):
                if rest.startswith(marker):
                    break
            else:
                if not final and any(m.startswith(rest) for m in (M3_CLOSE, M3_INVOKE)):
                    return 0, False
                if self._calls:
                    out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
                else:
                    malformed(out, self._opener)
                return i, True
            if marker == M3_CLOSE:
                return i + len(marker), True
            end = rest.find('">', len(marker))
            if end < 0:
                if final:
                    malformed(out, rest)
                    return len(buf), True
                return 0, False
            self._name = rest[len(marker) : end]
            out.append(CallStart(self._name))
            return i + end + 2, False
        at, marker = self.find(buf, (M3_INVOKE_END, M3_CLOSE))
        if at < 0 and not final:
            return 0, False
        body = buf if at < 0 else buf[:at]
        args, ok = self._parser.convert(self._name, body)
        out.append(ArgsDelta(args))
        if not ok or marker != M3_INVOKE_END:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
        out.append(CallEnd())
        self._name = None
        self._calls += 1
        if marker == M3_INVOKE_END:
            return at + len(marker), False
        return len(body), at < 0


class MiniMaxM3ToolParser(RegionParser):
    """MiniMax-M3 separator-tagged calls."""

    openers = (M3_OPEN,)
    markers = (NS, "<mm:think>", "</mm:think>")

    def open_region(self, marker: str) -> Region:
        return _M3Calls(marker, self)

    def convert(self, name: str, body: str) -> tuple[str, bool]:
        """Arguments JSON for an ``<invoke>`` body, and whether it was well-formed."""
        root: list[Any] = [None, []]  # [tag, children]
        stack = [root]
        ok = not body.split(NS, 1)[0].strip()
        for segment in body.split(NS)[1:]:
            m = _TAG.fullmatch(segment)
            if m is None:
                ok = False
                continue
            closing, tag, text = m.groups()
            if not closing:
                node: list[Any] = [tag, [], text]
                stack[-1][1].append(node)
                stack.append(node)
            elif len(stack) > 1 and stack[-1][0] == tag:
                stack.pop()
                ok = ok and not text.strip()
            else:
                ok = False
        ok = ok and len(stack) == 1
        writer = ArgsWriter()
        parts = []
        for tag, children, text in root[1]:
            schema = self.tools.schema(name, tag) if self.tools else None
            parts.append(writer.member(tag, _m3_value(children, text, schema)))
        parts.append(writer.close())
        return "".join(parts), ok


def _m3_value(children: list[Any], text: str, schema: dict[str, Any] | None) -> Any:
    """The JSON value of one element, typed by its schema where known."""
    types = schema_types(schema)
    if not children:
        if not text and types and types <= {"object"}:
            return {}
        if not text and types and types <= {"array"}:
            return []
        return convert_value(text, types)
    if all(child[0] == "item" for child in children) and not (types and "object" in types):
        items = (schema or {}).get("items") if isinstance(schema, dict) else None
        return [_m3_value(c[1], c[2], items) for c in children]
    props = (schema or {}).get("properties") or {}
    return {c[0]: _m3_value(c[1], c[2], props.get(c[0])) for c in children}
