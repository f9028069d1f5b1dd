"""A JSON list of call objects after an opening marker: ``<open>[{...}, {...}]<close>``.

Mistral-Nemo ``[TOOL_CALLS][...]``, Granite ``<|tool_call|>[...]``, Nemotron ``<TOOLCALL>``,
Apriel ``<tool_calls>``, Cohere ``<|START_ACTION|>``, Command-R ``Action: ```json``,
FireFunction ``functools[...]``, Apertus ``<|tools_prefix|>``; with ``bare`` also a run of
objects without brackets (MiniMax-M1 ``<tool_calls>`` one per line, Llama-3 ``{...}; {...}``).

Each element streams like a Hermes call: once it reads ``{"name": "f", "arguments": {`` (in the
family's key spelling) the call is announced and its arguments forwarded verbatim; other shapes
are parsed whole when the element's object closes. A list cut off by the close marker or the
end keeps the calls already announced and sets ``malformed_tool_call``.
"""

from __future__ import annotations

from ..families.shapes import ListSpec
from .base import Region, find_first, malformed
from .jsoncalls import (
    JSON_WS,
    ValueScanner,
    match_head,
    parse_call_object,
    parse_keyed_call,
)
from .markers import split_safe
from .types import STATUS_MALFORMED_TOOL_CALL, ArgsDelta, CallEnd, CallStart, Event, Issue, Text

#: Element text examined for a streamable head (as ``hermes.HEAD_LIMIT``).
HEAD_LIMIT = 1024


_START, _BETWEEN, _ELEM, _AFTER = "start", "between", "elem", "after"


class JsonCallList(Region):
    """A list of call objects (see the module docstring)."""

    def __init__(self, opener: str, spec: ListSpec) -> None:
        self._opener = opener
        self._spec = spec
        self._state = _START
        self._bracketed = False
        self._elem: list[str] = []  # raw text of the current element
        self._elem_len = 0
        self._elem_scan = ValueScanner(depth=0)
        self._committed = False
        self._name = ""
        self._args: list[str] = []
        self._args_scan: ValueScanner | None = None
        self._calls = 0

    # -- driver --------------------------------------------------------------------------------

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._state == _ELEM:
            return self._step_elem(buf, final, out)
        closes = self._spec.closes
        i = 0
        while i < len(buf) and buf[i] in JSON_WS:
            i += 1
        if self._state == _START:
            for prefix in self._spec.prefix:
                if buf.startswith(prefix, i):
                    i += len(prefix)
                    while i < len(buf) and buf[i] in JSON_WS:
                        i += 1
                    break
                if prefix.startswith(buf[i:]) and not final:
                    return 0, False
        rest = buf[i:]
        complete = self._state == _AFTER or (
            self._state == _BETWEEN and not self._bracketed and self._calls > 0
        )
        if not rest:
            if not final:
                return 0, False
            if self._state == _START:
                malformed(out, self._opener + buf)
            elif not complete:
                out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            return len(buf), True
        at, marker = find_first(rest, closes)
        if at == 0:  # the region closes here
            if self._state == _START:
                malformed(out, self._opener + buf[: i + len(marker)])
            elif not complete:
                out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            return i + len(marker), True
        if not final and any(m.startswith(rest) for m in closes):
            return 0, False
        ch = rest[0]
        if self._state == _START:
            if ch == "[":
                self._bracketed = True
                self._state = _BETWEEN
                return i + 1, False
            if ch == "{" and self._spec.bare:
                self._state = _BETWEEN
                return i, False
            # not a list: the opener and what follows are content
            if self._spec.lenient:
                out.append(Text(self._opener))
            else:
                malformed(out, self._opener)
            return 0, True
        if self._state == _BETWEEN:
            if ch == "{":
                self._begin_elem()
                return i, False
            if self._bracketed and ch == "]":
                self._state = _AFTER
                return i + 1, not closes
            if ch in self._spec.seps and self._calls:
                return i + 1, False
            if not self._bracketed:  # a bare run simply ends; the rest is content
                if closes:
                    out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
                return i, True
        # junk where a separator, an element, ``]`` or the close marker was expected
        if not closes or final:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            return i, True
        if at < 0:
            return 0, False  # wait for the close marker, then keep the junk as content
        malformed(out, rest[:at])
        return i + at + len(marker), True

    # -- elements ------------------------------------------------------------------------------

    def _begin_elem(self) -> None:
        self._state = _ELEM
        self._elem, self._elem_len = [], 0
        self._elem_scan = ValueScanner(depth=0)
        self._committed = False
        self._name, self._args, self._args_scan = "", [], None

    def _step_elem(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        closes = self._spec.closes
        stop, _ = find_first(buf, closes)
        if stop >= 0:
            avail = buf[:stop]
        elif final or not closes:
            avail = buf
        else:
            avail, _ = split_safe(buf, closes)
        if not self._committed:
            seen = "".join(self._elem) + avail
            head = match_head(
                seen[:HEAD_LIMIT], self._spec.name_keys, self._spec.args_keys, self._spec.keyed
            )
            if head.status == "match":
                used = head.end - self._elem_len
                self._elem_scan.feed(avail[:used])  # cannot close: the head ends inside it
                self._take(avail[:used])
                self._committed = True
                self._name = head.name
                self._args_scan = ValueScanner(depth=1)
                out.append(CallStart(head.name))
                self._emit_args("{", out)
                return used, False
        end = self._elem_scan.feed(avail)
        piece = avail if end is None else avail[:end]
        self._take(piece)
        if self._args_scan is not None:
            args_end = self._args_scan.feed(piece)
            self._emit_args(piece if args_end is None else piece[:args_end], out)
            if args_end is not None:
                self._args_scan = None
        if end is not None:
            self._finish_elem(out)
            self._state = _BETWEEN
            return len(piece), False
        if stop >= 0 or final:  # the element was cut off by the close marker or the end
            self._cut_elem(out)
            self._state = _AFTER
            return len(piece), final and stop < 0
        return len(piece), False

    def _take(self, text: str) -> None:
        if text:
            self._elem.append(text)
            self._elem_len += len(text)

    def _emit_args(self, text: str, out: list[Event]) -> None:
        if text:
            self._args.append(text)
            out.append(ArgsDelta(text))

    def _parse(self, text: str) -> tuple[str, str] | None:
        if self._spec.keyed:
            return parse_keyed_call(text)
        return parse_call_object(text, self._spec.args_keys, self._spec.name_keys)

    def _finish_elem(self, out: list[Event]) -> None:
        text = "".join(self._elem)
        parsed = self._parse(text)
        self._calls += 1
        if self._committed:
            if parsed != (self._name, "".join(self._args)):
                out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            out.append(CallEnd())
        elif parsed is not None:
            out += [CallStart(parsed[0]), ArgsDelta(parsed[1]), CallEnd()]
        elif self._spec.strict:
            malformed(out, text)
        else:
            out.append(Text(text))

    def _cut_elem(self, out: list[Event]) -> None:
        if self._committed:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            out.append(CallEnd())
        else:
            malformed(out, "".join(self._elem))
