"""Splits a completion into reasoning and content around a leading ``<think>…</think>`` block.

Only a block at the very start (after optional whitespace) counts, or one the prompt already
opened (``started``): a ``<think>`` later in the answer is ordinary text, and so is anything
inside the block, tool-call markers included. Leading newlines after ``</think>`` are dropped
because Qwen-style templates put ``\\n\\n`` there, and so is a close tag at the very start with no
open tag (MiniMax-M3 and GLM-style templates write a bare ``</think>`` to skip reasoning). The
markers are parameters so families with other spellings (``<seed:think>``,
``<|START_THINKING|>``, ``[THINK]``...) reuse this; an empty open tag with ``started`` serves
templates whose reasoning has no opening marker at all (Apriel).
"""

from __future__ import annotations

from typing import Literal

from .markers import split_safe

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]

_START = "start"  # nothing but whitespace (or a prefix of the open tag) seen so far
_REASONING = "reasoning"
_AFTER = "after"  # just after the close tag, dropping newlines
_CONTENT = "content"


class ThinkSplitter:
    """Incremental reasoning/content splitter for one completion."""

    def __init__(
        self, started: bool = False, open_tag: str = "<think>", close_tag: str = "</think>"
    ) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._state = _REASONING if started else _START
        self._pending = ""
        #: Whether a reasoning block was opened (by the prompt or by the completion).
        self.opened = started

    @property
    def in_reasoning(self) -> bool:
        """True while inside the block; after ``finish`` it means the block never closed."""
        return self._state == _REASONING

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        return out

    def _step(self, out: list[Piece], final: bool) -> bool:
        text = self._pending
        if self._state == _START:
            stripped = text.lstrip()
            if self.open_tag and stripped.startswith(self.open_tag):
                self._pending = stripped[len(self.open_tag) :]
                self._state = _REASONING
                self.opened = True
                return True
            if stripped.startswith(self.close_tag):
                # A close tag with no open one: templates that switch reasoning off (or models
                # that skip it) write it at the start; it is not content.
                self._pending = stripped[len(self.close_tag) :]
                self._state = _AFTER
                return True
            tags = (self.open_tag, self.close_tag)
            if not final and any(tag.startswith(stripped) for tag in tags if tag):
                return False  # whitespace or a prefix of a tag: wait
            self._state = _CONTENT
            return True
        if self._state == _REASONING:
            close_at = text.find(self.close_tag)
            if close_at >= 0:
                self._add(out, "reasoning", text[:close_at])
                self._pending = text[close_at + len(self.close_tag) :]
                self._state = _AFTER
                return True
            safe, held = (text, "") if final else split_safe(text, (self.close_tag,))
            self._add(out, "reasoning", safe)
            self._pending = held
            return False
        if self._state == _AFTER:
            stripped = text.lstrip("\r\n")
            self._pending = stripped
            if stripped:
                self._state = _CONTENT
                return True
            return False
        self._add(out, "content", text)
        self._pending = ""
        return False

    @staticmethod
    def _add(out: list[Piece], kind: Kind, text: str) -> None:
        if text:
            out.append((kind, text))
