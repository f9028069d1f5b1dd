"""A call written as ``<open> HEADER {json arguments} [TAIL <close>]``.

The common shape of DeepSeek (``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``),
Kimi-K2 (``<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}``), Mistral
(``[TOOL_CALLS]name[ARGS]{...}``), Solar, Functionary (``<function=name>{...}</function>``) and
more: everything before the first ``{`` is the header, a family regex takes the name out of it,
and the arguments are forwarded verbatim as the model writes them.

Streaming policy: the call is announced when its header is complete (the ``{`` arrives) and
matches; the arguments text then streams until its JSON value closes, whatever comes next. A
header that does not match is returned as content with ``malformed_tool_call``; arguments cut
off by the close marker or the end, invalid JSON, or junk before the close marker keep the call
but set the status.
"""

from __future__ import annotations

from ..families.shapes import TaggedSpec
from .base import Region, find_first, is_json_object, malformed
from .jsoncalls import ValueScanner
from .markers import split_safe
from .types import STATUS_MALFORMED_TOOL_CALL, ArgsDelta, CallEnd, CallStart, Event, Issue, Text

_HEADER, _ARGS, _TAIL = "header", "args", "tail"


class TaggedJsonCall(Region):
    """One call in the tagged-JSON shape (see the module docstring)."""

    def __init__(self, opener: str, spec: TaggedSpec, name: str | None = None) -> None:
        """``name``: already known from elsewhere (a message header); the header must be blank."""
        self._opener = opener
        self._spec = spec
        self._known = name
        self._state = _HEADER
        self._args: list[str] = []
        self._tail = ""
        self._scanner = ValueScanner(depth=0)

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._state == _HEADER:
            return self._step_header(buf, final, out)
        if self._state == _ARGS:
            return self._step_args(buf, final, out)
        return self._step_tail(buf, final, out)

    def _step_header(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        brace, _ = self.find(buf, ("{",))
        stop, marker = self.find(buf, self._spec.closes + self._spec.aborts)
        if brace >= 0 and (stop < 0 or brace < stop):
            header = buf[:brace]
            name = self._name(header)
            if name is None:
                malformed(out, self._opener + header)
                return brace, True
            out.append(CallStart(name))
            self._state = _ARGS
            return brace, False
        if stop >= 0:  # the call closed (or the next began) before any arguments
            end = stop + len(marker) if marker in self._spec.closes else stop
            malformed(out, self._opener + buf[:end])
            return end, True
        if final:
            malformed(out, self._opener + buf)
            return len(buf), True
        return 0, False

    def _name(self, header: str) -> str | None:
        if self._known is not None:
            return self._known if not header.strip() else None
        for pattern in self._spec.headers:
            m = pattern.fullmatch(header)
            if m and m.group("name"):
                return m.group("name").strip()
        return None

    def _step_args(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        closes = self._spec.closes
        stop, marker = find_first(buf, closes)
        if stop >= 0:
            avail = buf[:stop]
        elif final or not closes:
            avail = buf
        else:
            avail, _ = split_safe(buf, closes)
        end = self._scanner.feed(avail)
        piece = avail if end is None else avail[:end]
        if piece:
            self._args.append(piece)
            out.append(ArgsDelta(piece))
        if end is not None:
            if not closes:
                self._end(out, ok=True)
                return end, True
            self._state = _TAIL
            return end, False
        if stop >= 0:  # close marker inside the arguments: cut off
            self._end(out, ok=False)
            return stop + len(marker), True
        if final:
            self._end(out, ok=False)
            return len(avail), True
        return len(piece), False

    def _step_tail(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        stop, marker = self.find(buf, self._spec.closes + self._spec.aborts)
        if stop >= 0:
            tail = buf[:stop]
            ok = self._spec.tail.fullmatch(tail) is not None
            if marker in self._spec.closes:
                self._end(out, ok=ok)
                return stop + len(marker), True
            self._end(out, ok=False)  # the next call began: the close marker is missing
            if tail.strip():
                out.append(Text(tail))
            return stop, True
        if final:
            ok = self._spec.close_at_end and self._spec.tail.fullmatch(buf) is not None
            self._end(out, ok=ok)
            if not ok and buf.strip():
                out.append(Text(buf))
            return len(buf), True
        return 0, False

    def _end(self, out: list[Event], ok: bool) -> None:
        if not ok or not is_json_object("".join(self._args)):
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
        out.append(CallEnd())
