"""Calls written as tags with one text value per parameter (no JSON around the arguments).

One configurable region covers the XML-style families:

- Qwen3-Coder/3.5: ``<tool_call><function=NAME><parameter=K>\\nV\\n</parameter></function>…``
- Seed-OSS: the same inside ``<seed:tool_call>``
- GLM-4.5+ (Laguna…): ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``
- Hunyuan 3: the GLM shape with ``:opensource`` tags and ``<tool_sep:opensource>``
- MiniMax-M2: ``<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>…``
- DeepSeek V3.2/V4: ``<｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true">V…``
- MiniCPM5: ``<function name="NAME"><param name="K">V</param></function>``
- Kimi-K3: ``<|open|>call tool="NAME"…<|sep|><|open|>argument key="K" type="string"<|sep|>V…``

Values are text; ``base.convert_value`` types them from the format's own hint (``string=``,
``type=``), the request's tool schema, or a JSON/Python-literal guess. Streaming: the call is
announced once its name is complete; a value known to be a string (by the format's hint or the
schema) streams as it arrives (``{"code": "`` then escaped text, then ``"``), any other value
becomes one arguments fragment when its close tag arrives (``, "days": 3``), and ``}`` ends.
"""

from __future__ import annotations

import json

from ..families.shapes import XmlSpec
from .base import ArgsWriter, Region, convert_value, find_first, malformed
from .markers import split_safe
from .types import (
    STATUS_MALFORMED_TOOL_CALL,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Issue,
    ToolSchemas,
)

CDATA, CDATA_END = "<![CDATA[", "]]>"
_BETWEEN, _HEAD, _PARAMS, _PHEAD, _VOPEN, _VALUE = (
    "between",
    "head",
    "params",
    "param_head",
    "value_open",
    "value",
)


class XmlCalls(Region):
    """A region of XML-style calls (see the module docstring)."""

    def __init__(self, opener: str, spec: XmlSpec, tools: ToolSchemas | None = None) -> None:
        self._opener = opener
        self._spec = spec
        self._tools = tools
        self._state = _HEAD if spec.call_open is None else _BETWEEN
        self._raw = opener if spec.call_open is None else ""  # text of the call so far
        self._name = ""
        self._key = ""
        self._hint: str | None = None
        self._writer = ArgsWriter()
        self._opened = False  # a streamed string value has been opened
        self._calls = 0

    def step(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        handler = {
            _BETWEEN: self._between,
            _HEAD: self._head,
            _PARAMS: self._params,
            _PHEAD: self._param_head,
            _VOPEN: self._value_open,
            _VALUE: self._value,
        }[self._state]
        return handler(buf, final, out)

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _at_marker(buf: str, i: int, markers: tuple[str, ...], final: bool) -> str | None:
        """The marker at ``buf[i:]``, "" if ``buf[i:]`` may still become one, else None."""
        rest = buf[i:]
        for marker in markers:
            if rest.startswith(marker):
                return marker
        if not final and any(m.startswith(rest) for m in markers):
            return ""
        return None

    @staticmethod
    def _skip_ws(buf: str, i: int = 0) -> int:
        while i < len(buf) and buf[i].isspace():
            i += 1
        return i

    def _end_call(self, out: list[Event], ok: bool) -> None:
        out.append(ArgsDelta(self._writer.close()))
        if not ok:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
        out.append(CallEnd())
        self._calls += 1
        self._writer = ArgsWriter()
        self._raw = ""

    def _after_call(self) -> bool:
        """Back between calls; True when the region ends with the call (one call per region)."""
        self._state = _BETWEEN
        return self._spec.call_open is None

    # -- states --------------------------------------------------------------------------------

    def _between(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        spec = self._spec
        i = self._skip_ws(buf)
        if i == len(buf):
            if final:
                if not self._calls:
                    malformed(out, self._opener + buf)
                else:
                    out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
                return len(buf), True
            return 0, False
        closers = (spec.region_close,) if spec.region_close else ()
        marker = self._at_marker(buf, i, (spec.call_open or "", *closers), final)
        if marker == "":
            return 0, False
        if marker is not None and marker == spec.region_close:
            if not self._calls:
                malformed(out, self._opener + buf[: i + len(marker)])
            return i + len(marker), True
        if marker == spec.call_open and marker:
            self._state = _HEAD
            self._raw = marker
            return i + len(marker), False
        # junk where a call or the end of the region was expected: the rest is content
        if not self._calls:
            malformed(out, self._opener)
        else:
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
        return 0, True

    def _head(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        spec = self._spec
        ends = spec.name_ends + (spec.param_open, spec.call_close)
        at, marker = self.find(buf, ends)
        if at < 0:
            if final:
                malformed(out, self._raw + buf)
                return len(buf), True
            return 0, False
        m = spec.name_re.fullmatch(buf[:at])
        if m is None or not m.group("name"):
            malformed(out, self._raw + buf[:at])
            return at, True
        self._name = m.group("name")
        out.append(CallStart(self._name))
        self._state = _PARAMS
        used = at + len(marker) if marker in spec.name_ends else at
        return used, False

    def _params(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        spec = self._spec
        i = self._skip_ws(buf)
        if i == len(buf) and not final:
            return 0, False
        marker = self._at_marker(buf, i, (spec.call_close, spec.param_open), final)
        if marker == "":
            return 0, False
        if marker == spec.call_close:
            self._end_call(out, ok=True)
            return i + len(marker), self._after_call()
        if marker == spec.param_open:
            self._state = _PHEAD
            return i + len(marker), False
        # the call ends without its close tag (end of text, region close, or junk)
        self._end_call(out, ok=False)
        return i, True

    def _param_head(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        spec = self._spec
        at, marker = self.find(buf, (spec.param_head_end, spec.param_close, spec.call_close))
        if at < 0:
            if final:
                self._end_call(out, ok=False)
                return len(buf), True
            return 0, False
        m = spec.param_re.fullmatch(buf[:at]) if marker == spec.param_head_end else None
        if m is None or not m.group("key"):
            self._end_call(out, ok=False)
            return at, True
        groups = m.groupdict()
        self._key = m.group("key")
        self._hint = None
        if groups.get("string"):
            self._hint = "string" if groups["string"] == "true" else "json"
        elif groups.get("type"):
            self._hint = "string" if groups["type"] == "string" else "json"
        self._state = _VOPEN if spec.value_open else _VALUE
        return at + len(marker), False

    def _value_open(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        i = self._skip_ws(buf)
        marker = self._at_marker(buf, i, (self._spec.value_open,), final)
        if marker == "" or (i == len(buf) and not final):
            return 0, False
        if marker:
            self._state = _VALUE
            return i + len(marker), False
        self._end_call(out, ok=False)
        return i, True

    def _value(self, buf: str, final: bool, out: list[Event]) -> tuple[int, bool]:
        spec = self._spec
        if spec.cdata and (buf.startswith(CDATA) or (CDATA.startswith(buf) and not final)):
            end, _ = self.find(buf, (CDATA_END,), len(CDATA))
            if end < 0 and not final:
                return 0, False
            if end >= 0:
                rest = buf[end + len(CDATA_END) :]
                i = self._skip_ws(rest)
                if rest.startswith(spec.param_close, i):
                    self._member(buf[len(CDATA) : end], out, cdata=True)
                    self._state = _PARAMS
                    return end + len(CDATA_END) + i + len(spec.param_close), False
                if not final and spec.param_close.startswith(rest[i:]):
                    return 0, False
        closers = [spec.param_close, spec.call_close]
        if spec.region_close:
            closers.append(spec.region_close)
        if self._streams_string():
            return self._string_value(buf, final, out, tuple(closers))
        at, marker = self.find(buf, tuple(closers))
        if at < 0 and not final:
            return 0, False
        raw = buf if at < 0 else buf[:at]
        self._member(raw, out)
        if marker == spec.param_close:
            self._state = _PARAMS
            return at + len(marker), False
        out.append(Issue(STATUS_MALFORMED_TOOL_CALL))  # value not closed
        self._state = _PARAMS
        return len(raw), False

    def _streams_string(self) -> bool:
        """Whether the current value is known to be a string, so it can stream as it comes."""
        if self._spec.cdata:  # the value may turn out to be a CDATA block
            return False
        if self._hint is not None:
            return self._hint == "string"
        types = self._tools.types(self._name, self._key) if self._tools else None
        return types is not None and types <= {"string"}

    def _string_value(
        self, buf: str, final: bool, out: list[Event], closers: tuple[str, ...]
    ) -> tuple[int, bool]:
        """Stream a string value: ``"key": "`` first, then escaped text as it arrives."""
        trim = self._spec.trim_newline
        used = 0
        if not self._opened:
            if trim and not buf and not final:
                return 0, False  # the first character decides whether a newline is dropped
            if trim and buf.startswith("\n"):
                used = 1
            out.append(ArgsDelta(self._writer.open(self._key) + '"'))
            self._opened = True
        at, marker = find_first(buf, closers, used)
        if at >= 0:
            text = buf[used:at]
            if trim:
                text = text.removesuffix("\n")
            self._string_piece(text + '"', out, escape_upto=len(text))
            self._opened = False
            self._state = _PARAMS
            if marker == self._spec.param_close:
                return at + len(marker), False
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))  # value not closed
            return at, False
        if final:
            self._string_piece(buf[used:] + '"', out, escape_upto=len(buf) - used)
            self._opened = False
            self._state = _PARAMS
            out.append(Issue(STATUS_MALFORMED_TOOL_CALL))
            return len(buf), False
        safe, _ = split_safe(buf[used:], closers)
        if trim and safe.endswith("\n"):
            safe = safe[:-1]  # may be the newline before the close tag
        self._string_piece(safe, out, escape_upto=len(safe))
        return used + len(safe), False

    @staticmethod
    def _string_piece(text: str, out: list[Event], escape_upto: int) -> None:
        piece = json.dumps(text[:escape_upto], ensure_ascii=False)[1:-1] + text[escape_upto:]
        if piece:
            out.append(ArgsDelta(piece))

    def _member(self, raw: str, out: list[Event], cdata: bool = False) -> None:
        if self._spec.trim_newline and not cdata:
            raw = raw.removeprefix("\n").removesuffix("\n")
        types = self._tools.types(self._name, self._key) if self._tools else None
        value = convert_value(raw, types, self._hint)
        out.append(ArgsDelta(self._writer.member(self._key, value)))
