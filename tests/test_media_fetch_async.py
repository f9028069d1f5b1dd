"""Allowed image URLs (``serve --image-url-allow``) fetched off the event loop (issue 43), and
Anthropic ``url`` image sources under the same policy. The real app and gateway run in
process over a ``MockEngine`` (a text model: an image that got through the fetch and the
decode is then refused by the gateway as "this model takes no images", which tells it apart
from a fetch refused by name); the asset server is a real threaded HTTP server on this
machine that sleeps before answering. The official ``openai`` and ``anthropic`` clients talk
to the app through httpx's ASGI transport, in one event loop: while one call waits on the
slow asset server, another session's text call is answered."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import httpx2  # the anthropic SDK's own httpx fork: its client takes only its objects
import openai
import pytest
from PIL import Image as PILImage

import turnstile_testbed as testbed
from turnstile import media
from turnstile.chat.audit import audit
from turnstile.chat.audit_corpus import corpus_renderer
from turnstile.gateway.token_in.gateway import Gateway
from turnstile.media_fetch import check_prefix, image_urls
from turnstile.parsing.detect import detect_format
from turnstile.server.app import create_app
from turnstile.store.store import Store
from turnstile.testing.mock_engine import MockEngine, Reply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RELEASE = threading.Event()  # /ok/slow.png answers once this is set (or after 10 s)


def png(color=(10, 20, 30)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (7, 5), color).save(out, "PNG")
    return out.getvalue()


IMG = png()


class Assets(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        Assets.hits.append(self.path)
        if self.path == "/ok/slow.png":  # answers when the test says so
            RELEASE.wait(10)
            return self._send(IMG)
        if self.path == "/ok/img.png":
            return self._send(IMG)
        if self.path == "/ok/drip.png":  # starts at once, then a byte at a time, forever
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
        if self.path == "/ok/huge.png":  # no content-length, more than the cap
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(64):
                    self.wfile.write(b"\0" * 4096)
            except OSError:
                return
            return
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "image/png")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def assets() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Assets)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def allow(assets: str) -> Iterator[str]:
    before = media.limits()
    media.set_limits(
        media.Limits(
            max_image_bytes=100_000, url_allow=(check_prefix(assets + "/ok/"),), url_timeout=2.0
        )
    )
    yield assets
    media.set_limits(before)


NAME = "Qwen-Qwen2.5-7B-Instruct"


@pytest.fixture(scope="module")
def renderer():
    got, _ = corpus_renderer(
        str(testbed.templates_dir() / f"{NAME}.jinja"), str(testbed.models_dir())
    )
    return got


@pytest.fixture
def app(tmp_path: Path, renderer):
    name = NAME
    [end] = renderer.tok.encode("<|im_end|>")
    engine = MockEngine(lambda prompt, params: Reply([9707, 11, end]), context_length=4096)
    choice = detect_format(renderer.template.source)
    gw = Gateway(renderer, engine, Store(tmp_path), "tiny", choice, audit(renderer, name).policy())
    return create_app(gw, "http://t", token=None)


def _http(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def _session(app) -> str:
    async with _http(app) as c:
        r = await c.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        return r.json()["base_url"]


def _openai(app, base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, http_client=_http(app))


def _anthropic(app, base: str) -> anthropic.AsyncAnthropic:
    base = base.removesuffix("/v1")
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t")
    return anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0, http_client=http)


def _chat_image(url: str) -> list[dict]:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def _claude_image(url: str) -> list[dict]:
    src = {"type": "url", "url": url}
    return [{"role": "user", "content": [{"type": "image", "source": src}]}]


def test_a_slow_allowed_image_holds_up_only_its_own_call(app, allow):
    assets = allow

    done: list[str] = []

    async def run() -> str:
        slow_base, fast_base = await _session(app), await _session(app)

        async def slow() -> str:
            with pytest.raises(openai.BadRequestError) as err:
                await _openai(app, slow_base).chat.completions.create(
                    model="tiny", messages=_chat_image(assets + "/ok/slow.png"), max_tokens=3
                )
            done.append("slow")
            return err.value.message

        async def fast() -> None:
            while not Assets.hits:  # the slow call's fetch has reached the asset server
                await asyncio.sleep(0.01)
            got = await _openai(app, fast_base).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert got.choices[0].message.content
            done.append("fast")
            RELEASE.set()  # only now may the asset server answer the slow call

        msg, _ = await asyncio.gather(slow(), fast())
        return msg

    Assets.hits.clear()
    RELEASE.clear()
    msg = asyncio.run(run())
    assert Assets.hits == ["/ok/slow.png"]
    # answered while the other call's fetch waited (a fetch on the loop: the asset server
    # gives up waiting after 10 s, then the slow call ends first)
    assert done == ["fast", "slow"]
    # fetched and decoded: the image reached the gateway, which refuses images for this model
    assert "takes no images" in msg, msg


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/ok/huge.png", ("over 100000 bytes", "--max-image-mb")),
        ("/ok/drip.png", ("took over 2.0 s",)),  # the deadline ends an endless drip
        ("/ok/missing.png", ("answered 404",)),
    ],
)
def test_a_body_over_the_cap_or_the_deadline_is_a_clear_400(app, allow, path, words):
    async def run() -> openai.BadRequestError:
        base = await _session(app)
        with pytest.raises(openai.BadRequestError) as err:
            await _openai(app, base).chat.completions.create(
                model="tiny", messages=_chat_image(allow + path), max_tokens=3
            )
        return err.value

    err = asyncio.run(run())
    assert err.body["code"] == "invalid_image"
    assert err.body["param"] == "messages[0].content[1].image_url"
    assert all(w in err.message for w in words), err.message


def test_anthropic_url_images_are_refused_by_default_in_anthropics_shape(app, assets):
    async def run() -> anthropic.BadRequestError:
        base = await _session(app)
        with pytest.raises(anthropic.BadRequestError) as err:
            await _anthropic(app, base).messages.create(
                model="tiny", max_tokens=3, messages=_claude_image(assets + "/ok/img.png")
            )
        return err.value

    Assets.hits.clear()
    err = asyncio.run(run())
    assert err.status_code == 400
    assert err.body["type"] == "error" and err.body["error"]["type"] == "invalid_request_error"
    assert "is not fetched" in err.body["error"]["message"]
    assert "--image-url-allow" in err.body["error"]["message"]
    assert Assets.hits == []  # never asked


def test_anthropic_url_images_are_fetched_when_allowed(app, allow):
    async def run() -> list[anthropic.BadRequestError]:
        base = await _session(app)
        client = _anthropic(app, base)
        errs = []
        for path in ("/ok/img.png", "/ok/huge.png"):
            with pytest.raises(anthropic.BadRequestError) as err:
                await client.messages.create(
                    model="tiny", max_tokens=3, messages=_claude_image(allow + path)
                )
            errs.append(err.value)
        return errs

    Assets.hits.clear()
    ok, huge = asyncio.run(run())
    assert Assets.hits == ["/ok/img.png", "/ok/huge.png"]
    assert "takes no images" in ok.body["error"]["message"]  # fetched, decoded, then refused
    assert huge.body["error"]["type"] == "invalid_request_error"
    assert "--max-image-mb" in huge.body["error"]["message"]


def test_every_dialects_image_url_is_found_before_parsing():
    p = ("http://a.test/ok/",)
    body = {
        "messages": [
            {"content": [{"type": "image_url", "image_url": {"url": "http://a.test/ok/1"}}]},
            {"content": [{"type": "image_url", "image_url": "http://a.test/ok/2"}]},
            {"content": [{"type": "image", "source": {"type": "url", "url": "http://a.test/ok/3"}}]},
            {"content": [{"type": "image_url", "image_url": {"url": "http://b.test/ok/4"}}]},
        ],
        "input": [
            {"content": [{"type": "input_image", "image_url": "http://a.test/ok/5"}]},
            {"type": "function_call_output", "output": [
                {"type": "input_image", "image_url": "http://a.test/ok/6"}]},
        ],
    }  # fmt: skip
    assert sorted(image_urls(body, p)) == [f"http://a.test/ok/{i}" for i in (1, 2, 3, 5, 6)]
    assert image_urls(body, ()) == []
