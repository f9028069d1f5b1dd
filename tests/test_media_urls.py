"""Remote image URLs under ``serve --image-url-allow`` (issue 43), against real HTTP servers
on this machine (two ports: the allowed one and another): an allowed URL's bytes become the
request's image (hashed here against what the server sent); a redirect that stays under the
prefix is followed, one that leaves it is refused; too many bytes, a slow server, a 404,
bytes that are not an image, a host that only looks like the allowed one: each a 400 naming
the part. With no prefix every remote URL is refused, as before."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image as PILImage

from turnstile import media
from turnstile.dialects.chat.request import parse_chat_request
from turnstile.errors import APIError
from turnstile.media_fetch import allowed, check_prefix

pytestmark = pytest.mark.integration


def png(color=(10, 20, 30)) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (7, 5), color).save(out, "PNG")
    return out.getvalue()


IMG = png()
BIG = png((1, 2, 3)) + b"\0" * 5000  # a valid PNG with trailing bytes: over the cap set below


class Handler(BaseHTTPRequestHandler):
    other = ""  # the non-allowed server's base URL
    hits: list[str] = []

    def log_message(self, *a) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        Handler.hits.append(f"{self.server.server_address[1]}{self.path}")
        if self.path in ("/ok/img.png", "/ok/copy.png"):
            return self._send(200, IMG, "image/png")
        if self.path == "/ok/big.png":
            return self._send(200, BIG, "image/png")
        if self.path == "/ok/endless.png":  # no length, bytes until the client stops reading
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"\0" * 4096)
            except OSError:
                return
        if self.path == "/ok/text":
            return self._send(200, b"hello", "image/png")
        if self.path == "/ok/slow.png":
            time.sleep(1.5)
            return self._send(200, IMG, "image/png")
        if self.path == "/ok/in":
            return self._redirect("/ok/copy.png")
        if self.path == "/ok/out":
            return self._redirect(Handler.other + "/ok/img.png")
        if self.path == "/ok/loop":
            return self._redirect("/ok/loop")
        if self.path == "/secret/img.png":
            return self._send(200, IMG, "image/png")
        self._send(404, b"no", "text/plain")

    def _send(self, code: int, body: bytes, mime: str) -> None:
        self.send_response(code)
        self.send_header("content-type", mime)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str) -> None:
        self.send_response(302)
        self.send_header("location", to)
        self.send_header("content-length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    made = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in made]
    for t in threads:
        t.start()
    a, b = (f"http://127.0.0.1:{s.server_address[1]}" for s in made)
    Handler.other = b
    yield a, b
    for s in made:
        s.shutdown()
        s.server_close()


@pytest.fixture
def allow(servers):
    before = media.limits()
    a, _ = servers
    media.set_limits(
        media.Limits(max_image_bytes=2000, url_allow=(check_prefix(a + "/ok/"),), url_timeout=1.0)
    )
    yield
    media.set_limits(before)


def ask(url: str):
    parts = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]
    return parse_chat_request({"model": "m", "messages": [{"role": "user", "content": parts}]})


def refused(url: str, *words: str) -> str:
    with pytest.raises(APIError) as err:
        ask(url)
    assert err.value.status == 400
    assert err.value.param == "messages[0].content[1].image_url"
    msg = str(err.value)
    assert all(w in msg for w in words), msg
    return msg


def test_an_allowed_url_is_fetched_and_is_the_servers_bytes(servers, allow):
    a, _ = servers
    req = ask(a + "/ok/img.png")
    (img,) = req.images.values()
    assert img.data == IMG and img.sha256 == hashlib.sha256(IMG).hexdigest()
    assert req.messages[0]["content"][1] == {"type": "image", "sha256": img.sha256}
    # a redirect that stays under the prefix is followed
    Handler.hits.clear()
    (img2,) = ask(a + "/ok/in").images.values()
    assert img2.data == IMG and Handler.hits == [f"{a[-5:]}/ok/in", f"{a[-5:]}/ok/copy.png"]


def test_what_leaves_the_allow_list_or_the_limits_is_refused(servers, allow):
    a, b = servers
    Handler.hits.clear()
    refused(a + "/ok/out", "redirects to", "outside serve --image-url-allow")
    assert not any(h.startswith(b[-5:]) for h in Handler.hits)  # the other host never asked
    refused(b + "/ok/img.png", "not under", "--image-url-allow")
    refused(a + "/secret/img.png", "not under")  # same host, path outside the prefix
    refused(a.replace("127.0.0.1", "127.0.0.1.nip.io") + "/ok/img.png", "not under")
    refused(a.replace("http://", "http://u:p@") + "/ok/img.png", "not under")
    refused(a + "/ok/big.png", "--max-image-mb")
    # no content-length: reading stops at the cap, not at the deadline
    refused(a + "/ok/endless.png", "over 2000 bytes", "--max-image-mb")
    refused(a + "/ok/text", "could not be decoded")
    refused(a + "/ok/missing.png", "answered 404")
    refused(a + "/ok/loop", "redirects")
    t0 = time.monotonic()
    refused(a + "/ok/slow.png", "fetching")
    assert time.monotonic() - t0 < 1.45  # the deadline, not the server, ended it


def test_without_a_prefix_every_remote_url_is_refused(servers):
    a, _ = servers
    Handler.hits.clear()
    refused(a + "/ok/img.png", "not fetched", "--image-url-allow")
    assert Handler.hits == []


def test_prefixes_are_matched_as_urls():
    p = ("https://assets.test/screens/",)
    assert allowed("https://assets.test/screens/a.png", p)
    assert allowed("https://ASSETS.test:443/screens/a.png", p)
    for url in (
        "http://assets.test/screens/a.png",  # another scheme
        "https://assets.test:8443/screens/a.png",  # another port
        "https://assets.test.evil/screens/a.png",
        "https://assets.test@evil/screens/a.png",
        "https://assets.test/other/a.png",
        "file:///etc/passwd",
        "https://[::1/screens/",
    ):
        assert not allowed(url, p), url
    with pytest.raises(ValueError, match="image-url-allow"):
        check_prefix("assets.test/screens")


def test_serve_takes_repeated_prefixes():
    import argparse

    from turnstile.app.serve_options import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--engine-url", "http://x", "--model", "m"]
    assert p.parse_args(base).image_url_allow == []  # default: none
    a, b = "http://127.0.0.1:9/a/", "https://assets.test/s/"
    args = p.parse_args([*base, "--image-url-allow", a, "--image-url-allow", b])
    assert args.image_url_allow == [a, b] and args.image_url_timeout == 10.0
