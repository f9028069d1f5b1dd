"""The Chat Completions reader's image parts (dialects/images.py): a data URL image becomes a
canonical part and its bytes the request's, by sha256; anything else is a clear 400, never a
500, whatever the bytes and the declared type."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

from turnstile.chat.content import normalise
from turnstile.dialects.chat.request import parse_chat_request
from turnstile.errors import APIError

pytestmark = pytest.mark.unit


def encoded(fmt: str = "PNG", color=(1, 2, 3)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (4, 4), color).save(out, fmt)
    return out.getvalue()


def body(*urls: object) -> dict:
    parts: list[dict] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_images_become_canonical_parts_and_bytes_by_hash():
    a, b = encoded(color=(9, 9, 9)), encoded("JPEG")
    src = body(url(a), url(b, "image/jpeg"), url(a))
    req = parse_chat_request(src)
    ha, hb = hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()
    parts = req.messages[0]["content"]
    assert parts[1:] == [{"type": "image", "sha256": h} for h in (ha, hb, ha)]
    assert set(req.images) == {ha, hb} and req.images[ha].data == a
    assert src["messages"][0]["content"][1]["type"] == "image_url"  # the body is not changed
    # the template sees one image part per image, in order, text kept
    (m,) = normalise(req.messages, "openai")
    assert m["content"] == [{"type": "text", "text": "look"}, *[{"type": "image"}] * 3]


def test_text_requests_are_untouched():
    src = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    req = parse_chat_request(src)
    assert req.messages is src["messages"] and req.images == {}


@pytest.mark.parametrize(
    ("u", "words"),
    [
        ("https://example.com/a.png", "not fetched"),
        (url(b"not an image"), "could not be decoded"),
        (url(encoded("BMP"), "image/bmp"), "unsupported image type"),
        (7, "must be a string"),
    ],
)
def test_bad_images_are_400s_naming_the_part(u, words):
    with pytest.raises(APIError) as err:
        parse_chat_request(body(u))
    assert err.value.status == 400 and words in str(err.value)
    assert "messages[0].content[1].image_url" in str(err.value.param)


def test_too_many_images_in_a_request():
    with pytest.raises(APIError, match="max-images-per-request"):
        parse_chat_request(body(*[url(encoded())] * 17))


def test_an_assistant_message_with_an_image_is_refused():
    src = body(url(encoded()))
    src["messages"] = [{**src["messages"][0], "role": "assistant"}]
    with pytest.raises(APIError) as err:
        parse_chat_request(src)
    assert err.value.status == 400


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.binary(max_size=200), st.just(encoded()), st.just(encoded("GIF"))),
    st.sampled_from(["image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp", "x/y", ""]),
    st.booleans(),
)
def test_any_bytes_and_type_give_a_request_or_a_400(data, mime, b64):
    u = url(data, mime) if b64 else f"data:{mime},{data.hex()}"
    try:
        req = parse_chat_request(body(u))
    except APIError as exc:
        assert exc.status == 400 and str(exc)
    else:
        assert list(req.images) == [hashlib.sha256(data).hexdigest()]


def test_anthropic_image_blocks_and_tool_result_images_become_the_same_parts():
    from turnstile.dialects.messages.request import chat_body

    a, b = encoded(color=(5, 5, 5)), encoded("WEBP")

    def block(data: bytes, mime: str) -> dict:
        src = {"type": "base64", "media_type": mime, "data": base64.b64encode(data).decode()}
        return {"type": "image", "source": src}

    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "see"}, block(a, "image/png")]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "shot", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "here"}, block(b, "image/webp"),
                ]},
            ]},
        ],
    }  # fmt: skip
    chat, _ = chat_body(body)
    req = parse_chat_request(chat)
    ha, hb = hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()
    user, _, tool = req.messages
    assert user["content"] == [{"type": "text", "text": "see"}, {"type": "image", "sha256": ha}]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "t1"
    assert tool["content"] == [{"type": "text", "text": "here"}, {"type": "image", "sha256": hb}]
    assert req.images[hb].mime == "image/webp"
    # a URL source is not fetched
    body["messages"][0]["content"][1] = {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/x.png"},
    }
    with pytest.raises(APIError, match="not fetched"):
        parse_chat_request(chat_body(body)[0])


def test_serve_options_set_the_process_limits():
    import argparse

    from turnstile import media
    from turnstile.app.serve_options import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    given = ["--engine-url", "http://x", "--model", "m", "--max-image-mb", "0.0001"]
    args = p.parse_args([*given, "--max-images-per-request", "1"])
    assert args.max_images_per_session == 256
    before = media.limits()
    try:
        media.set_limits(
            media.Limits(
                max_image_bytes=int(args.max_image_mb * (1 << 20)),
                max_images_per_request=args.max_images_per_request,
            )
        )
        with pytest.raises(APIError, match="max-images-per-request"):
            parse_chat_request(body(url(encoded()), url(encoded("GIF"))))
        big = encoded("PNG", (255, 254, 253)) + b"\0" * 200
        with pytest.raises(APIError, match="max-image-mb"):
            parse_chat_request(body(url(big)))
    finally:
        media.set_limits(before)
