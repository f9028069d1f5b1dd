"""Images as media items (turnstile/media.py): decoding refuses what it cannot take with a
MediaError (a 400 at the edge), never another exception; spans collapse and join exactly."""

from __future__ import annotations

import base64
import hashlib
import io
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

from turnstile import media
from turnstile.media import Limits, MediaError, MediaItem, MediaPrompt

pytestmark = pytest.mark.unit


def encoded(fmt: str, size: tuple[int, int] = (5, 3), color=(200, 10, 10)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", sorted(media.FORMATS.values()))
def test_each_format_decodes_with_its_hash_and_sniffed_type(fmt):
    data = encoded(fmt)
    # labelled as another supported type: the bytes' own type is what is recorded
    img = media.from_url("data:image/png;base64," + base64.b64encode(data).decode())
    assert img.sha256 == hashlib.sha256(data).hexdigest()
    assert media.FORMATS[img.mime] == fmt and (img.width, img.height) == (5, 3)
    assert img.data == data


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://example.com/cat.png", "not fetched"),
        ("file:///etc/passwd", "not fetched"),
        ("data:image/png,abc", "base64"),
        ("data:image/png;base64,!!!", "not valid base64"),
        ("data:image/bmp;base64," + base64.b64encode(encoded("BMP")).decode(), "unsupported"),
        ("data:image/png;base64," + base64.b64encode(encoded("BMP")).decode(), "decoded"),
        ("data:image/png;base64," + base64.b64encode(encoded("PNG")[:30]).decode(), "decoded"),
        ("data:image/png;base64,", "empty"),
    ],
)
def test_refusals_say_why(url, words):
    with pytest.raises(MediaError, match=words):
        media.from_url(url)


def test_limits():
    data = encoded("PNG")
    with pytest.raises(MediaError, match="max-image-mb"):
        media.decode(data, "image/png", Limits(max_image_bytes=len(data) - 1))
    assert media.decode(data, "image/png", Limits(max_image_bytes=len(data))).sha256
    with pytest.raises(MediaError, match="pixels"):
        media.decode(encoded("PNG", (100, 100)), None, Limits(max_pixels=9999))
    with pytest.raises(MediaError, match="max-images-per-request"):
        Limits(max_images_per_request=2).check_request(3)
    with pytest.raises(MediaError, match="max-images-per-session"):
        Limits(max_images_per_session=4).check_session(3, 2)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.binary(max_size=300), st.sampled_from([encoded(f) for f in ("PNG", "GIF")])),
    st.one_of(st.none(), st.sampled_from([*media.FORMATS, "image/bmp", "text/plain", ""])),
)
def test_any_bytes_decode_or_refuse_clearly(data, mime):
    try:
        img = media.decode(data, mime)
    except MediaError as exc:
        assert str(exc)
    else:
        assert img.mime in media.FORMATS and img.sha256 == hashlib.sha256(data).hexdigest()


def item(offset: int, length: int, h: str = "a") -> MediaItem:
    return MediaItem(h * 64, "image/png", offset, length)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_collapse_keeps_text_and_puts_one_placeholder_per_image(data):
    text = data.draw(st.lists(st.lists(st.integers(0, 50), max_size=5), min_size=1, max_size=5))
    blocks = [data.draw(st.integers(1, 9)) for _ in text[1:]]
    ids, items, expected = array("i"), [], array("i")
    for i, chunk in enumerate(text):
        ids.extend(chunk)
        expected.extend(chunk)
        if i < len(blocks):
            items.append(item(len(ids), blocks[i]))
            ids.extend([99] * blocks[i])
            expected.append(-1)
    p = MediaPrompt(ids, tuple(items))
    assert p.collapsed(-1) == expected
    # joined after a prefix with an image: the delta's spans move by the prefix's length
    prefix = MediaPrompt(array("i", [7, 99, 99, 8]), (item(1, 2, "b"),))
    joined = media.join(prefix, p)
    assert isinstance(joined, MediaPrompt)
    assert joined.ids == prefix.ids + ids
    assert joined.collapsed(-1) == array("i", [7, -1, 8]) + expected
    assert [m.offset for m in joined.media] == [1] + [m.offset + 4 for m in items]


def test_text_join_stays_a_plain_array():
    out = media.join(array("i", [1, 2]), array("i", [3]))
    assert type(out) is array and out == array("i", [1, 2, 3])


def test_bad_spans_are_refused():
    with pytest.raises(ValueError):
        MediaPrompt(array("i", [1, 2, 3]), (item(2, 2),))
    with pytest.raises(ValueError):
        MediaPrompt(array("i", [1, 2, 3, 4]), (item(2, 1), item(1, 1)))


def test_item_json_round_trip():
    m = MediaItem("c" * 64, "image/webp", 3, 7, {"name": "P", "args": {"x": 1}}, (1, 3, 32, 32))
    assert MediaItem.from_json(m.to_json()) == m
    assert media.items_from_json(media.items_to_json([m, m])) == (m, m)
