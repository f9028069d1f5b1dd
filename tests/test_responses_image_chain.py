"""A Responses chain (``previous_response_id``) keeps its images by reference to the
content-addressed blob store, not as base64 in the call record's ``info`` (issue 43); the
follow-up call still gets the earlier turn's image, its bytes read back from the store. The
real app and gateway in process, the official ``openai`` client's Responses API through
httpx's ASGI transport; the engine a ``MockEngine`` named vLLM that keeps the prompts it was
given (with their images), the model's processor a stand-in (a two-token block per image)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
from array import array
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from PIL import Image as PILImage

import turnstile_testbed as testbed
from turnstile.chat.audit import audit
from turnstile.chat.audit_corpus import corpus_renderer
from turnstile.gateway.token_in.gateway import Gateway
from turnstile.media import MediaItem, MediaPrompt
from turnstile.parsing.detect import detect_format
from turnstile.server.app import create_app
from turnstile.store.store import Store
from turnstile.testing.mock_engine import MockEngine, Reply

pytestmark = pytest.mark.unit

NAME = "Qwen-Qwen2.5-7B-Instruct"
PH = 151655


class Blocks:
    """A stand-in image processor: each image a block of two tokens where the prompt ends."""

    placeholder_id = PH

    def expand(self, rendered, images):  # noqa: ANN001, ANN201
        ids, items = array("i", rendered), []
        for im in images:
            items.append(MediaItem(im.sha256, im.mime, len(ids), 2))
            ids.extend([PH, PH])
        return MediaPrompt(ids, tuple(items), {i.sha256: i for i in images}, PH)


class Keeping(MockEngine):
    """A MockEngine that keeps the prompt objects it was given (their images included)."""

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.prompts: list[object] = []

    def generate(self, prompt_ids, params, stream=False):  # noqa: ANN001, ANN201
        self.prompts.append(prompt_ids)
        return super().generate(prompt_ids, params, stream)


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (6, 4), color).save(out, "PNG")
    return out.getvalue()


def test_a_chain_keeps_image_references_and_the_follow_up_gets_the_image(tmp_path: Path):
    renderer, _ = corpus_renderer(
        str(testbed.templates_dir() / f"{NAME}.jinja"), str(testbed.models_dir())
    )
    renderer.images = Blocks()
    [end] = renderer.tok.encode("<|im_end|>")
    engine = Keeping(lambda p, s: Reply([9707, 11, end]), name="vllm", context_length=4096)
    store = Store(tmp_path)
    policy = audit(renderer, NAME).policy()
    gw = Gateway(renderer, engine, store, "tiny", detect_format(renderer.template.source), policy)
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw, "http://t", token=None)),
        base_url="http://t",
    )
    first, shot = png((200, 10, 10)), png((10, 200, 10))
    b64 = base64.b64encode(first).decode()

    async def run() -> str:
        r = await http.post("/v1/sessions", json={"id": "s"})
        client = openai.AsyncOpenAI(
            base_url=r.json()["base_url"], api_key="x", max_retries=0, http_client=http
        )
        one = await client.responses.create(
            model="tiny",
            max_output_tokens=3,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{b64}"},
                    ],
                }
            ],
        )
        out = [{"type": "input_image", "image_url": "data:image/png;base64,"
                + base64.b64encode(shot).decode()}]  # fmt: skip
        # a tool's screenshot comes back chained; the first image only through the chain
        two = await client.responses.create(
            model="tiny",
            max_output_tokens=3,
            previous_response_id=one.id,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "and now?"},
                                                *out]}],
        )  # fmt: skip
        while store.call_count("s") < 2:
            await asyncio.sleep(0.01)
        return two.id

    asyncio.run(run())
    calls = store.calls("s")
    for c in calls:  # the records' info: hashes, never the bytes
        text = orjson.dumps(c.info).decode()
        assert "base64" not in text and b64[:40] not in text
    kept = calls[0].info["dialect_state"]["input"][0]["content"][1]
    assert kept["sha256"] == hashlib.sha256(first).hexdigest()
    # the follow-up's prompt holds both images, the first one's bytes from the blob store
    last = engine.prompts[-1]
    assert isinstance(last, MediaPrompt)
    hashes = [m.sha256 for m in last.media]
    assert hashes == [hashlib.sha256(b).hexdigest() for b in (first, shot)]
    assert last.images[hashes[0]].data == first
