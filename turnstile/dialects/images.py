"""Image parts of every dialect → media items of the one internal request (issue 43).

Each dialect's image (Chat ``image_url`` with a data URL, Anthropic ``image`` with a base64
source, also inside a ``tool_result``) becomes one canonical part, ``{"type": "image",
"sha256": <hex>}``, in a new message object (the parsed history is shared across calls and
never changed in place), and its decoded bytes go to ``ChatRequest.images`` by hash. The
part is what the chat template sees (it renders the family's placeholder) and what the
history's hash chain reads: the same image re-sent on the next turn is the same part.

A history is resent on every call: images already decoded are kept by the hash of their
base64 text (:data:`_SEEN`), so an old screenshot is not decoded again on every turn.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import xxhash

from ..errors import APIError
from ..media import Image, Limits, MediaError, from_base64, from_url, limits
from ..media_fetch import allowed, fetch, on_event_loop, prefetch, prefetched

IMAGE = "image"  # the canonical part's type

_SEEN: OrderedDict[tuple[int, int], Image] = OrderedDict()
_SEEN_MAX = 512
_LOCK = threading.Lock()


def _key(text: str) -> tuple[int, int]:
    return (len(text), xxhash.xxh3_64_intdigest(text.encode()))


def cached_image(text: str) -> Image | None:
    """The image already decoded from this URL or base64 text (None: not at hand)."""
    with _LOCK:
        return _SEEN.get(_key(text))


async def fetch_images(body: object) -> dict[str, Image | MediaError]:
    """The allowed remote image URLs of a request body, fetched before it is parsed, off
    the event loop's critical path (:func:`turnstile.media_fetch.prefetch`); the server
    parses under ``media_fetch.using(...)`` of what this answers. Nothing (no await of
    substance) without ``--image-url-allow``."""
    bounds = limits()
    if not bounds.url_allow:
        return {}
    return await prefetch(body, bounds, cached_image)


def _cached(text: str, decode: Callable[[], Image]) -> Image:
    key = _key(text)
    with _LOCK:
        got = _SEEN.get(key)
        if got is not None:
            _SEEN.move_to_end(key)
            return got
    image = decode()
    with _LOCK:
        _SEEN[key] = image
        while len(_SEEN) > _SEEN_MAX:
            _SEEN.popitem(last=False)
    return image


def bad_image(param: str, exc: MediaError) -> APIError:
    return APIError(400, str(exc), param, code="invalid_image")


class Taker:
    """Collects a request's images, in order, within the limits."""

    def __init__(self, bounds: Limits | None = None) -> None:
        self.limits = bounds or limits()
        self.images: dict[str, Image] = {}
        self.count = 0

    def take(self, param: str, decode: Callable[[], Image], text: str) -> dict:
        self.count += 1
        try:
            self.limits.check_request(self.count)
            image = _cached(text, decode)
        except MediaError as exc:
            raise bad_image(param, exc) from None
        self.images.setdefault(image.sha256, image)
        return {"type": IMAGE, "sha256": image.sha256}

    def chat_url(self, param: str, url: object) -> dict:
        if not isinstance(url, str):
            raise APIError(400, "image_url.url must be a string.", param, code="invalid_image")
        if not url.startswith("data:"):
            # checked before the cache: a URL fetched under an allow-list is never served
            # from it once the URL is no longer allowed
            if not allowed(url, self.limits.url_allow):
                try:
                    from_url(url, self.limits)  # refuses it, saying why
                except MediaError as exc:
                    raise bad_image(param, exc) from None
            # fetched once while cached: a resent history's URL is the same image; the
            # server fetched it before parsing (fetch_images), off its event loop
            return self.take(param, lambda: self._remote(url), url)
        return self.take(param, lambda: from_url(url, self.limits), url)

    def _remote(self, url: str) -> Image:
        got = prefetched(url)
        if isinstance(got, MediaError):
            raise got
        if got is not None:
            return got
        if on_event_loop():  # never fetched where every other call waits: a bug, said so
            raise APIError(
                500, f"the image URL {url[:120]!r} was not fetched before parsing", None,
                type_="server_error",
            )  # fmt: skip
        return fetch(url, self.limits)  # no event loop (a script parsing a body)

    def base64(self, param: str, data: object, mime: object) -> dict:
        if not isinstance(data, str) or not isinstance(mime, str):
            raise APIError(
                400, "an image source needs media_type and data strings.", param,
                code="invalid_image",
            )  # fmt: skip
        return self.take(param, lambda: from_base64(data, mime, self.limits), data)


def _has_image_part(content: object, kinds: tuple[str, ...]) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in kinds for p in content
    )


def chat_images(
    messages: list[dict], bounds: Limits | None = None
) -> tuple[list[dict], dict[str, Image]]:
    """Chat Completions messages with each ``image_url`` part as a canonical part; the
    images by hash. Text-only messages come back as the same objects."""
    if not any(_has_image_part(m.get("content"), ("image_url",)) for m in messages):
        return messages, {}
    taker = Taker(bounds)
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not _has_image_part(content, ("image_url",)):
            out.append(m)
            continue
        parts = []
        assert isinstance(content, list)
        for j, p in enumerate(content):
            if p.get("type") == "image_url":
                where = f"messages[{i}].content[{j}].image_url"
                iu = p.get("image_url")
                url = iu.get("url") if isinstance(iu, dict) else iu
                parts.append(taker.chat_url(where, url))
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, taker.images


# ---- a chain's images by reference (Responses ``previous_response_id``) -------------------

IMAGE_REF = "image_ref"  # a kept message's image: {"type": IMAGE_REF, "sha256", "mime"}


def _image_url(part: object) -> str | None:
    if isinstance(part, dict) and part.get("type") == "image_url":
        iu = part.get("image_url")
        url = iu.get("url") if isinstance(iu, dict) else iu
        return url if isinstance(url, str) else None
    return None


def by_reference(messages: list[dict]) -> list[dict]:
    """``messages`` (already parsed: their images decoded) with each image part as a
    reference to its bytes in the content-addressed blob store, the store a call's record
    keeps for a later ``previous_response_id``: the record holds no base64. A remote URL
    whose image is not at hand stays a URL."""
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list) or not any(_image_url(p) for p in content):
            out.append(m)
            continue
        parts = []
        for p in content:
            url = _image_url(p)
            image = cached_image(url) if url else None
            if image is None and url:  # fetched for this very request, off the loop
                got = prefetched(url)
                image = got if isinstance(got, Image) else None
            if image is None and url and url.startswith("data:"):
                image = from_url(url, limits())  # taken by this very request: decodes
            parts.append(
                {"type": IMAGE_REF, "sha256": image.sha256, "mime": image.mime}
                if image is not None
                else p
            )
        out.append({**m, "content": parts})
    return out


def by_value(messages: list[dict], read: Callable[[str], Image | None]) -> list[dict]:
    """Kept messages with each image reference as the ``image_url`` part it was (a data URL
    of the bytes ``read`` gives by hash: the session's blob store)."""
    import base64

    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == IMAGE_REF for p in content
        ):
            out.append(m)
            continue
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == IMAGE_REF:
                image = read(str(p.get("sha256")))
                if image is None:
                    raise APIError(
                        400,
                        f"an image of that response ({str(p.get('sha256'))[:16]}) is no longer "
                        "stored",
                        "previous_response_id",
                        code="previous_response_not_found",
                    )
                data = base64.b64encode(image.data).decode()
                mime = image.mime or p.get("mime")
                p = {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
            parts.append(p)
        out.append({**m, "content": parts})
    return out
