"""Media on a prompt: images as data on the token path (issue 43).

An image is not a per-token array (:mod:`turnstile.token_arrays`): it is one item on the
prompt, its pixels stored once by content hash, its tokens a span of the prompt's IDs. The
record holds the prompt EXPANDED (each image's whole block of tokens, as the model's
processor writes it and the engine echoes it); an engine that expands placeholders itself
is sent the IDs collapsed back to one placeholder per image (:meth:`MediaPrompt.collapsed`)
with the images beside them, so an earlier turn's image is never expanded twice.

Declared once here: the formats taken (:data:`FORMATS`), the limits (:class:`Limits`), the
hash (sha256 of the bytes, also the engine's cache key: a uuid that is not the content's
hash lets an engine serve another image's features).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# MIME type -> Pillow's format name: what a data URL or base64 block may hold.
FORMATS: dict[str, str] = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
}
_BY_FORMAT = {v: k for k, v in FORMATS.items()}


class MediaError(ValueError):
    """An image Turnstile will not take, with the reason a harness can act on (a 400)."""


@dataclass(frozen=True)
class Limits:
    """What a request and a session may carry (serve options). ``allow_remote``: never by
    default; the policy under training must not make the gateway fetch addresses."""

    max_image_bytes: int = 10 << 20
    max_images_per_request: int = 16
    max_images_per_session: int = 256
    max_pixels: int = 40_000_000  # Pillow's own decompression-bomb bound is 89M
    # remote image URLs fetched only under these prefixes (serve --image-url-allow; none:
    # every remote URL refused), each fetch within this many seconds (media_fetch.py)
    url_allow: tuple[str, ...] = ()
    url_timeout: float = 10.0

    def check_request(self, n: int) -> None:
        if n > self.max_images_per_request:
            raise MediaError(
                f"{n} images in one request; this server takes at most "
                f"{self.max_images_per_request} (serve --max-images-per-request)"
            )

    def check_session(self, before: int, n: int) -> None:
        if before + n > self.max_images_per_session:
            raise MediaError(
                f"this request would bring the session to {before + n} distinct images (over all "
                f"its branches); this server "
                f"takes at most {self.max_images_per_session} per session "
                f"(serve --max-images-per-session)"
            )


DEFAULT_LIMITS = Limits()
_LIMITS = [DEFAULT_LIMITS]  # the process's (serve's options set it once, as PROMPTS)


def limits() -> Limits:
    """The limits this process enforces (serve --max-image-mb and the image counts)."""
    return _LIMITS[0]


def set_limits(value: Limits) -> None:
    _LIMITS[0] = value


@dataclass(frozen=True)
class Image:
    """An image as a request carried it: its bytes, their sha256 (hex) and the MIME type of
    what they are (sniffed by decoding, not the label's word), its size in pixels."""

    data: bytes = field(repr=False)
    sha256: str
    mime: str
    width: int
    height: int


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode(data: bytes, declared: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Image:
    """The image these bytes hold, decoded whole (a truncated or unknown file is refused
    here, not in the engine): a :class:`MediaError` for too many bytes, an unsupported
    format, a declared type other than a supported one, or bytes that do not decode."""
    if declared is not None and declared.lower() not in FORMATS:
        raise MediaError(
            f"unsupported image type {declared!r}; supported: {', '.join(sorted(FORMATS))}"
        )
    if len(data) > limits.max_image_bytes:
        raise MediaError(
            f"an image of {len(data)} bytes; this server takes at most "
            f"{limits.max_image_bytes} (serve --max-image-mb)"
        )
    if not data:
        raise MediaError("an empty image")
    try:
        from PIL import Image as PILImage
    except ImportError:  # pragma: no cover - Pillow is pinned with the package
        raise MediaError("this server cannot decode images (Pillow is not installed)") from None
    try:
        with PILImage.open(io.BytesIO(data), formats=list(FORMATS.values())) as img:
            fmt = img.format or ""
            width, height = img.size
            if width * height > limits.max_pixels:
                raise MediaError(
                    f"an image of {width}x{height} pixels; at most {limits.max_pixels}"
                )
            img.load()
    except MediaError:
        raise
    except Exception as exc:  # Pillow raises many kinds for bad bytes; all are the caller's
        raise MediaError(f"the image could not be decoded: {type(exc).__name__}") from None
    mime = _BY_FORMAT.get(fmt)
    if mime is None:
        raise MediaError(f"unsupported image format {fmt!r}")
    return Image(data, sha256_hex(data), mime, width, height)


def from_base64(text: str, declared: str | None, limits: Limits = DEFAULT_LIMITS) -> Image:
    """An image sent as base64 (an Anthropic ``image`` block, a data URL's payload)."""
    if not isinstance(text, str):
        raise MediaError("image data must be a base64 string")
    if len(text) > (limits.max_image_bytes * 4) // 3 + 4:
        raise MediaError(
            f"an image of about {len(text) * 3 // 4} bytes; this server takes at most "
            f"{limits.max_image_bytes} (serve --max-image-mb)"
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("image data is not valid base64") from None
    return decode(data, declared, limits)


def from_url(url: str, limits: Limits = DEFAULT_LIMITS) -> Image:
    """An image given by a ``data:<type>;base64,`` URL. Any other URL is refused here:
    fetching it would let the policy make this server reach arbitrary addresses (the
    dialects fetch one under ``limits.url_allow`` first: :mod:`turnstile.media_fetch`)."""
    if not isinstance(url, str):
        raise MediaError("image_url.url must be a string")
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0][:16] if ":" in url else "?"
        where = (
            "is not under this server's serve --image-url-allow prefixes"
            if limits.url_allow
            else f"is not fetched (scheme {scheme!r}; serve --image-url-allow may allow a prefix)"
        )
        raise MediaError(
            f"image URL {url[:120]!r} {where}; send the image inline as data:<type>;base64,..."
        )
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise MediaError("a data URL image must be base64: data:<type>;base64,<data>")
    return from_base64(payload, head[: -len(";base64")] or None, limits)


@dataclass(frozen=True)
class MediaItem:
    """One image of a recorded prompt: its content hash, MIME type, the span of its tokens
    in the EXPANDED prompt IDs (``offset``, ``length``: the whole block), and how it was
    expanded (the processor's name, version and arguments, and the grid it cut the image
    into)."""

    sha256: str
    mime: str
    offset: int
    length: int
    processor: dict[str, Any] = field(default_factory=dict)
    grid: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "mime": self.mime,
            "offset": self.offset,
            "length": self.length,
            "processor": self.processor,
            "grid": list(self.grid),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MediaItem:
        return cls(
            d["sha256"],
            d["mime"],
            int(d["offset"]),
            int(d["length"]),
            dict(d.get("processor") or {}),
            tuple(int(g) for g in d.get("grid") or ()),
        )

    def shifted(self, by: int) -> MediaItem:
        m = self
        return MediaItem(m.sha256, m.mime, m.offset + by, m.length, m.processor, m.grid)


def items_to_json(items: Iterable[MediaItem]) -> list[dict[str, Any]]:
    return [m.to_json() for m in items]


def items_from_json(raw: Sequence[dict[str, Any]] | None) -> tuple[MediaItem, ...]:
    return tuple(MediaItem.from_json(d) for d in raw or ())


def check_spans(items: Sequence[MediaItem], n_ids: int) -> None:
    """Spans sorted, disjoint, non-empty and inside the prompt: a broken one is a bug."""
    at = 0
    for m in items:
        if m.length <= 0 or m.offset < at or m.offset + m.length > n_ids:
            raise ValueError(f"media span {m.offset}+{m.length} out of order or out of range")
        at = m.offset + m.length


# Which engines take images on the token path, as data: None = taken; else why not (the
# harness's 400 names the engine and the reason).
ENGINE_IMAGES: dict[str, str | None] = {
    "vllm": None,  # /inference/v1/generate: one placeholder per image + content_parts
    "sglang": None,  # /generate: input_ids with one placeholder per image + image_data
    "llama-cpp": (
        "llama.cpp takes images only with a text prompt holding <__media__> markers "
        "(--mmproj), never with token IDs"
    ),
}


def images_refused(engine: str) -> str | None:
    """Why ``engine`` cannot be sent images (None: it can)."""
    why = ENGINE_IMAGES.get(engine, f"the {engine} engine adapter takes no images")
    return None if why is None else f"images are not supported with the {engine} engine: {why}"


@dataclass
class MediaPrompt(Sequence[int]):
    """An engine prompt that carries images: ``ids`` EXPANDED (what the record holds and
    the model runs on), ``media`` the images' spans in them, ``images`` their bytes by hash
    (only those this call's engine request needs; recorded ones live in the blob store)."""

    ids: array
    media: tuple[MediaItem, ...]
    images: dict[str, Image] = field(default_factory=dict)
    placeholder: int = -1  # the model's one-per-image placeholder ID (its processor's)

    def __post_init__(self) -> None:
        check_spans(self.media, len(self.ids))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def collapsed(self, placeholder: int | None = None) -> array:
        """The IDs with each image's block replaced by one ``placeholder``: what an engine
        that expands placeholders itself must be sent (vLLM expands every placeholder it
        sees, and would expand an already expanded block again)."""
        ph = self.placeholder if placeholder is None else placeholder
        out = array("i")
        at = 0
        for m in self.media:
            out.extend(self.ids[at : m.offset])
            out.append(ph)
            at = m.offset + m.length
        out.extend(self.ids[at:])
        return out


def join(prefix: array | MediaPrompt, delta: array | MediaPrompt) -> array | MediaPrompt:
    """A reused prefix's IDs followed by a delta's, with both sides' images (the delta's
    spans shifted): the prefix's images stay as recorded, expanded once. Text on both
    sides stays a plain array (text-only calls do not change)."""
    if not isinstance(prefix, MediaPrompt) and not isinstance(delta, MediaPrompt):
        out = array("i", prefix)
        out.extend(delta)
        return out
    head = prefix.ids if isinstance(prefix, MediaPrompt) else prefix
    tail = delta.ids if isinstance(delta, MediaPrompt) else delta
    ids = array("i", head)
    ids.extend(tail)
    shift = len(head)
    items = (*media_of(prefix), *(m.shifted(shift) for m in media_of(delta)))
    images = {**_images(prefix), **_images(delta)}
    ph = max(p.placeholder for p in (prefix, delta) if isinstance(p, MediaPrompt))
    return MediaPrompt(ids, items, images, ph)


def new_images(prompt: MediaPrompt, start: int) -> dict[str, Image]:
    """The bytes of the images whose blocks begin at or after ``start`` (a call's delta:
    the images it brings; a reused prefix's are recorded already)."""
    return {m.sha256: prompt.images[m.sha256] for m in prompt.media if m.offset >= start}


def _images(p: object) -> dict[str, Image]:
    return p.images if isinstance(p, MediaPrompt) else {}


def media_of(prompt: object) -> tuple[MediaItem, ...]:
    """The images a prompt carries (none for a plain array of IDs)."""
    return prompt.media if isinstance(prompt, MediaPrompt) else ()
