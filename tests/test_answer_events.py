"""The parser's answer events (``turnstile.answer``) against the parser's own whole-text result
and its Chat Completions view: however the text is chunked, the events rebuild the parsed
message, every started tool call is ended once, and the Chat renderer turns them into exactly
the deltas ``Parser.feed`` has always returned."""

from __future__ import annotations

import pytest

from turnstile.answer import (
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprobs,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from turnstile.dialects.chat.answer import Chunks
from turnstile.parsing import Parser, parse

pytestmark = pytest.mark.unit

TEXT = (
    "<think>\nweigh it</think>\n\nLet me look. "
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
    '<tool_call>\n{"name": "g", "arguments": {"b": "x"}}\n</tool_call>'
)


def _ids(index: int, name: str) -> str:
    return f"call_{index}"


def _events(pieces: list[str]) -> list:
    p = Parser(True, "hermes", id_factory=_ids)
    out = []
    for piece in pieces:
        out += p.feed_events(piece)
    return out + p.finish_events()


@pytest.mark.parametrize("size", [1, 3, 7, len(TEXT)])
def test_events_rebuild_the_parsed_message(size: int) -> None:
    events = _events([TEXT[i : i + size] for i in range(0, len(TEXT), size)])
    whole = parse(TEXT, True, "hermes", id_factory=_ids)
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls: dict[int, dict] = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index not in calls
            calls[e.index] = {"id": e.id, "name": e.name, "args": e.arguments, "ended": 0}
        elif isinstance(e, ToolArgumentsDelta):
            assert not calls[e.index]["ended"]
            calls[e.index]["args"] += e.text
        elif isinstance(e, ToolCallEnd):
            calls[e.index]["ended"] += 1
    assert content == whole.content
    assert reasoning == whole.reasoning_content
    assert [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
        for c in calls.values()
    ] == whole.tool_calls
    assert [c["ended"] for c in calls.values()] == [1, 1]


def test_the_chat_renderer_gives_the_parsers_chat_deltas() -> None:
    pieces = [TEXT[i : i + 5] for i in range(0, len(TEXT), 5)]
    deltas_view = Parser(True, "hermes", id_factory=_ids)
    typed = Parser(True, "hermes", id_factory=_ids)
    render = Chunks("m", include_usage=False)
    assert render(Started(0.0))[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for piece in [*pieces, None]:
        want = deltas_view.feed(piece) if piece is not None else deltas_view.finish()
        events = typed.feed_events(piece) if piece is not None else typed.finish_events()
        got = [c["choices"][0]["delta"] for e in events for c in render(e)]
        assert got == want


def test_a_batchs_logprobs_go_with_its_first_part_only() -> None:
    render = Chunks("m", include_usage=False)
    entries = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
    assert render(TokenLogprobs(entries)) == []
    first, second = render(ToolCallEnd(0)), render(TextDelta("a"))
    assert first == []  # a call's end has no chunk: the logprobs wait for the next part
    assert second[0]["choices"][0]["logprobs"] == {"content": entries}
    assert "logprobs" not in render(TextDelta("b"))[0]["choices"][0]
