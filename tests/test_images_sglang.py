"""Images on SGLang's ``/generate`` (issue 43), against the fake SGLang whose multimodal path
follows the 0.5.23 wheel (``base_processor._expand_input_ids``: with exactly one placeholder
per image it keeps the caller's IDs and repeats each placeholder its image's count of times;
otherwise it falls back to decode + re-tokenize). The truth for the expansion is transformers'
own Qwen2-VL image processor (the PIL backend, no torch): the record's block for an image is
``grid_thw.prod() // merge_size**2`` placeholders computed from the pixels it cuts, while the
fake's count comes the way SGLang's ``resolve_image_token_counts`` asks for it, from the
image's size (``get_number_of_image_patches``). Turnstile sends one placeholder per image,
the bytes in ``image_data``, their sha256 as ``mm_content_hashes`` and
``return_prompt_token_ids``; SGLang's echoed expansion must equal the record, and where it
does not (a fallback, a family whose processor writes more than placeholders) the call fails
with a 502, never a silent fallback. (The real SGLang 0.5.23 has no Idefics3, the tiny VLM
of the vLLM tests: docs/images.md.)"""

from __future__ import annotations

import asyncio
import base64
import io
from array import array

import pytest
from PIL import Image as PILImage

from turnstile.engines import EngineError, SamplingParams, make_engine
from turnstile.media import Image, MediaItem, MediaPrompt, decode
from turnstile.testing.fake_sglang import SGLangFake
from turnstile.testing.tokens import tokens

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PH = 151655  # Qwen2-VL's <|image_pad|>
START, END = 151652, 151653  # <|vision_start|>, <|vision_end|>: the template writes them


@pytest.fixture(scope="module")
def processor():
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 64)


def picture(size: tuple[int, int], color: tuple[int, int, int]) -> Image:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, "PNG")
    return decode(out.getvalue())


def block(processor, image: Image) -> int:  # noqa: ANN001
    """The image's block length as the processor cuts its pixels (transformers)."""
    with PILImage.open(io.BytesIO(image.data)) as pil:
        grid = processor(images=[pil.convert("RGB")], return_tensors="np")["image_grid_thw"]
    return int(grid.prod()) // processor.merge_size**2


def sglang_count(processor):  # noqa: ANN001, ANN201
    """SGLang's count for an image: from its size, as resolve_image_token_counts asks."""

    def count(data: bytes) -> int:
        with PILImage.open(io.BytesIO(data)) as pil:
            w, h = pil.size
        return processor.get_number_of_image_patches(h, w, {}) // processor.merge_size**2

    return count


def prompt_with(processor, images: list[Image], extra: list[int] = ()) -> MediaPrompt:  # noqa: ANN001
    """A rendered prompt (text, then each image between vision start/end) expanded as the
    record holds it: each image's whole block of placeholders."""
    ids = array("i", [1, 2, 3, *extra])
    items = []
    for im in images:
        ids.append(START)
        n = block(processor, im)
        items.append(MediaItem(im.sha256, im.mime, len(ids), n))
        ids.extend([PH] * n)
        ids.append(END)
    ids.extend([4, 5])
    return MediaPrompt(ids, tuple(items), {i.sha256: i for i in images}, PH)


async def run(url: str, prompt, stream: bool):  # noqa: ANN001, ANN201
    engine = make_engine("sglang", url)
    await engine.start()
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0)
        return tokens([b async for b in engine.generate(prompt, params, stream=stream)])
    finally:
        await engine.close()


@pytest.mark.parametrize("stream", [False, True])
def test_one_placeholder_per_image_goes_out_and_the_echo_is_the_record(processor, stream):
    images = [picture((60, 90), (200, 0, 0)), picture((120, 40), (0, 200, 0))]
    prompt = prompt_with(processor, images)
    assert len({m.length for m in prompt.media}) == 2  # blocks of two lengths
    with SGLangFake(image_tokens=sglang_count(processor), image_token_id=PH) as fake:
        _, finish = asyncio.run(run(fake.url, prompt, stream))
        body = fake.rec.bodies("/generate")[-1]
        echoed = fake.prompt_echo[body["rid"]]
    # what went out: the collapsed IDs, the bytes, their content hashes, the echo asked for
    assert body["input_ids"] == list(prompt.collapsed())
    assert body["input_ids"].count(PH) == 2
    sent = [base64.b64decode(u.partition(",")[2]) for u in body["image_data"]]
    assert sent == [im.data for im in images]
    assert body["mm_content_hashes"] == ["sha256:" + im.sha256 for im in images]
    assert body["return_prompt_token_ids"] is True
    # SGLang's expansion (by image size) is the record's (transformers, by the pixels)
    assert echoed == list(prompt.ids)
    assert finish.prompt_tokens == len(prompt.ids)


def test_a_fallback_to_retokenizing_is_an_error(processor):
    # a placeholder in the text too: two placeholders for one image, SGLang falls back
    prompt = prompt_with(processor, [picture((60, 90), (1, 2, 3))], extra=[PH])
    with SGLangFake(image_tokens=sglang_count(processor), image_token_id=PH) as fake:
        with pytest.raises(EngineError) as err:
            asyncio.run(run(fake.url, prompt, False))
        assert fake.fell_back  # the fake took SGLang's fallback path
    assert err.value.status == 502 and "fell back" in str(err.value)


def test_a_family_whose_block_is_more_than_placeholders_is_an_error(processor):
    # an Idefics3-like record: the processor writes tokens around the image's placeholders,
    # which SGLang's placeholder repetition does not produce
    im = picture((60, 90), (9, 9, 9))
    n = block(processor, im)
    ids = array("i", [1, 2, 7, *([PH] * n), 7, 3])
    prompt = MediaPrompt(ids, (MediaItem(im.sha256, im.mime, 2, n + 2),), {im.sha256: im}, PH)
    with SGLangFake(image_tokens=sglang_count(processor), image_token_id=PH) as fake:
        with pytest.raises(EngineError) as err:
            asyncio.run(run(fake.url, prompt, True))
    assert err.value.status == 502 and "SGLang expanded the images" in str(err.value)


def test_an_answer_without_the_echo_is_an_error(processor):
    prompt = prompt_with(processor, [picture((60, 90), (4, 5, 6))])
    # a server that does not know return_prompt_token_ids (the fake told to forget it)
    with SGLangFake(image_tokens=sglang_count(processor), image_token_id=PH) as fake:
        fake.prompt_echo = _Forgetful()
        with pytest.raises(EngineError) as err:
            asyncio.run(run(fake.url, prompt, False))
    assert err.value.status == 502 and "did not echo" in str(err.value)


class _Forgetful(dict):
    def __setitem__(self, key, value) -> None:  # noqa: ANN001
        pass
