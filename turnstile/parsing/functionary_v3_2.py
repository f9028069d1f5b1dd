"""MeetKai Functionary v3.2 tool calls (v3.1 is a row of ``families``).

Messages ``>>>RECIPIENT\\nBODY``; recipient ``all`` is text for the user,
any other is a call whose body is its JSON arguments (``python`` may carry raw code). The
generation prompt already ends with the first ``>>>``.
"""

from __future__ import annotations

import json

from .base import Region, RegionParser, find_first, malformed
from .markers import split_safe
from .tagged import TaggedJsonCall, TaggedSpec
from .types import ArgsDelta, CallEnd, CallStart, Event, Text

NEXT = ">>>"
V32_ARGS = TaggedSpec(aborts=(NEXT,))


class _V32Message(Region):
    """One ``>>>recipient\\nbody`` message (the ``>>>`` already consumed)."""

    def __init__(self, opener: str) -> None:
        self._opener = opener
        self._recipient: str | None = None
        self._inner: Region | None = None

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        if self._inner is not None:
            return self._inner.advance(buf, final, out)
        if self._recipient is None:
            nl, _ = self.find(buf, ("\n",))
            stop, _ = self.find(buf, (NEXT,))
            if nl < 0 or (0 <= stop < nl):
                if final or stop >= 0:
                    end = stop if stop >= 0 else len(buf)
                    malformed(out, self._opener + buf[:end])
                    return end, True
                return 0, False
            recipient = buf[:nl].strip()
            if not recipient or any(c.isspace() for c in recipient):
                malformed(out, self._opener + buf[: nl + 1])
                return nl + 1, True
            self._recipient = recipient
            return nl + 1, False
        if self._recipient == "all":
            at, _ = find_first(buf, (NEXT,))
            if at >= 0:
                if at:
                    out.append(Text(buf[:at]))
                return at, True
            safe, _ = (buf, "") if final else split_safe(buf, (NEXT,))
            if safe:
                out.append(Text(safe))
            return len(safe), final
        stripped = buf.lstrip()
        if not stripped and not final:
            return 0, False
        if stripped.startswith("{") or self._recipient != "python":
            self._inner = TaggedJsonCall(
                self._opener + self._recipient + "\n", V32_ARGS, name=self._recipient
            )
            return self._inner.advance(buf, final, out)
        at, _ = self.find(buf, (NEXT,))  # python with raw code
        if at < 0 and not final:
            return 0, False
        code = buf if at < 0 else buf[:at]
        args = json.dumps({"code": code}, ensure_ascii=False)
        out += [CallStart("python"), ArgsDelta(args), CallEnd()]
        return len(code), True


class FunctionaryV32ToolParser(RegionParser):
    """``>>>recipient`` messages."""

    openers = (NEXT,)
    markers = (NEXT,)

    def initial_region(self) -> Region | None:
        return _V32Message("")

    def open_region(self, marker: str) -> Region:
        return _V32Message(marker)
