"""The answer types, at the bottom of the answer path: what a gateway hands every dialect, and
what each dialect renders its own wire from (Chat Completions chunks, Responses events,
Anthropic Messages events, Gemini responses). Nothing here knows a wire shape, an engine or the
store.

A streamed call is a run of :data:`Event` values: :class:`Started`, then text, reasoning and
tool-call events as the parser finds them (each token batch's :class:`TokenLogprobs` just before
that batch's first text, reasoning or tool-call event), and :class:`Done` with the finished
:class:`Answer` once the call is recorded. A whole call is its :class:`Answer`.

Capture mode (the engine renders and answers in Chat Completions) passes the engine's own
answer through as :class:`Relayed`: only the Chat dialect serves that mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Usage:
    """The call's token counts (``cached_tokens``: prompt tokens the engine had cached)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = 0

    @classmethod
    def of(cls, usage: Mapping[str, Any]) -> Usage:
        """From a recorded call's ``info["usage"]``."""
        return cls(
            usage["prompt_tokens"], usage["completion_tokens"], usage.get("cached_tokens", 0)
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """A finished, recorded call, as every dialect renders it.

    ``message`` is the assistant message as the record keeps it (``content``,
    ``reasoning_content``, ``tool_calls``: ``{id, type, function: {name, arguments}}``).
    ``finish_reason`` is the call's: ``"length"`` when the token limit cut it (even inside a
    tool call), ``"tool_calls"`` when it ended with finished calls, else the engine's (``"stop"``);
    ``stop_string`` the stop string that ended it, if one did. ``logprobs`` are the sampled
    tokens' entries (``{token, logprob, bytes, top_logprobs}``, end-of-turn tokens left out)
    when the request asked for them, else None."""

    call_id: str
    message: dict
    finish_reason: str
    stop_string: str | None
    usage: Usage
    started: float  # when the call began (its ``created`` time)
    model: str  # the model name the call answers as
    logprobs: list[dict] | None = None

    @property
    def cut_by_length(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True, slots=True)
class Relayed:
    """Capture mode: the engine's own Chat Completions answer (a whole ``chat.completion``, or
    one chunk of a stream), passed through to the harness as the engine sent it."""

    body: dict


# --- the events of a streamed call -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The call was admitted and its engine answered: the stream begins (``started``: when the
    call began)."""

    started: float


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Content text (may be empty: a batch of tokens whose text is held back, when the batch's
    logprobs must still leave)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A new tool call, number ``index`` of the answer; ``arguments``: the first fragment of
    its arguments JSON text when it came with the name."""

    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolArgumentsDelta:
    """A fragment of tool call ``index``'s arguments JSON text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """Tool call ``index`` is complete (well-formed or not)."""

    index: int


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The logprob entries of the tokens whose text, reasoning or call fragment comes next."""

    entries: list[dict]


@dataclass(frozen=True, slots=True)
class Done:
    """The call is recorded: its finished answer (finish reason, usage, the whole message)."""

    answer: Answer


#: what a streamed call hands its dialect, in order
Event = (
    Started
    | TextDelta
    | ReasoningDelta
    | ToolCallStart
    | ToolArgumentsDelta
    | ToolCallEnd
    | TokenLogprobs
    | Done
    | Relayed
)

#: the events that carry a part of the answer (what a batch's logprobs attach to)
Delta = TextDelta | ReasoningDelta | ToolCallStart | ToolArgumentsDelta


class Streamed(Protocol):
    """A streamed call's events, as the dialect iterates them (errors raised in-band)."""

    def __aiter__(self) -> AsyncIterator[Event]: ...


class RecordedCall(Protocol):
    """A call as a session's records keep it, as far as a dialect reads one back (the
    Responses dialect rebuilds earlier responses from them); the store's record is one."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def message(self) -> dict | None: ...

    @property
    def info(self) -> dict: ...


class CallReader(Protocol):
    """A session's recorded calls, in order."""

    def calls(self, session_id: str) -> Sequence[RecordedCall]: ...
