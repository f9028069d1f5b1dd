"""Tool-call IDs in the style a model family's template expects.

The ID we return is echoed by the harness and rendered by the template in later prompts, so it
must be one the template accepts and the engine would have produced:

- ``openai``: ``call_`` + 24 hex characters (what most servers hand out);
- ``mistral9``: 9 alphanumeric characters (Mistral templates refuse any other length);
- ``kimi``: ``functions.<name>:<n>``, ``n`` counting the conversation's tool calls from 0
  (what Kimi-K2 was trained on and what vLLM's Kimi parser returns).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

ID_STYLES = ("openai", "mistral9", "kimi")
_ALNUM = string.ascii_letters + string.digits
# IDs need to be unique, not secret: Python's generator (seeded from the OS at start) costs a
# fraction of a system call per ID.
_random = random.Random()


def hex_id(prefix: str = "call_") -> str:
    """``prefix`` + 24 random hex characters."""
    return f"{prefix}{_random.getrandbits(96):024x}"


def id_factory(style: str, offset: int = 0) -> Callable[[int, str], str]:
    """``(index in this reply, function name) -> id``; ``offset`` is the number of tool calls
    earlier in the conversation (Kimi numbers them across the conversation)."""
    if style == "mistral9":
        return lambda _i, _name: "".join(_random.choices(_ALNUM, k=9))
    if style == "kimi":
        return lambda i, name: f"functions.{name}:{offset + i}"
    if style == "openai":
        return lambda _i, _name: hex_id()
    raise ValueError(f"unknown tool-call ID style {style!r}; expected one of {ID_STYLES}")


def calls_before(messages: list[dict]) -> int:
    """How many tool calls the conversation's assistant turns already made."""
    return sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")


def id_offset(style: str, messages: list[dict]) -> int:
    """The ``offset`` of :func:`id_factory` for a reply to ``messages``: only Kimi's IDs count
    the conversation's calls (the walk over a long history is not made for the others)."""
    return calls_before(messages) if style == "kimi" else 0
