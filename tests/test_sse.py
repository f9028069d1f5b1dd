"""The engines' server-sent events (``engines.http.SSEPayloads``), checked against the OpenAI
SDK's own SSE decoder on generated streams: events of one or more ``data`` lines among
comments and ``event:`` lines, LF or CRLF line ends (mixed), blank lines between events,
a ``[DONE]`` somewhere, the bytes cut into chunks anywhere. (No ``id:`` lines: the SDK keeps an
id and then makes an event of every further blank line, which the SSE spec does not.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from turnstile.engines.http import SSEPayloads

pytestmark = pytest.mark.unit

# data without CR or LF (an event's lines), ASCII so the SDK's decoding to text is lossless
TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    """A stream's chunks and, per event, the lines that make it (for the truth)."""
    events: list[list[str]] = []
    for _ in range(draw(st.integers(0, 8))):
        lines = [f": {c}" for c in draw(st.lists(TEXT, max_size=1))]
        if draw(st.booleans()):
            lines.append(f"event: {draw(TEXT)}")
        for value in draw(st.lists(TEXT, min_size=1, max_size=3)):
            lines.append(("data: " if draw(st.booleans()) else "data:") + value)
        events.append(draw(st.permutations(lines)))
    if events and draw(st.booleans()):
        events.insert(draw(st.integers(0, len(events))), ["data: [DONE]"])
    if draw(st.booleans()):
        events.insert(0, [": keep-alive"])  # a comment alone: no event
    eol = st.sampled_from(["\n", "\r\n"])  # drawn line by line: a stream may mix them
    text = "".join(
        "".join(line + draw(eol) for line in [*lines, *[""] * draw(st.integers(1, 2))])
        for lines in events
    )
    raw = text.encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    return chunks, [raw]


def _ours(chunks: list[bytes], until_done: bool) -> list[bytes]:
    parser = SSEPayloads(until_done)
    out: list[bytes] = []
    for chunk in chunks:
        out += parser.feed(chunk)
        if parser.done:
            return out
    return out + parser.end()


def _sdk(chunks: list[bytes], until_done: bool) -> list[bytes]:
    out = []
    for event in SSEDecoder().iter_bytes(iter(chunks)):
        if until_done and event.data.strip() == "[DONE]":
            break
        out.append(event.data.encode())
    return out


@settings(max_examples=400, deadline=None)
@given(streams(), st.booleans())
def test_payloads_are_the_sdk_decoders_data(stream: tuple, until_done: bool) -> None:
    chunks, whole = stream
    truth = _sdk(chunks, until_done)
    assert _ours(chunks, until_done) == truth
    assert _ours(whole, until_done) == truth


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    """The SDK drops it; an engine cut off after its last data line still sent those tokens."""
    assert _ours([b"data: a\n\ndata: b\r\ndata:  c\n"], True) == [b"a", b"b\n c"]
    assert _ours([b"data: a\n\ndata: b"], True) == [b"a", b"b"]
    assert _ours([b"data: a\n\ndata: [DONE]"], True) == [b"a"]
