"""The call-syntax shapes a family record can name: how a family writes its calls, as data.

Each is read by one of the parsing package's shared regions (``parsing.tagged``,
``parsing.jsonlist``, ``parsing.xmlcalls``); they live here, below the parsers, so that the
family table is data the chat layer can read without importing any parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: The keys a JSON call object may hold its arguments under.
ARGS_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class TaggedSpec:
    """How one family writes a call after its opening marker.

    ``headers``: regexes, the first that fully matches the header gives group ``name``.
    ``closes``: markers ending the call (empty: the call ends with its JSON value).
    ``tail``: regex the text between the arguments and the close marker may hold.
    ``aborts``: markers that, seen where a close marker is awaited, end the call early
    (the next call's opener when a model skips the close).
    ``close_at_end``: the completion may end instead of the close marker (when the close
    marker is the stop token, which is not part of the parsed text: gpt-oss ``<|call|>``).
    """

    headers: tuple[re.Pattern[str], ...] = ()
    closes: tuple[str, ...] = ()
    tail: re.Pattern[str] = re.compile(r"\s*")
    aborts: tuple[str, ...] = ()
    close_at_end: bool = False


@dataclass(frozen=True)
class ListSpec:
    """How one family writes its list.

    ``closes``: markers ending the list region (empty: it ends after ``]``).
    ``name_keys``/``args_keys``: member names; ``keyed``: ``{"<name>": {args}}`` elements.
    ``bare``: objects may follow the opener without ``[`` (then separated by ``seps``).
    ``prefix``: text allowed (and dropped) between the opener and the list, e.g. "```json".
    ``strict``: an element that is not a call is malformed (False: it is content, for formats
    such as Llama-3 where a JSON answer and a call look alike).
    ``lenient``: an opener not followed by a list is plain content, not a malformed call (for
    openers that are ordinary words, like Command-R's ``Action:``).
    """

    closes: tuple[str, ...] = ()
    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ARGS_KEYS
    keyed: bool = False
    bare: bool = False
    seps: str = ","
    prefix: tuple[str, ...] = ()
    strict: bool = True
    lenient: bool = False


@dataclass(frozen=True)
class XmlSpec:
    """Markers of one XML-style family (see the module docstring for examples).

    ``call_open``: marker starting each call inside the region; None when the region's opener
    starts the call itself (GLM, MiniCPM5). ``name_ends``: markers that end the call header
    (consumed); ``param_open``/``call_close`` also end it (not consumed). ``name_re``: full
    match on the header, group ``name``. ``param_re``: full match on the text between
    ``param_open`` and ``param_head_end``, group ``key`` and optionally ``string``
    (``true``/``false``) or ``type`` (a type name). ``value_open``: marker that follows the
    parameter header before the value (GLM ``<arg_value>``). ``region_close``: marker ending
    the region when it holds several calls. ``trim_newline``: drop one newline at each end of a
    value (Qwen3-Coder writes ``<parameter=k>\\nvalue\\n</parameter>``). ``cdata``: a value may be
    wrapped in ``<![CDATA[…]]>`` (MiniCPM5 does so for text with ``<``, ``&`` or newlines), inside
    which close tags do not count.
    """

    call_open: str | None
    name_ends: tuple[str, ...]
    param_open: str
    param_head_end: str
    param_close: str
    call_close: str
    region_close: str | None = None
    value_open: str = ""
    name_re: re.Pattern[str] = re.compile(r"\s*(?P<name>[^\s<>\"]+)\s*")
    param_re: re.Pattern[str] = re.compile(r"\s*(?P<key>[^<>\"]+?)\s*")
    trim_newline: bool = False
    cdata: bool = False

    @classmethod
    def attribute_tags(
        cls,
        call: str,
        param: str,
        region_close: str | None = None,
        *,
        opened: bool = False,
        **more: Any,
    ) -> XmlSpec:
        """``<CALL name="NAME"><PARAM name="K">V</PARAM></CALL>`` (MiniMax-M2, DSML, Glimmer,
        MiniCPM5); ``opened``: the region's opener is the call's own open tag."""
        return cls(
            None if opened else f'<{call} name="',
            ('">',),
            f'<{param} name="',
            '">',
            f"</{param}>",
            f"</{call}>",
            region_close,
            **more,
        )

    @classmethod
    def function_tags(cls, region_close: str, **more: Any) -> XmlSpec:
        """``<function=NAME><parameter=K>V</parameter></function>`` (Qwen3-Coder, Seed-OSS)."""
        return cls(
            "<function=",
            (">",),
            "<parameter=",
            ">",
            "</parameter>",
            "</function>",
            region_close,
            **more,
        )

    @classmethod
    def key_value_tags(
        cls,
        suffix: str = "",
        call_open: str | None = None,
        name_ends: tuple[str, ...] = ("\n",),
        region_close: str | None = None,
    ) -> XmlSpec:
        """``NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``, every tag name
        ending in ``suffix`` (GLM-4.5+; Hunyuan 3 with ``:opensource``)."""
        return cls(
            call_open,
            name_ends,
            f"<arg_key{suffix}>",
            f"</arg_key{suffix}>",
            f"</arg_value{suffix}>",
            f"</tool_call{suffix}>",
            region_close,
            value_open=f"<arg_value{suffix}>",
        )

    @property
    def markers(self) -> tuple[str, ...]:
        found = (
            self.call_open,
            *self.name_ends,
            self.param_open,
            self.param_head_end,
            self.param_close,
            self.call_close,
            self.region_close,
            self.value_open,
        )
        return tuple(m for m in found if m and m.strip())
