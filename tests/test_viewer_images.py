"""The viewer shows each image of a trajectory at its block in the token view, in a real
headless Chromium (``testbed.headless_chromium``) against ``turnstile view`` as a process on a
store written here: the ``<img>`` sits in the token stream right before the token at the
block's offset, the block's tokens are marked, and the picture is the stored bytes (its
``data:`` URL decoded here and hashed, its pixels decoded by the browser), read through the
session's image route only."""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image as PILImage
from selenium.webdriver.support.ui import WebDriverWait

import turnstile_testbed as testbed
from turnstile import media
from turnstile.store.records import CallRecord
from turnstile.store.store import Store

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(180)]


def png(color: tuple[int, int, int], size: tuple[int, int]) -> media.Image:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, "PNG")
    return media.decode(out.getvalue())


def record(sid: str, images: list[media.Image], spans: list[tuple[int, int]]) -> CallRecord:
    items = tuple(
        media.MediaItem(i.sha256, i.mime, off, n, {"name": "P"}, (1, 3, 32, 32))
        for i, (off, n) in zip(images, spans, strict=True)
    )
    end = max(off + n for off, n in spans) + 4
    return CallRecord(
        id=f"c_{sid}",
        session_id=sid,
        seq=0,
        parent_id=None,
        segment_reason="first_call",
        reused_prefix_len=0,
        prompt_delta=array("i", range(100, 100 + end)),
        completion_ids=array("i", [5, 6, 7]),
        completion_logprobs=array("f", [-0.5, -0.25, -0.125]),
        finish_reason="stop",
        stop_token_id=None,
        seam=None,
        status="ok",
        media=items,
        images={i.sha256: i for i in images},
    )


@pytest.fixture(scope="module")
def browser() -> Iterator:
    driver = testbed.headless_chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def viewer(tmp_path_factory) -> Iterator[tuple[str, dict[str, media.Image]]]:
    tmp: Path = tmp_path_factory.mktemp("view")
    red, blue, green = png((255, 0, 0), (6, 4)), png((0, 0, 255), (5, 7)), png((0, 200, 0), (3, 3))
    store = Store(tmp / "data")
    store.create_session(session_id="a")
    store.add_call(record("a", [red, blue], [(3, 11), (17, 11)]))
    store.create_session(session_id="b")  # another session's image: not readable through "a"
    store.add_call(record("b", [green], [(2, 7)]))
    store.close()
    port = testbed.free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp / "view.log").open("wb")
    cmd = [sys.executable, "-m", "turnstile", "view", "--data", str(tmp / "data")]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--no-auth"], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        testbed.wait_healthy(base + "/v1/viewer/sessions", proc, timeout=60)
        yield base, {"red": red, "blue": blue, "green": green}
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


_PLACED = """
return [...document.querySelectorAll('#tokens img.image-mark')].map((img) => {
  let prev = img.previousElementSibling, next = img.nextElementSibling;
  while (prev && !prev.classList.contains('tok')) prev = prev.previousElementSibling;
  while (next && !next.classList.contains('tok')) next = next.nextElementSibling;
  return {sha: img.dataset.sha256, src: img.getAttribute('src') || '',
          w: img.naturalWidth, h: img.naturalHeight, complete: img.complete,
          prev: prev ? +prev.dataset.i : null, next: next ? +next.dataset.i : null};
});"""


def test_each_image_renders_at_its_block_and_is_the_stored_bytes(viewer, browser):
    base, imgs = viewer
    traj = httpx.get(base + "/v1/sessions/a/trajectories", timeout=30).json()["data"][0]
    spans = {im["sha256"]: (im["offset"], im["length"]) for im in traj["images"]}
    assert spans == {imgs["red"].sha256: (3, 11), imgs["blue"].sha256: (17, 11)}

    browser.get(f"{base}/ui#/session/a")

    def loaded(b):
        got = b.execute_script(_PLACED)
        return got if len(got) == 2 and all(g["complete"] and g["w"] for g in got) else None

    placed = WebDriverWait(browser, 30, poll_frequency=0.05).until(loaded)
    for g in placed:
        off, n = spans[g["sha"]]
        # in the token stream right where the block starts: after token off-1, before token off
        assert (g["prev"], g["next"]) == (off - 1, off), g
        want = next(i for i in imgs.values() if i.sha256 == g["sha"])
        head, _, data = g["src"].partition(",")
        assert head == f"data:{want.mime};base64"
        assert hashlib.sha256(base64.b64decode(data)).hexdigest() == want.sha256
        src = PILImage.open(io.BytesIO(want.data))
        assert (g["w"], g["h"]) == src.size  # the browser decoded these bytes
    # the block's tokens are marked, and only they
    marked = browser.execute_script(
        "return [...document.querySelectorAll('#tokens .tok.img')].map(e => +e.dataset.i)"
    )
    assert marked == [*range(3, 14), *range(17, 28)]


def test_the_image_route_is_scoped_to_the_session(viewer):
    base, imgs = viewer
    ok = httpx.get(f"{base}/v1/sessions/b/images/{imgs['green'].sha256}", timeout=30)
    assert ok.status_code == 200 and ok.content == imgs["green"].data
    r = httpx.get(f"{base}/v1/sessions/a/images/{imgs['green'].sha256}", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "image_not_found"
