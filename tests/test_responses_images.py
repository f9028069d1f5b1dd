"""Responses ``input_image`` parts (issue 43): in user messages and in ``function_call_output``
items they become the same media items as Chat Completions ``image_url`` parts. The truth
for each case is the Chat dialect's own reading of the same conversation (which the heavy
vLLM test holds to vLLM's echo and transformers' processor): same messages, same bytes by
hash. Bad images are 400s naming the Responses part; ``file_id`` is refused by name."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

from turnstile.dialects.chat.request import parse_chat_request
from turnstile.dialects.responses.request import chat_body
from turnstile.errors import APIError

pytestmark = pytest.mark.unit


def png(color: tuple[int, int, int], size: tuple[int, int] = (5, 3), fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def via_responses(items: list[dict]):
    chat, _ = chat_body({"model": "m", "input": items}, [])
    return parse_chat_request(chat)


def _chat_part(p: dict) -> dict:
    if p["type"] == "input_image":
        return {"type": "image_url", "image_url": {"url": p["image_url"]}}
    return {"type": "text", "text": p["text"]}


@settings(max_examples=40, deadline=None)
@given(
    colors=st.lists(st.tuples(*[st.integers(0, 255)] * 3), min_size=1, max_size=4),
    texts=st.lists(st.text(max_size=8), min_size=0, max_size=3),
    in_tool=st.booleans(),
    jpeg=st.booleans(),
)
def test_input_images_are_the_chat_dialects_media_items(colors, texts, in_tool, jpeg):
    fmt, mime = ("JPEG", "image/jpeg") if jpeg else ("PNG", "image/png")
    blobs = [png(c, fmt=fmt) for c in colors]
    parts: list[dict] = [{"type": "input_text", "text": t} for t in texts]
    for k, b in enumerate(blobs):  # images between the texts
        parts.insert(min(k, len(parts)), {"type": "input_image", "image_url": data_url(b, mime)})
    if in_tool:
        items = [
            {"role": "user", "content": "take a screenshot"},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": parts},
        ]
        chat_msgs = [
            {"role": "user", "content": "take a screenshot"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "shot", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [_chat_part(p) for p in parts]},
        ]
    else:
        items = [{"role": "user", "content": parts}]
        chat_msgs = [{"role": "user", "content": [_chat_part(p) for p in parts]}]
    got = via_responses(items)
    want = parse_chat_request({"model": "m", "messages": chat_msgs})
    assert got.messages == want.messages
    assert {h: i.data for h, i in got.images.items()} == {h: i.data for h, i in want.images.items()}
    # the bytes by their own hash, in order of the parts
    hashes = [p["sha256"] for p in got.messages[-1]["content"] if p["type"] == "image"]
    assert hashes == [hashlib.sha256(b).hexdigest() for b in blobs]


def test_text_only_content_stays_a_string():
    req = via_responses([{"role": "user", "content": [{"type": "input_text", "text": "a"}]}])
    assert req.messages == [{"role": "user", "content": "a"}] and req.images == {}
    out = [{"type": "input_text", "text": "ok"}]
    req = via_responses(
        [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": out},
        ]
    )
    assert req.messages[-1]["content"] == "ok"


@pytest.mark.parametrize(
    ("part", "param", "words"),
    [
        ({"type": "input_image", "file_id": "file_1"}, ".file_id", "file_id images"),
        ({"type": "input_image"}, "", "needs image_url"),
        ({"type": "input_image", "image_url": "https://x.test/a.png"}, ".image_url", "URL"),
        ({"type": "input_image", "image_url": "data:image/png;base64,!!"}, ".image_url", ""),
        (
            {"type": "input_image", "image_url": data_url(b"not an image")},
            ".image_url",
            "",
        ),
        ({"type": "input_image", "image_url": 7}, ".image_url", "string"),
        ({"type": "input_file", "file_data": "x"}, "", "input_file"),
    ],
)
@pytest.mark.parametrize("where", ["user", "tool"])
def test_bad_images_are_400s_naming_the_responses_part(part, param, words, where):
    if where == "user":
        items = [{"role": "user", "content": [{"type": "input_text", "text": "x"}, part]}]
        at = "input[0].content[1]"
    else:
        items = [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [part]},
        ]
        at = "input[1].output[0]"
    with pytest.raises(APIError) as err:
        via_responses(items)
    assert err.value.status == 400
    assert err.value.param == at + param, err.value.param
    assert words in str(err.value)


def test_images_only_where_the_api_takes_them():
    part = {"type": "input_image", "image_url": data_url(png((1, 2, 3)))}
    for role in ("system", "developer"):
        with pytest.raises(APIError) as err:
            via_responses([{"role": role, "content": [part]}])
        assert err.value.status == 400 and err.value.param == "input[0].content[0]"
