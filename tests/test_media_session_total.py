"""``serve --max-images-per-session`` bounds a session's distinct images over ALL its branches
(issue 43): an image re-sent on every turn counts once, a branch that brings a new image
counts it against the same total, and the total survives a restart (rebuilt from the
records). The real app and gateway in process, the official ``openai`` client through
httpx's ASGI transport; the engine is a ``MockEngine`` named vLLM and the model's processor a
stand-in that gives each image a two-token block (what is counted is the session's images,
not how they expand)."""

from __future__ import annotations

import asyncio
import base64
import io
from array import array
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image as PILImage

import turnstile_testbed as testbed
from turnstile import media
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
PH = 151655  # Qwen2's <|image_pad|>: the stand-in's block token


class Blocks:
    """A stand-in image processor: each image a block of two placeholder tokens where the
    rendered prompt ends (only admission is under test here)."""

    placeholder_id = PH

    def expand(self, rendered, images):  # noqa: ANN001, ANN201
        ids, items = array("i", rendered), []
        for im in images:
            items.append(MediaItem(im.sha256, im.mime, len(ids), 2))
            ids.extend([PH, PH])
        return MediaPrompt(ids, tuple(items), {i.sha256: i for i in images}, PH)


@pytest.fixture(scope="module")
def renderer():
    got, _ = corpus_renderer(
        str(testbed.templates_dir() / f"{NAME}.jinja"), str(testbed.models_dir())
    )
    got.images = Blocks()
    return got


@pytest.fixture
def three():
    before = media.limits()
    media.set_limits(media.Limits(max_images_per_session=3))
    yield
    media.set_limits(before)


def gateway(renderer, data: Path) -> Gateway:  # noqa: ANN001
    [end] = renderer.tok.encode("<|im_end|>")
    engine = MockEngine(lambda p, s: Reply([9707, 11, end]), name="vllm", context_length=4096)
    policy = audit(renderer, NAME).policy()
    choice = detect_format(renderer.template.source)
    return Gateway(renderer, engine, Store(data), "tiny", choice, policy)


def image(n: int) -> dict:
    out = io.BytesIO()
    PILImage.new("RGB", (4, 4), (n, n, n)).save(out, "PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def user(text: str, *images: int) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}, *map(image, images)]}


class Harness:
    def __init__(self, gw: Gateway) -> None:
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(gw, "http://t", token=None)),
            base_url="http://t",
        )

    async def session(self, sid: str) -> openai.AsyncOpenAI:
        r = await self.http.post("/v1/sessions", json={"id": sid})
        assert r.status_code == 201, r.text
        base = r.json()["base_url"]
        return openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, http_client=self.http)

    @staticmethod
    async def send(client: openai.AsyncOpenAI, msgs: list[dict]) -> dict:
        r = await client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3)
        return {"role": "assistant", "content": r.choices[0].message.content}


async def refused(client: openai.AsyncOpenAI, msgs: list[dict]) -> str:
    with pytest.raises(openai.BadRequestError) as err:
        await Harness.send(client, msgs)
    assert err.value.body["code"] == "invalid_image"
    return err.value.message


def test_the_session_total_counts_distinct_images_over_all_branches(renderer, three, tmp_path):
    gw = gateway(renderer, tmp_path)

    async def run() -> None:
        h = Harness(gw)
        s = await h.session("s1")
        first = [user("a", 1, 2)]
        reply = await h.send(s, first)
        # the same two images re-sent, one new: 3 distinct, the bound
        await h.send(s, [*first, reply, user("b", 3)])
        # a re-sent image counts once: another branch with images 1 and 3 is taken
        await h.send(s, [user("other", 1, 3)])
        # a branch (a prompt holding only 2 images) that brings a fourth distinct one
        msg = await refused(s, [user("branch", 1, 4)])
        assert "4 distinct images" in msg and "--max-images-per-session" in msg, msg
        # the bound is per session: image 4 is fine elsewhere
        await h.send(await h.session("s2"), [user("x", 4)])
        while gw.store.call_count("s1") < 3:  # the three calls committed
            await asyncio.sleep(0.01)

    asyncio.run(run())

    async def after_restart() -> None:  # the total rebuilt from the records
        h = Harness(gateway(renderer, tmp_path))
        s = await h.session("s1")
        await h.send(s, [user("again", 2, 3)])
        msg = await refused(s, [user("branch", 5)])
        assert "4 distinct images" in msg, msg

    asyncio.run(after_restart())
